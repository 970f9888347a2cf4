"""Which of two speakers is a bot, read where a dialogue file does not say (bench/speakers.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from chatmem.bench import booking_dialogues, incar_dialogues
from chatmem.bench.speakers import (
    CHANGE,
    INPUTS,
    MIN_TURNS,
    SpeakerModel,
    _viterbi,
    at_closings,
    at_new_requests,
    shipped_speakers,
    turn_style,
)
from chatmem.bench.topicseg import Dialogue, load, names_follow_positions
from chatmem.bench.train_segmenter import is_tune, write_defdts
from chatmem.bench.train_speakers import BAR_STEP, WINDOWS, fit, run, shipped_weights_path
from tests.unit.test_segmentation import write_tiny_data

# Two people getting to know each other, as in chit-chat corpora: both ask, both tell of themselves.
CHATS = [
    [
        "hi there! how are you doing today?",
        "i am great, just got back from a long hike with my dog. you?",
        "nice! i love hiking too, but i mostly stay home and paint.",
        "what do you like to paint?",
        "mostly landscapes. my grandmother taught me when i was little.",
        "that is so sweet. i wish i could draw, i am terrible at it!",
        "i bet you are better than you think. what do you do for work?",
        "i teach math at a high school. the kids keep me busy.",
        "oh wow, i was never good at math. do you enjoy it?",
        "i do! i also coach the chess club on fridays.",
    ],
    [
        "hey, do you have any pets?",
        "yes, two cats. they are named salt and pepper. do you?",
        "no, i am allergic, sadly. i have a fish tank though.",
        "fish are cool! my brother has a big aquarium.",
        "i spend hours watching mine. it helps me relax after work.",
        "what kind of work do you do?",
        "i am a nurse at the local hospital. long shifts!",
        "that must be tiring. i work from home, writing code.",
        "do you like working from home?",
        "i do, but i miss talking to people sometimes.",
    ],
]


def _tiage_file(path: Path, dialogues: list[Dialogue]) -> Path:
    """Dialogues in TIAGE's format: no speakers, a "1" at the first turn of each new topic."""
    data = {}
    for d in dialogues:
        starts = [False] + [bool(e) for e in d.ends_segment[:-1]]
        labels = ["-1"] + ["1" if s else "0" for s in starts[1:]]
        data[d.id] = [[t, label] for t, label in zip(d.texts, labels, strict=True)]
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_booking_conversation_without_speakers_is_read_with_its_agent_as_the_assistant(tmp_path: Path):
    booking = booking_dialogues.dialogues()[:40]
    incar = incar_dialogues.dialogues()[:40]
    for written in (booking, incar):
        read = load(_tiage_file(tmp_path / "tasks.json", written))
        assert [d.texts for d in read] == [d.texts for d in written]
        # The templates alternate user and agent, so the agent's side is the assistant's turns.
        right = sum(r.roles == w.roles for r, w in zip(read, written, strict=True))
        assert right >= 0.9 * len(written)
        turns = [a == b for r, w in zip(read, written, strict=True) for a, b in zip(r.roles, w.roles, strict=True)]
        assert sum(turns) >= 0.95 * len(turns)
        # As written, nobody is a bot: two people chatting.
        assert all(set(d.roles) == {"user"} for d in load(tmp_path / "tasks.json", speakers=None))


def _ended_on_the_user(d: Dialogue) -> Dialogue:
    """`d` with its agent's last turn of every other conversation dropped: from there on, the
    positions of a file without speakers change places."""
    roles, texts, ends = [], [], []
    bounds = [0] + [i + 1 for i, e in enumerate(d.ends_segment) if e] + [len(d.texts)]
    for k, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if k % 2 == 0 and end < len(d.texts) and end - start >= 3 and d.roles[end - 1] == "assistant":
            end -= 1
        roles += d.roles[start:end]
        texts += d.texts[start:end]
        ends += [0] * (end - start - 1) + [1]
    ends[-1] = 0
    return Dialogue(d.id, roles, texts, ends)


def test_positions_that_change_speakers_after_a_conversation_ended_on_the_user_are_still_read(tmp_path: Path):
    written = [_ended_on_the_user(d) for d in booking_dialogues.dialogues()[:40]]
    assert sum(any(a == b for a, b in zip(d.roles, d.roles[1:], strict=False)) for d in written) >= 30  # they do change
    model = shipped_speakers()
    assert model.window > 0

    def right(m: SpeakerModel) -> float:
        read = [m.roles_by_position(d.texts) for d in written]
        turns = [a == b for r, d in zip(read, written, strict=True) for a, b in zip(r, d.roles, strict=True)]
        return sum(turns) / len(turns)

    by_turn, whole = right(model), right(replace(model, window=0))
    assert by_turn >= 0.93 and by_turn > whole + 0.1
    read = load(_tiage_file(tmp_path / "changed.json", written))
    assert [d.roles for d in read] == model.file_roles_by_position([d.texts for d in written])


