"""The learned recall ranker: its features, its trainer (pure numpy) and the shipped weights."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from chatmem.bench.train_ranker import BAG, Pool, cross_validate, fit_bag, fit_ranker, recall_at, weights_json
from chatmem.memory.dates import query_period
from chatmem.memory.mlp import Bag
from chatmem.memory.recall import (
    TURN_FEATURES,
    RankParams,
    TermStats,
    TurnCandidate,
    load_ranker,
    rank_turns,
    shipped_ranker,
    turn_features,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)
COL = {name: i for i, name in enumerate(TURN_FEATURES)}


def turn(seq, sim=0.0, tf=(0,), length=8, text=None, at=AT, named=False, episode="t#1"):
    return TurnCandidate(
        "t", seq, episode, f"e{seq}", f"p{seq}", "u", "user", text or f"text {seq}", at, True, sim, tf, length, named
    )


def synthetic_pools(n: int, seed: int) -> list[Pool]:
    """Pools where one feature (with noise) tells the evidence apart; the rule's scores are noise."""
    rng = np.random.default_rng(seed)
    pools = []
    for q in range(n):
        x = rng.normal(size=(30, len(TURN_FEATURES)))
        relevant = np.zeros(30, dtype=bool)
        relevant[rng.choice(30, 2, replace=False)] = True
        x[:, COL["vector"]] += 3.0 * relevant
        pools.append(Pool(f"conv-{q % 4}", 1 + q % 4, x, relevant, rng.normal(size=30), 2))
    return pools


def test_the_trainer_learns_the_signal_and_beats_noise_on_held_out_conversations():
    pools = synthetic_pools(80, seed=1)
    cv = cross_validate(pools, epochs=200, bag=2)
    assert cv["all"]["questions"] == 80
    assert cv["all"]["learned"] > 0.9 > 0.6 > cv["all"]["linear"]
    # With its interval, and the lead over the rule on the same questions, which is clear here.
    assert cv["all"]["learned_low"] <= cv["all"]["learned"] <= cv["all"]["learned_high"]
    assert cv["all"]["lead_low"] > 0.2
    # And per held-out conversation, so the spread between conversations is seen.
    assert [cv[f"conversation conv-{i}"]["questions"] for i in range(4)] == [20, 20, 20, 20]


def test_training_is_deterministic_for_a_seed():
    pools = synthetic_pools(20, seed=2)
    assert weights_json(fit_bag(pools, epochs=50), {}) == weights_json(fit_bag(pools, epochs=50), {})
    assert weights_json(fit_bag(pools, seed=1, epochs=50), {}) != weights_json(fit_bag(pools, epochs=50), {})


def test_the_bag_ranks_by_its_networks_mean_logit():
    pools = synthetic_pools(20, seed=3)
    bag = fit_bag(pools, epochs=50, bag=3)
    # Its networks are the single ranker's recipe from successive seeds, and they differ.
    assert [m.to_json() for m in bag.members] == [fit_ranker(pools, seed=k, epochs=50).to_json() for k in range(3)]
    x = pools[0].features
    logits = [m.logit(x) for m in bag.members]
    assert not np.allclose(logits[0], logits[1])
    assert np.allclose(bag.logit(x), np.mean(logits, axis=0))
    assert np.array_equal(Bag(bag.members[:1]).logit(x), logits[0])
    with pytest.raises(ValueError):
        Bag(())


def test_a_pool_without_evidence_teaches_nothing_and_counts_zero():
    pool = synthetic_pools(1, seed=3)[0]
    empty = Pool("c", 1, pool.features, np.zeros(30, dtype=bool), pool.linear, 2)
    assert recall_at(empty, np.arange(30.0)) == 0.0
    with pytest.raises(ValueError, match="no question"):
        fit_ranker([empty])


def test_features_are_relative_to_the_pool_and_read_the_turn():
    stats = TermStats(docs=50, avg_len=8, df=(3,))
    turns = [
        turn(1, sim=0.9, tf=(2,), text="Where did you go?"),
        turn(2, sim=0.5, text="To the coast.\n[image#0a1b2c3d] a beach at dawn", named=True),
        turn(3, sim=0.1, at=AT + timedelta(days=3)),
    ]
    x = turn_features(turns, stats, RankParams(), {"t#1": 0.7}, query_period("what happened on 1 January 2026"))
    assert x.shape == (3, len(TURN_FEATURES)) and np.isfinite(x).all()
    assert x[:, COL["vector"]].mean() == pytest.approx(0.0)  # z-scores over the pool
    assert x[0, COL["lexical"]] > x[1, COL["lexical"]]
    assert list(x[:, COL["question"]]) == [1, 0, 0] and list(x[:, COL["attachment"]]) == [0, 1, 0]
    # The reply right after a question; the first turn's neighbour before is not in the pool.
    assert list(x[:, COL["prev_question"]]) == [0, 1, 0]
    assert list(x[:, COL["named_author"]]) == [0, 1, 0] and list(x[:, COL["named_day"]]) == [1, 1, 0]
    assert list(x[:, COL["summary"]]) == [0.7, 0.7, 0.7]
    assert x[1, COL["prev_vector"]] == x[0, COL["vector"]] and x[1, COL["next_vector"]] == x[2, COL["vector"]]
    # Three days apart: the third turn is a sitting of its own, the first two share their best.
    assert x[0, COL["sitting"]] == x[1, COL["sitting"]] > x[2, COL["sitting"]]


