"""The segmenter's LLM assist over fakes: a model's opinion decides only the decisions the scorer
is unsure of, at the moment the segmenter decides anyway; no answer (or the assist off) leaves
the offline segmenter exactly as it was."""

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from chatmem.memory.boundary_llm import Cooldown, KeepingLease, LLMBoundaryAssist
from chatmem.memory.boundary_pair import TEXT_CHARS
from chatmem.memory.boundary_scorer import Bar, TurnInfo, stage_of
from chatmem.memory.episodes import SummaryPolicy, plan_batch
from chatmem.memory.ports import LLMRefused, TransientError
from chatmem.memory.prompts import TopicShift, TurnIntent
from chatmem.memory.replay import replay_thread
from chatmem.memory.segmentation import (
    Boundary,
    SegmenterConfig,
    SegmenterState,
    SegTurn,
    feed,
    segment,
)
from tests.fakes import FakeLLM, MemoryRig
from tests.unit.test_planner import fresh, logged
from tests.unit.test_planner import say as planner_say
from tests.unit.test_segmentation import CFG, T0, chat, topic


class ScriptedScorer:
    """P(topic continues) by (candidate seq, stage); 0.95 (sure: no shift) for anything else."""

    threshold = 0.75
    early_margin = 0.2

    def bar(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> Bar:
        return Bar(self.threshold, self.early_margin)

    def __init__(self, p_continues: dict[tuple[int, str], float] | None = None):
        self.p_continues = p_continues or {}

    def boundary_probability(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> float:
        return 1.0 - self.p_continues.get((window[0].seq, stage_of(window)), 0.95)


class Assist:
    """The assist port: answers `answer(before, window)`, records what it was asked."""

    def __init__(self, answer=lambda before, window: None, band: float = 0.1):
        self.answer = answer
        self.band = band
        self.asked: list[tuple[list[int], list[int], list[str | None]]] = []

    def new_topic(self, before, window, p_continues):
        self.asked.append(([t.seq for t in before], [t.seq for t in window], [t.text for t in window]))
        return self.answer(before, window)


def dialogue(n: int = 7) -> list[SegTurn]:
    """user, assistant, user, ...: seqs 0..n-1, user turns at even seqs (one topic; the scorer is scripted)."""
    return [
        SegTurn(i, "user" if i % 2 == 0 else "assistant", f"turn {i} text", T0 + timedelta(minutes=i), topic(0))
        for i in range(n)
    ]


def decided(turns, scorer, assist=None, cfg=CFG):
    """Each boundary with the seq of the message that decided it."""
    state, out = SegmenterState(), []
    for t in turns:
        state, bounds = feed(state, t, cfg, scorer, assist)
        out += [(b, t.seq) for b in bounds]
    return out


def test_where_the_closed_thread_bar_applies_the_assist_is_asked_around_it():
    # seq 2 ends a task with a thanks, 4 opens the next one; follow-up 6 then faces min(0.75, bar)
    bar = SegmenterConfig().closed_thread_bar
    assert bar is not None and bar + 0.05 < 0.65
    turns = [replace(t, text="Thanks, that's all.") if t.seq == 2 else t for t in dialogue(9)]
    scorer = ScriptedScorer({(4, "open"): 0.3, (6, "closed"): bar + 0.05})
    assist = Assist(answer=lambda before, window: False)
    assert decided(turns, scorer, assist) == [(Boundary(4, "shift"), 4)]
    assert [w for _, w, _ in assist.asked] == [[6, 7, 8]]  # within 0.1 of the bar: asked, rejected
    # off, it lies below 0.75 by more than the band: a shift without a question
    plain = Assist(answer=lambda before, window: False)
    off = SegmenterConfig(closed_thread_bar=None)
    assert decided(turns, scorer, plain, off) == [(Boundary(4, "shift"), 4), (Boundary(6, "shift"), 8)]
    assert plain.asked == []


def test_an_unsure_shift_the_model_rejects_is_no_boundary():
    scorer = ScriptedScorer({(2, "closed"): 0.70})  # below 0.75: the scorer alone shifts at 2 when 4 arrives
    assert decided(dialogue(), scorer) == [(Boundary(2, "shift"), 4)]
    assist = Assist(lambda before, window: False)
    assert decided(dialogue(), scorer, assist) == []
    # Asked once, when the window closed: the turns before the candidate, the candidate and its window.
    assert assist.asked == [([0, 1], [2, 3, 4], ["turn 2 text", "turn 3 text", "turn 4 text"])]


def test_an_unsure_continuation_the_model_confirms_is_a_boundary_decided_at_the_same_moment():
    scorer = ScriptedScorer({(2, "closed"): 0.80})  # above 0.75: the scorer alone keeps the episode whole
    assert decided(dialogue(), scorer) == []
    assist = Assist(lambda before, window: window[0].seq == 2)
    assert decided(dialogue(), scorer, assist) == [(Boundary(2, "shift"), 4)]


def test_sure_decisions_are_not_asked():
    early = ScriptedScorer({(2, "open"): 0.30})  # sure at arrival
    late = ScriptedScorer({(2, "closed"): 0.50})  # sure when the window closes
    for scorer in (early, late, ScriptedScorer()):
        assist = Assist(lambda before, window: pytest.fail("a sure decision went to the model"))
        assert decided(dialogue(), scorer, assist) == decided(dialogue(), scorer)
        assert assist.asked == []
    # An unsure probability with no decision due (an early moment above the early cut) is not asked either.
    waiting = ScriptedScorer({(2, "open"): 0.70, (2, "reply"): 0.72})
    assist = Assist(lambda before, window: True)
    decided(dialogue(), waiting, assist)
    assert assist.asked == []


def test_an_early_shift_the_model_rejects_keeps_the_window_open_until_it_closes():
    # With a band wider than the early margin, an early shift can be unsure too.
    scorer = ScriptedScorer({(2, "reply"): 0.50, (2, "closed"): 0.60})
    assert decided(dialogue(), scorer) == [(Boundary(2, "shift"), 3)]
    # For candidate 2: "no" after the reply, "yes" at the close (0.95 at 4's close is within 0.3 too: "no").
    assist = Assist(lambda before, window: window[0].seq == 2 and len(window) == 3, band=0.3)
    assert decided(dialogue(), scorer, assist) == [(Boundary(2, "shift"), 4)]
    assert [window for _, window, _ in assist.asked] == [[2, 3], [2, 3, 4], [4, 5, 6]]


@pytest.mark.parametrize("p", [0.30, 0.50, 0.70, 0.74, 0.76, 0.80, 0.95])
def test_no_answer_leaves_the_scorers_decision(p):
    for stage in ("open", "reply", "closed"):
        scorer = ScriptedScorer({(2, stage): p, (4, stage): p})
        silent = Assist(lambda before, window: None, band=1.0)
        assert decided(dialogue(), scorer, silent) == decided(dialogue(), scorer)


def answering(new_topic_at=lambda data: False):
    """A FakeLLM that answers topic-shift questions (`new_topic_at(prompt input) -> bool`)."""

    def answer(data):
        seqs = [t["seq"] for t in data["from_candidate"]]
        return TopicShift(
            context_before="before",
            context_after="after",
            turns=[TurnIntent(seq=s, intent="follow_up", topic="t") for s in seqs],
            new_topic=new_topic_at(data),
        )

    return FakeLLM({"topic_shift": answer})


def test_the_llm_assist_asks_a_def_dts_question_and_returns_the_models_answer():
    llm = answering(lambda data: data["from_candidate"][0]["text"] == "turn 2 text")
    assist = LLMBoundaryAssist(llm, 0.1, Cooldown())
    assert decided(dialogue(), ScriptedScorer({(2, "closed"): 0.8}), assist) == [(Boundary(2, "shift"), 4)]
    [prompt] = llm.calls
    assert prompt.name == "topic_shift" and prompt.version == "topic-shift-v2"
    # Numbered by their place in the prompt, not in the thread (prompts.numbered).
    assert prompt.input == {
        "before": [
            {"seq": 1, "role": "user", "text": "turn 0 text"},
            {"seq": 2, "role": "assistant", "text": "turn 1 text"},
        ],
        "candidate_seq": 3,
        "from_candidate": [
            {"seq": 3, "role": "user", "text": "turn 2 text"},
            {"seq": 4, "role": "assistant", "text": "turn 3 text"},
            {"seq": 5, "role": "user", "text": "turn 4 text"},
        ],
    }
    assert "intent" in prompt.system and prompt.response_model is TopicShift
    assert (assist.counts.asked, assist.counts.new_topic, assist.counts.same_topic) == (1, 1, 0)


@pytest.mark.parametrize("error", [TransientError("LLM unavailable: turn 2 text"), LLMRefused("key sk-1234")])
def test_a_failed_question_leaves_the_offline_decision_and_the_model_rests_for_a_while(error, caplog):
    now = [0.0]
    llm = answering(lambda data: True)
    llm.fail = error
    assist = LLMBoundaryAssist(llm, 0.1, Cooldown(60.0, clock=lambda: now[0]))
    scorer = ScriptedScorer({(2, "closed"): 0.70, (4, "closed"): 0.70})
    offline = decided(dialogue(9), scorer)
    assert offline == [(Boundary(2, "shift"), 4), (Boundary(4, "shift"), 6)]
    assert decided(dialogue(9), scorer, assist) == offline
    assert f"decides (and alone for 60 s): {type(error).__name__}" in caplog.text
    assert "turn 2" not in caplog.text and "sk-" not in caplog.text  # an error's text may echo what was sent
    assert len(llm.calls) == 1  # the second unsure decision came within the cooldown: not asked
    assert (assist.counts.failed, assist.counts.skipped) == (1, 1)
    now[0] = 61.0
    llm.fail = None
    assert decided(dialogue(9), scorer, assist) == [(Boundary(2, "shift"), 4), (Boundary(4, "shift"), 6)]
    assert len(llm.calls) == 3  # asked again after the cooldown; "new topic" agrees with the scorer here


def test_a_bug_is_not_mistaken_for_an_outage():
    llm = answering()
    llm.fail = KeyError("a bug")
    assist = LLMBoundaryAssist(llm, 0.1, Cooldown())
    with pytest.raises(KeyError):
        decided(dialogue(), ScriptedScorer({(2, "closed"): 0.7}), assist)


def test_with_the_assist_streaming_through_json_equals_one_pass_and_decides_within_two_user_turns():
    # Every decision unsure (band 1): the shipped scorer decides when, the model what.
    def assist():
        llm = answering(lambda data: len(data["from_candidate"][0]["text"]) % 3 == 0)
        return LLMBoundaryAssist(llm, 1.0, Cooldown())

    for seed in range(6):
        turns = chat(seed)
        whole = segment(turns, CFG, assist=assist())
        assert whole != segment(turns, CFG)  # the model changed something
        state, streamed = SegmenterState(), []
        one = assist()
        for t in turns:
            state, bounds = feed(state, t, CFG, assist=one)
            streamed += [(b, t.seq) for b in bounds]
            state = SegmenterState.from_json(json.loads(json.dumps(state.to_json())))
        assert [b for b, _ in streamed] == whole
        for b, decided_at in streamed:
            user_turns = [t for t in turns if b.seq <= t.seq <= decided_at and t.role == "user"]
            assert decided_at >= b.seq and len(user_turns) <= 2
        # In batches of 5 with the state through JSON between them, as the worker keeps it.
        state, pieces = SegmenterState(), []
        for start in range(0, len(turns), 5):
            for t in turns[start : start + 5]:
                state, bounds = feed(state, t, CFG, assist=one)
                pieces += bounds
            state = SegmenterState.from_json(json.loads(json.dumps(state.to_json())))
        assert pieces == whole


def test_off_the_state_keeps_no_text_and_on_it_keeps_a_bounded_amount():
    long = [SegTurn(i, "user", "word " * 600, T0 + timedelta(minutes=i), topic(0)) for i in range(4)]
    off, on = SegmenterState(), SegmenterState()
    for t in long:
        off, _ = feed(off, t, CFG)
        on, _ = feed(on, t, CFG, assist=Assist())
    assert all("t" not in r for r in off.to_json()["recent"])
    assert all(len(r["t"]) == TEXT_CHARS for r in on.to_json()["recent"])
    assert SegmenterState.from_json(on.to_json()).recent[0].text == long[0].text[:TEXT_CHARS]


def test_turns_kept_before_the_assist_was_switched_on_are_left_to_the_scorer():
    turns = dialogue()
    scorer = ScriptedScorer({(2, "closed"): 0.70})
    state = SegmenterState()
    for t in turns[:4]:  # the candidate (2) and its reply arrive with the assist off
        state, _ = feed(state, t, CFG, scorer)
    llm = answering(lambda data: False)
    assist = LLMBoundaryAssist(llm, 0.1, Cooldown())
    state, bounds = feed(SegmenterState.from_json(state.to_json()), turns[4], CFG, scorer, assist)
    assert bounds == [Boundary(2, "shift")] and llm.calls == [] and assist.counts.skipped == 1


def test_the_lease_is_renewed_while_questions_are_asked():
    now, renewed = [0.0], []
    inner = Assist(lambda before, window: None)
    keeping = KeepingLease(inner, lambda: renewed.append(now[0]), 30.0, clock=lambda: now[0])
    assert keeping.band == inner.band
    for t in (10.0, 31.0, 40.0, 70.0):
        now[0] = t
        keeping.new_topic([], [], 0.7)
    assert renewed == [31.0, 70.0] and len(inner.asked) == 4


def shift_events():
    """Two user turns on one subject, then another subject with its reply and a follow-up."""
    texts = [
        ("user", "I am planning a trip to Lisbon in May."),
        ("assistant", "Lisbon in May is lovely; morning flights from Berlin are cheapest."),
        ("user", "My laptop keeps crashing when I open the browser."),
        ("assistant", "Which laptop and operating system is it?"),
        ("user", "A ThinkPad with Linux."),
    ]
    return [planner_say(i + 1, text, i, role=role) for i, (role, text) in enumerate(texts)]


def test_a_boundary_the_model_confirms_when_the_window_closes_moves_the_window_to_the_new_episode():
    events = shift_events()
    vectors = {e.event_id: topic(0 if i < 2 else 3) for i, e in enumerate(events)}

    def at_close(before, window):  # "new topic" for the laptop question, only once the window is complete
        return window[0].seq == 3 and window[-1].role == "user"

    p = plan_batch(fresh(), logged(events), vectors, SegmenterConfig(), SummaryPolicy(), Assist(at_close, band=1.0))
    assert [(o.start_seq, o.opened_by) for o in p.opened] == [(1, "first"), (3, "shift")]
    assert [m.episode_id for m in p.messages] == ["t#1", "t#1", "t#2", "t#2", "t#2"]
    assert [(m.from_seq, m.from_episode, m.to_episode) for m in p.moves] == [(3, "t#1", "t#2")]


def test_the_doorbell_and_replay_place_the_same_boundaries_with_the_assist():
    opening = {"My laptop keeps crashing when I open the browser.", "Back to the Lisbon hotels."}  # seqs 3 and 6
    llm = answering(lambda data: data["from_candidate"][0]["text"] in opening)
    cooldown = Cooldown()

    def factory(thread_id):
        return LLMBoundaryAssist(llm, 1.0, cooldown)

    rig = MemoryRig(seg_cfg=SegmenterConfig(), assist=factory)
    later = ["Back to the Lisbon hotels.", "Near Alfama.", "Under 150 euros."]
    rig.publish([*shift_events(), *[planner_say(6 + i, text, 6 + i) for i, text in enumerate(later)]])
    rig.drain("t", batch_size=2)
    live = sorted((e["start_seq"], e["opened_by"]) for (g, _), e in rig.db.episodes.items() if g == 1)
    assert live == [(1, "first"), (3, "shift"), (6, "shift")]
    asked = len(llm.calls)
    result = replay_thread(
        "t",
        threads=rig.log,
        projections=rig.db,
        embedder=rig.embedder,
        run=lambda job, generation: None,
        seg_cfg=rig.seg_cfg,
        policy=rig.policy,
        owner="replay",
        lease_s=30,
        batch_size=500,
        assist=factory,
    )
    rebuilt = sorted(
        (e["start_seq"], e["opened_by"]) for (g, _), e in rig.db.episodes.items() if g == result.generation
    )
    # The same questions again (the container's CachedLLM answers them from its cache).
    assert rebuilt == live and llm.calls[asked:] == llm.calls[:asked]


def test_the_benchmark_scores_the_learned_segmenter_with_the_assist_next_to_it(tmp_path):
    from chatmem.bench.topicseg import run
    from tests.fakes import FakeEmbedder

    rows = []
    for seed in range(3):
        lines = [f"{t.role}: {t.text}" for t in chat(seed)]
        rows.append(json.dumps({"id": str(seed), "dialogue": "[NEWLINE]".join([*lines[:5], "[BOUNDARY]", *lines[5:]])}))
    data, out = tmp_path / "d.jsonl", tmp_path / "out.jsonl"
    data.write_text("\n".join(rows))
    assist = Assist(lambda before, window: True, band=1.0)  # every decision is a shift
    scores = run(data, out, FakeEmbedder(), baseline=False, assist=assist)
    assert list(scores) == ["learned+llm", "learned"] and assist.asked
    assert scores["learned+llm"] != scores["learned"]
    predicted = [json.loads(line)["ends_segment"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert sum(map(sum, predicted)) > len(predicted)  # the assisted run's predictions: many boundaries