# A task done, ended on the user's closing.
TAXI_BOOKED = [
    "I need a taxi to the station.",
    "When would you like to leave?",
    "At 5 pm.",
    "Booked. Your reference is AB12.",
    "Great, thanks. That's all.",
]


def test_a_change_of_places_moves_to_where_the_user_closed_a_task_and_spoke_again():
    texts = [
        *TAXI_BOOKED,
        "I also need a hotel in the north.",  # the user again: the positions change places here
        "What price range would you like?",
        "Cheap, please.",
        "The Alpha is cheap. Shall I book it?",
        "Yes, please.",
    ]
    truth = np.array([False, True, False, True, False, False, True, False, True, False])
    late = np.array([False, True, False, True, False, True, False, False, True, False])  # found 2 turns late
    assert at_closings(texts, late, 4).tolist() == truth.tolist()
    assert at_closings(texts, late, 1).tolist() == late.tolist()  # no closing within reach: as read
    alternating = np.arange(len(texts)) % 2 == 1
    assert at_closings(texts, alternating, 4).tolist() == alternating.tolist()  # no change to move
    # A closing answered by a closing reply ("You're welcome!") is no change of places.
    replied = [*texts[:5], "You're welcome! Anything else?", *texts[6:]]
    assert at_closings(replied, late, 4).tolist() == late.tolist()


def test_a_request_after_a_user_s_closing_read_as_the_bot_s_changes_places_until_the_next_change():
    texts = [
        *TAXI_BOOKED,
        "Where is the nearest museum?",  # the user again
        "The Fitzwilliam is on Trumpington Street.",
        "Perfect, thank you.",
        "I need a hotel in the north.",  # and again, three turns on: two changes in one window
        "What price range would you like?",
        "Cheap, please.",
        "The Alpha is cheap.",
    ]
    truth = np.array([False, True, False, True, False, False, True, False, False, True, False, True])
    alternating = np.arange(len(texts)) % 2 == 1  # the reading found no change
    assert at_new_requests(texts, alternating).tolist() == truth.tolist()
    assert at_new_requests(texts, truth).tolist() == truth.tolist()  # read right: nothing to change
    # After a closing, a turn that offers something is the bot's, even when it asks; and a
    # statement is no request. Either way the reading stands.
    for turn in ("How can I help you further?", "Your taxi is a red Skoda."):
        assert at_new_requests([*texts[:5], turn, *texts[6:]], alternating).tolist() == alternating.tolist()


def test_a_file_of_bots_conversations_reads_a_bot_in_a_dialogue_under_the_bar(tmp_path: Path):
    model = shipped_speakers()
    tasks = booking_dialogues.dialogues()[:40]
    reads = [model.position_reading(d.texts) for d in tasks]
    assert model.of_bots([r[1] for r in reads if r is not None])  # most task dialogues read as a bot's
    # A bar no dialogue passes: alone, none is read with a bot; as one file of mostly bots' conversations, all are.
    strict = replace(model, bar=max(r[1] for r in reads if r is not None))
    assert all(set(roles) == {"user"} for roles in (strict.roles_by_position(d.texts) for d in tasks))
    assert not strict.of_bots([r[1] for r in reads if r is not None])
    lower = replace(model, bar=float(np.quantile([r[1] for r in reads if r is not None], 0.4)))  # 60% pass
    assert lower.of_bots([r[1] for r in reads if r is not None])
    by_file = lower.file_roles_by_position([d.texts for d in tasks])
    alone = [lower.roles_by_position(d.texts) for d in tasks]
    assert all("assistant" in roles for roles in by_file)
    assert sum("assistant" not in roles for roles in alone) >= len(tasks) // 3
    assert [roles for roles, a in zip(by_file, alone, strict=True) if "assistant" in a] == [
        a for a in alone if "assistant" in a
    ]  # a dialogue over the bar reads the same either way
    # The same for two speakers named by name ("A", "B"), whom the file never calls a bot.
    sides = [{"A": d.texts[0::2], "B": d.texts[1::2]} for d in tasks]
    assert all(bot == "B" for bot in lower.bots_of(sides))
    assert all(bot is None for bot in strict.bots_of(sides[:1]))  # one dialogue under the bar is its own file
    # People's files stay people's: not one dialogue passes the bar.
    chats = [Dialogue(f"chat-{i}", ["user"] * len(t), t, [0] * len(t)) for i, t in enumerate(CHATS)]
    assert all(set(d.roles) == {"user"} for d in load(_tiage_file(tmp_path / "chats.json", chats)))