def test_a_question_is_read_from_the_senders_words_not_the_caption_after_them():
    stats = TermStats(docs=50, avg_len=8, df=(3,))
    turns = [
        turn(1, text="Look what I painted, do you like it?\n[image#0a1b2c3d] a sunset over a lake"),
        turn(2, text="I love it!"),
        turn(3, text="[image#1b2c3d4e] a question mark drawn in chalk?"),  # a picture alone asks nothing
        turn(4, text="Where was that?\n[file#2c3d4e5f] notes.pdf"),
    ]
    x = turn_features(turns, stats, RankParams())
    assert list(x[:, COL["question"]]) == [1, 0, 0, 1]
    assert list(x[:, COL["prev_question"]]) == [0, 1, 0, 0]


def test_the_shipped_ranker_loads_and_puts_a_clear_match_first():
    model = shipped_ranker()
    assert len(model.members) == BAG
    assert all(m.skip is not None and m.w1.shape == (len(TURN_FEATURES), 8) for m in model.members)
    stats = TermStats(docs=50, avg_len=8, df=(3,))
    turns = [turn(i, sim=0.1) for i in range(1, 40, 3)] + [turn(20, sim=0.8, tf=(2,))]
    assert rank_turns(turns, stats, RankParams(), ranker=model)[0][0].seq == 20


def test_weights_for_other_features_are_refused():
    text = weights_json(fit_bag(synthetic_pools(8, seed=4), epochs=5, bag=2), {})
    assert [m.w1.shape[0] for m in load_ranker(text).members] == [len(TURN_FEATURES)] * 2
    with pytest.raises(ValueError, match="retrain"):
        load_ranker(text.replace('"vector"', '"dense"'))


def test_the_attachment_feature_reads_the_lines_the_surrogates_write():
    from chatmem.memory.attachments.surrogates import ATTACHMENT_LINE, RefState, attachment_line

    photo = {"kind": "image", "caption": "a beach"}
    for state in (None, RefState(0, "done", "image", "0a1b2c3d" * 8, "sand and sea"), RefState(0, "failed")):
        assert ATTACHMENT_LINE.search("look at this\n" + attachment_line(photo, state))
    assert not ATTACHMENT_LINE.search("I wrote [image] in the middle of a line")


def test_the_trainer_ships_the_final_query_encoder_in_int8_and_learns_from_fp16_stored_ones(monkeypatch, tmp_path):
    # The ranker's pools come from the leave-one-out encoders, stored as fp16 (held out, a ranker
    # refitted on int8 pools lost more); the encoder that ships is written in int8. Training and
    # export are faked: this is the trainer's wiring, which needs no torch.
    import io

    from rich.console import Console

    from chatmem.bench import train_query, train_ranker

    exported: list[tuple[tuple[str, ...], str, bool]] = []

    def export(bert, out, int8=False):
        exported.append((bert, out.name, int8))
        out.write_bytes(b"onnx")

    def questions(c, corpus, categories):
        return [train_query.Question(s["sample_id"], "q?", np.zeros((1, 1)), np.ones(1, bool)) for s in corpus]

    monkeypatch.setattr(train_query, "questions", questions)
    monkeypatch.setattr(train_query, "fine_tune", lambda items, **kw: tuple(q.sample for q in items))
    monkeypatch.setattr(train_query, "export", export)
    monkeypatch.setattr(train_ranker, "collect", lambda c, corpus, encoder: [s["sample_id"] for s in corpus])

    corpus = [{"sample_id": "a"}, {"sample_id": "b"}]
    pools = train_ranker.encoder_pools(None, corpus, tmp_path / "query.onnx", Console(file=io.StringIO()))
    assert exported == [
        (("b",), "without-a.onnx", False),
        (("a",), "without-b.onnx", False),
        (("a", "b"), "query.onnx", True),
    ]
    assert pools == ["a", "b"]
