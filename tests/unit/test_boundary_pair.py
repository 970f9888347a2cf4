"""The pair model among people: its input, the stacker, the scorer that uses it, the streaming
contract with it, and the trainer's stacker fit. The encoder here is a hand-written fake behind
the `PairEncoder` port; tests/integration/test_boundary_pair.py runs the shipped ONNX file."""

import json
import math
import random
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from chatmem.bench.train_segmenter import PAIR_FILE, fit_logistic, read_rows, run, stack_inputs, train
from chatmem.memory.boundary_pair import (
    CLS_ID,
    CONTEXT_TURNS,
    MAX_CANDIDATE_TOKENS,
    MAX_TOKENS,
    SEP_ID,
    TEXT_CHARS,
    PairStack,
    context_text,
    pair_ids,
    stacked_logit,
)
from chatmem.memory.boundary_scorer import BoundaryScorer, TurnInfo, shipped_scorer
from chatmem.memory.segmentation import SegmenterConfig, SegmenterState, SegTurn, feed, segment, thread_scorer
from tests.fakes import FakeEmbedder
from tests.unit.test_segmentation import T0, TOPICS, _labelled, _tiny_corpus, write_tiny_data, write_tiny_tasks

CFG = SegmenterConfig()


class WordOverlapPair:
    """A fake pair model: its logit falls with the share of the candidate's words seen in the
    context, so little overlap is a shift."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.threads: list[str] = []

    def logit(self, context: str, candidate: str) -> float:
        self.asked.append((context, candidate))
        words = set(candidate.lower().replace("?", " ").replace(".", " ").split())
        seen = set(context.lower().replace("?", " ").replace(".", " ").split())
        return 3.0 - 12.0 * len(words & seen) / max(len(words), 1)

    def for_thread(self, thread_id: str) -> "WordOverlapPair":
        self.threads.append(thread_id)
        return self


def paired_scorer(encoder: WordOverlapPair | None = None, threshold: float = 0.5) -> BoundaryScorer:
    # stacker: the pair's logit only (weight 1 on z, open and closed alike)
    stack = PairStack(np.array([-12.0, 0.0]), 3.0, (0.0, 1.0, 0.0, 0.0, 0.0, 0.0), threshold, 0.3, 0.0, "sha")
    return replace(shipped_scorer(), pair=stack).with_encoder(encoder or WordOverlapPair())


def people_chat(seed: int, n_topics: int = 5) -> list[SegTurn]:
    """Two people hopping between topics (no assistant), vectors from the fake embedder."""
    rng = random.Random(seed)
    names = list(TOPICS)
    texts = []
    for k in range(n_topics):
        words = TOPICS[names[(k + seed) % len(names)]].split()
        texts += [" ".join(rng.sample(words, 5)) + rng.choice("?.") for _ in range(rng.randint(2, 5))]
    vectors = FakeEmbedder(dim=64).embed(texts)
    return [
        SegTurn(i, "user", t, T0 + timedelta(minutes=i), v) for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
    ]


def test_the_pair_keeps_the_context_end_and_the_candidate_start():
    context, candidate = list(range(1000, 1300)), list(range(2000, 2100))
    ids, types = pair_ids(context, candidate)
    assert len(ids) == len(types) == MAX_TOKENS
    assert ids[0] == CLS_ID and ids[-1] == SEP_ID
    kept = MAX_TOKENS - 3 - MAX_CANDIDATE_TOKENS
    assert ids[1 : 1 + kept] == context[-kept:] and ids[1 + kept] == SEP_ID
    assert ids[2 + kept : -1] == candidate[:MAX_CANDIDATE_TOKENS]
    assert types == [0] * (kept + 2) + [1] * (MAX_CANDIDATE_TOKENS + 1)
    short, short_types = pair_ids([5, 6], [7])
    assert short == [CLS_ID, 5, 6, SEP_ID, 7, SEP_ID] and short_types == [0, 0, 0, 0, 1, 1]
    assert context_text(["a", "", "b  ", " c", "d"]) == "b c d"  # the last three turns, empty ones dropped
    assert context_text(["x" * (TEXT_CHARS + 50)]) == "x" * TEXT_CHARS


def test_the_stacker_reads_the_bag_and_the_pair_and_a_closed_window():
    w = (0.5, 1.5, 0.25, -0.5, 0.1, -0.2)
    bag = math.log(0.8 / 0.2)
    assert stacked_logit(w, 0.8, 2.0, False) == pytest.approx(0.5 * bag + 1.5 * 2.0 - 0.2)
    assert stacked_logit(w, 0.8, 2.0, True) == pytest.approx(0.75 * bag + 1.0 * 2.0 + 0.1 - 0.2)
    x = stack_inputs(np.array([0.8]), np.array([2.0]), np.array([True]))
    assert float(x[0] @ np.array(w)) == pytest.approx(stacked_logit(w, 0.8, 2.0, True))


def test_a_scorer_is_bound_to_each_thread_it_reads():
    encoder = WordOverlapPair()
    scorer = paired_scorer(encoder)
    assert thread_scorer(scorer, "t1").encoder is encoder and encoder.threads == ["t1"]
    bag = shipped_scorer()
    assert thread_scorer(bag, "t2") is bag and thread_scorer(None, "t3") is None


def test_among_people_the_scorer_stacks_the_pair_and_uses_its_bar():
    encoder = WordOverlapPair()
    scorer = paired_scorer(encoder, threshold=0.45)
    bag = shipped_scorer()
    turns = people_chat(0)
    infos = [replace(TurnInfo.of(t.seq, t.role, t.text, t.vector), text=t.text) for t in turns]
    left, window = infos[:4], infos[4:5]
    z = encoder.logit(context_text([t.text for t in left]), window[0].text)
    assert scorer.boundary_probability(left, window) == pytest.approx(1 / (1 + math.exp(-z)))
    assert encoder.asked[-1] == (context_text([t.text for t in left[-CONTEXT_TURNS:]]), window[0].text)
    assert tuple(scorer.bar(left, window)) == (0.45, 0.3, 0.0)
    # a bot in view: the bag alone, the bots' bar, the pair never asked
    asked = len(encoder.asked)
    with_bot = [replace(left[0], role="assistant"), *left[1:]]
    assert scorer.boundary_probability(with_bot, window) == bag.boundary_probability(with_bot, window)
    assert scorer.bar(with_bot, window) == bag.bar(with_bot, window) and len(encoder.asked) == asked
    # words missing (a state kept before them): the bag alone, with its own peers' bar
    bare = [replace(t, text=None) for t in left]
    assert scorer.boundary_probability(bare, window) == bag.boundary_probability(bare, window)
    assert scorer.bar(bare, window) == bag.bar(bare, window) and len(encoder.asked) == asked
    # no encoder attached: the weights' pair section changes nothing
    alone = scorer.with_encoder(None)
    assert not alone.reads_text and alone.boundary_probability(left, window) == bag.boundary_probability(left, window)


def test_the_pair_stack_goes_through_the_weights_file():
    scorer = paired_scorer()
    data = json.loads(json.dumps(scorer.to_json({"seed": 0})))
    loaded = BoundaryScorer.from_json(data)
    assert loaded.pair is not None and loaded.encoder is None
    assert loaded.pair.to_json() == scorer.pair.to_json()


def _streamed(turns: list[SegTurn], scorer: BoundaryScorer) -> tuple[list, list[SegmenterState]]:
    state, out, states = SegmenterState(), [], []
    for t in turns:
        state, bounds = feed(state, t, CFG, scorer)
        out += [(b, t.seq) for b in bounds]
        state = SegmenterState.from_json(json.loads(json.dumps(state.to_json())))
        states.append(state)
    return out, states


def test_streaming_with_the_pair_model_equals_one_pass_and_decides_within_two_user_turns():
    changed = 0
    for seed in range(6):
        turns = people_chat(seed)
        scorer = paired_scorer()
        whole = segment(turns, CFG, scorer=scorer)
        streamed, states = _streamed(turns, paired_scorer())
        assert [b for b, _ in streamed] == whole and whole
        for b, decided_at in streamed:
            user_turns = [t for t in turns if b.seq <= t.seq <= decided_at and t.role == "user"]
            assert decided_at >= b.seq and len(user_turns) <= 2
        # the words go through the JSON state, cut as the model reads them
        assert all(t.text == turns[t.seq].text[:TEXT_CHARS] for s in states for t in s.recent)
        changed += whole != segment(turns, CFG, scorer=shipped_scorer())
    assert changed  # the pair model decides something the bag alone would not


def test_a_state_kept_without_words_reads_as_the_bag_until_they_leave_it():
    turns = people_chat(2)
    state = SegmenterState()
    for t in turns[:6]:
        state, _ = feed(state, t, CFG)  # no pair model: no words kept
    assert all(t.text is None for t in state.recent)
    encoder = WordOverlapPair()
    scorer = paired_scorer(encoder)
    for t in turns[6:]:
        state, _ = feed(state, t, CFG, scorer)
    assert encoder.asked  # once the old turns left the left context, the pair model reads again
    assert all(t.text is not None for t in state.recent)


def _pair_file(items, rows, noise: float, seed: int = 0) -> dict:
    """Out-of-fold logits as `chatmem bench train-pair` writes them: here the label plus noise."""
    rng = np.random.default_rng(seed)
    oof: dict[str, dict[str, float]] = {}
    for it in items:
        d = it.dialogue
        for seq in range(1, len(d.texts)):
            oof.setdefault(d.id, {})[str(seq)] = float(4 * d.ends_segment[seq - 1] - 2 + noise * rng.normal())
    return {"model_sha256": "f" * 64, "head": [0.5, -0.5], "bias": 0.1, "oof": oof, "trained": {"seed": 0}}


def test_the_trainer_fits_the_stacker_and_the_peoples_bar_for_the_pair():
    tiage, superseg = _tiny_corpus()
    t_items, s_items = _labelled(tiage, "tiage"), _labelled(superseg, "superseg")
    pair = _pair_file(t_items, read_rows(t_items), noise=1.0)
    with_pair = train(t_items, s_items, bag=1, pair=pair)
    without = train(t_items, s_items, bag=1)
    stack = with_pair.scorer.pair
    assert stack is not None and without.scorer.pair is None
    # the bag and its bars are trained as without the pair model
    assert with_pair.scorer.with_encoder(None).to_json({})["mlps"] == without.scorer.to_json({})["mlps"]
    assert with_pair.scorer.peer_threshold == without.scorer.peer_threshold
    # logits that nearly give the labels away: the stacker leans on them, and TIAGE gets better
    assert stack.stack[1] > 0.5
    assert stack.model_sha256 == "f" * 64 and list(stack.head) == [0.5, -0.5]
    assert (
        with_pair.summary["pair"]["cross_validated"]["tiage"]["score"]
        > without.summary["cross_validated"]["tiage"]["score"]
    )
    # a candidate without a logit is an error, not a silent zero
    del pair["oof"][tiage[0].id]["1"]
    with pytest.raises(ValueError, match="train-pair"):
        train(t_items, s_items, bag=1, pair=pair)


def test_the_newton_fit_finds_the_logistic_weights():
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=4000), np.ones(4000)])
    y = (rng.random(4000) < 1 / (1 + np.exp(-(2.0 * x[:, 0] - 1.0)))).astype(float)
    w = fit_logistic(x, y, l2=0.0)
    assert w == pytest.approx([2.0, -1.0], abs=0.15)


def test_the_training_script_writes_the_pair_section_the_segmenter_loads(tmp_path: Path):
    data = tmp_path / "data"
    tiage, _ = write_tiny_data(data)
    cache = tmp_path / "cache"
    cache.mkdir()
    t_items = _labelled(tiage, "tiage")
    (cache / PAIR_FILE).write_text(json.dumps(_pair_file(t_items, read_rows(t_items), noise=1.0)))
    out = tmp_path / "weights.json"
    said: list[str] = []
    run(data, cache, out, FakeEmbedder(dim=16), said.append, tasks_file=write_tiny_tasks(tmp_path / "tasks.jsonl"))
    scorer = BoundaryScorer.from_json(json.loads(out.read_text(encoding="utf-8")))
    assert scorer.pair is not None and scorer.pair.model_sha256 == "f" * 64
    assert any("with the pair model among people" in line for line in said)
    encoder = WordOverlapPair()
    turns = people_chat(1)
    assert segment(turns, CFG, scorer=scorer.with_encoder(encoder)) is not None and encoder.asked


def test_with_a_bot_in_view_the_pair_is_never_asked_and_the_bots_words_are_not_kept():
    from tests.unit.test_segmentation import chat

    encoder = WordOverlapPair()
    scorer = paired_scorer(encoder)
    turns = chat(4)
    assert segment(turns, CFG, scorer=scorer) == segment(turns, CFG, scorer=shipped_scorer())
    state = SegmenterState()
    for t in turns:
        state, _ = feed(state, t, CFG, scorer)
        state = SegmenterState.from_json(json.loads(json.dumps(state.to_json())))
        assert all((r.text is None) == (r.role == "assistant") for r in state.recent)
    assert not encoder.asked