def test_the_reading_changes_places_only_where_the_turns_say_so_firmly():
    lean = np.array([3.0, 2.5, -0.4, 3.1, 2.8, 2.9, -3.0, -2.7, -3.3, -2.9, -3.1])
    path = _viterbi(lean, CHANGE)
    assert path.tolist() == [True] * 6 + [False] * 5  # one weak dissent is outvoted; a run of firm ones is not
    assert _viterbi(np.full(7, -0.1), CHANGE).tolist() == [False] * 7


def test_people_chatting_stay_people(tmp_path: Path):
    chats = [Dialogue(f"chat-{i}", ["user"] * len(t), t, [0] * len(t)) for i, t in enumerate(CHATS)]
    read = load(_tiage_file(tmp_path / "chats.json", chats))
    assert all(set(d.roles) == {"user"} for d in read)
    model = shipped_speakers()
    for t in CHATS:
        assert max(model.probability(t[0::2], t[1::2]), model.probability(t[1::2], t[0::2])) < model.bar


def test_a_defdts_file_of_two_unnamed_speakers_reads_its_bot_by_name_not_by_turn(tmp_path: Path):
    written = booking_dialogues.dialogues()[:10]
    # The agent answers twice in a row somewhere: its turns are found by its name, not by position.
    d0 = written[0]
    extra = d0.roles.index("assistant")
    d0 = Dialogue(
        d0.id,
        d0.roles[: extra + 1] + ["assistant"] + d0.roles[extra + 1 :],
        d0.texts[: extra + 1] + ["Let me check that for you."] + d0.texts[extra + 1 :],
        d0.ends_segment[: extra + 1] + [0] + d0.ends_segment[extra + 1 :],
    )
    written = [d0, *written[1:]]
    path = tmp_path / "ab.jsonl"
    write_defdts(path, written)
    path.write_text(
        path.read_text(encoding="utf-8").replace('"user: ', '"A: ').replace("[NEWLINE]user: ", "[NEWLINE]A: ")
    )
    path.write_text(
        path.read_text(encoding="utf-8").replace('"agent: ', '"B: ').replace("[NEWLINE]agent: ", "[NEWLINE]B: ")
    )
    read = load(path)
    assert sum(r.roles == w.roles for r, w in zip(read, written, strict=True)) >= 9
    assert read[0].roles == d0.roles


def test_a_named_bot_three_speakers_or_short_sides_are_left_as_written(tmp_path: Path):
    turns = [line for d in booking_dialogues.dialogues()[:1] for line in d.texts]
    speakers = ["A", "B", "C"]
    lines = {
        "named": [f"{'user' if i % 2 == 0 else 'agent'}: {t}" for i, t in enumerate(turns)],
        "three": [f"{speakers[i % 3]}: {t}" for i, t in enumerate(turns)],
        "short": [f"{'A' if i % 2 == 0 else 'B'}: {t}" for i, t in enumerate(turns[: 2 * MIN_TURNS - 2])],
    }
    path = tmp_path / "as_written.jsonl"
    path.write_text("".join(json.dumps({"id": k, "dialogue": "[NEWLINE]".join(v)}) + "\n" for k, v in lines.items()))
    named, three, short = load(path)
    assert named.roles == ["user", "assistant"] * (len(turns) // 2) + ["user"] * (len(turns) % 2)
    assert set(three.roles) == {"user"} and set(short.roles) == {"user"}


def _named_by_position(path: Path, dialogues: list[Dialogue]) -> Path:
    """Dialogues in Def-DTS's format with "user" and "agent" given by position, as a copy of a
    corpus that never recorded who spoke names them."""
    positional = [Dialogue(d.id, ["user", "assistant"] * len(d.texts), d.texts, d.ends_segment) for d in dialogues]
    write_defdts(path, [replace(d, roles=d.roles[: len(d.texts)]) for d in positional])
    return path


def test_names_that_only_follow_the_positions_are_read_as_positions(tmp_path: Path):
    chats = [Dialogue(f"chat-{i}", ["user"] * len(t), t, [0] * len(t)) for i, t in enumerate(CHATS)]
    # People named "user" and "agent" by position: read as people, as in TIAGE's own format.
    assert all(set(d.roles) == {"user"} for d in load(_named_by_position(tmp_path / "chats.jsonl", chats)))
    assert all("assistant" in d.roles for d in load(tmp_path / "chats.jsonl", speakers=None))  # as written
    # Joined task conversations, some ended on the user: past such an end the names are wrong.
    written = [_ended_on_the_user(d) for d in booking_dialogues.dialogues()[:40]]
    read = load(_named_by_position(tmp_path / "tasks.jsonl", written))
    model = shipped_speakers()
    assert [d.roles for d in read] == model.file_roles_by_position([d.texts for d in written])

    def right(dialogues: list[Dialogue]) -> float:
        turns = [a == b for r, w in zip(dialogues, written, strict=True) for a, b in zip(r.roles, w.roles, strict=True)]
        return sum(turns) / len(turns)

    assert right(read) > right(load(tmp_path / "tasks.jsonl", speakers=None)) + 0.1
    # The same conversations with their real speakers (the user speaks twice in a row): as written.
    write_defdts(tmp_path / "recorded.jsonl", written)
    assert [d.roles for d in load(tmp_path / "recorded.jsonl")] == [d.roles for d in written]


def test_names_follow_positions_only_when_every_dialogue_takes_strict_turns_between_two_names():
    assert names_follow_positions([["user", "agent", "user"], ["a", "b"], ["user"]])
    assert not names_follow_positions([["user", "agent", "user"], ["user", "user", "agent"]])  # said twice in a row
    assert not names_follow_positions([["a", "b", "c", "a"]])  # three speakers
    assert not names_follow_positions([["user", "", "user"]])  # a line with no speaker
    assert not names_follow_positions([["user"], ["user"]])  # one speaker: nothing to read


def test_the_trainer_sets_its_bar_above_every_people_dialogue_and_refits_the_same_bytes(tmp_path: Path):
    tiage, superseg = write_tiny_data(tmp_path / "data")
    out = tmp_path / "speakers.json"
    model = run(tmp_path / "data", out, lambda _: None)
    training_part = [d for d in superseg if not is_tune(d.id)]
    again, _ = fit(load(tmp_path / "data" / "anno_train.json", speakers=None), training_part)
    assert SpeakerModel.from_json(json.loads(out.read_text(encoding="utf-8"))).bar == model.bar
    assert np.array_equal(again.weights, model.weights) and again.bar == model.bar
    for d in tiage:
        read = model.position_reading(d.texts)
        assert read is None or read[1] <= model.bar
    summary = json.loads(out.read_text(encoding="utf-8"))["summary"]
    assert summary["dialogues"]["people"] == len(tiage)
    # The window chosen is the smallest whose bar is no higher than reading each dialogue whole.
    bars = {int(w): math.ceil(h / BAR_STEP) * BAR_STEP for w, h in summary["people_highest"].items()}
    assert model.window == next((w for w in WINDOWS if bars[w] <= bars[0]), 0)


def test_the_shipped_weights_match_the_inputs_and_a_mismatch_is_refused():
    data = json.loads(shipped_weights_path().read_text(encoding="utf-8"))
    assert data["inputs"] == list(INPUTS) and len(data["weights"]) == len(INPUTS) + 1
    assert 0.5 <= data["bar"] < 1 and data["summary"]["people_highest"][str(data["window"])] <= data["bar"]
    with pytest.raises(ValueError, match="retrain"):
        SpeakerModel.from_json({**data, "inputs": data["inputs"][:-1]})


def test_the_bench_reads_a_task_file_without_speakers_as_a_bot_s_unless_asked_to_read_it_as_written(tmp_path: Path):
    from chatmem.bench.topicseg import run
    from chatmem.memory.boundary_scorer import shipped_scorer
    from tests.fakes import FakeEmbedder

    data = _tiage_file(tmp_path / "tasks.json", booking_dialogues.dialogues()[:6])
    read = run(data, None, FakeEmbedder(), baseline=False, learned=shipped_scorer())
    written = run(data, None, FakeEmbedder(), baseline=False, learned=shipped_scorer(), as_written=True)
    # Read as people, every agent turn is a candidate boundary: other decisions on the same turns.
    assert len(read["learned"].dialogues) == len(written["learned"].dialogues) == 6
    assert read["learned"] != written["learned"]


def test_a_tokenised_turn_has_the_style_of_the_turn_as_written():
    written = ["You're welcome. I've booked it, anything else?", "I'd like a cab, please. I don't mind when."]
    tokenised = [
        "you 're welcome . i 've booked it , anything else ?",
        "i 'd like a cab , please . i do n't mind when .",
    ]
    a, b = turn_style(written), turn_style(tokenised)
    assert np.array_equal(a[:, :-1], b[:, :-1]) and a[:, :-1].any()
