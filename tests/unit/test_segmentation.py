from datetime import UTC, datetime, timedelta

import numpy as np

from chatmem.bench.topicseg import evaluate, pk, window_k, windowdiff
from chatmem.memory.segmentation import SegmenterConfig, SegmenterState, SegTurn, feed, has_marker, segment

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DIM = 8


def topic(k: int, wobble: float = 0.0) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[k] = 1.0
    v[(k + 1) % DIM] = wobble
    return v / np.linalg.norm(v)


def conv(spec):
    """spec: (role, topic index, text, minutes after start)"""
    return [
        SegTurn(i, role, text, T0 + timedelta(minutes=m), topic(t, 0.1 * (i % 3)))
        for i, (role, t, text, m) in enumerate(spec)
    ]


CFG = SegmenterConfig()


def test_time_gap_starts_an_episode():
    turns = conv(
        [
            ("user", 0, "planning the trip to lisbon", 0),
            ("assistant", 0, "great plan for lisbon", 1),
            ("user", 0, "more about the lisbon trip", 9 * 60),
        ]
    )
    assert [(b.seq, b.reason) for b in segment(turns, CFG)] == [(2, "gap")]


def test_persistent_shift_splits_at_the_first_shifted_turn():
    turns = conv(
        [
            ("user", 0, "my flights to lisbon in may", 0),
            ("assistant", 0, "morning flights from berlin", 1),
            ("user", 0, "direct flights are best for me", 2),
            ("assistant", 0, "noted, direct only", 3),
            ("user", 3, "now my laptop keeps crashing daily", 4),
            ("assistant", 3, "which laptop model is it", 5),
            ("user", 3, "a thinkpad with linux on it", 6),
        ]
    )
    assert [(b.seq, b.reason) for b in segment(turns, CFG)] == [(4, "shift")]


def test_one_turn_digression_never_splits():
    turns = conv(
        [
            ("user", 0, "my flights to lisbon in may", 0),
            ("assistant", 0, "morning flights from berlin", 1),
            ("user", 5, "totally different thing about the weather", 2),
            ("assistant", 5, "it is sunny today", 3),
            ("user", 0, "back to the flights to lisbon", 4),
            ("assistant", 0, "here are lisbon flights", 5),
            ("user", 0, "book the early lisbon flight", 6),
        ]
    )
    assert segment(turns, CFG) == []


def test_russian_and_english_markers_split_at_once():
    turns = conv(
        [
            ("user", 0, "расскажи про рейсы в лиссабон", 0),
            ("assistant", 0, "есть утренние рейсы", 1),
            ("user", 0, "Кстати, а какая там погода в мае", 2),
        ]
    )
    assert [(b.seq, b.reason) for b in segment(turns, CFG)] == [(2, "marker")]
    assert has_marker("By the way, can you remind me", CFG.markers)
    assert has_marker("Ok. Давай про другое: ноутбуки", CFG.markers)
    assert not has_marker("the way I see it, flights are fine", CFG.markers)


def test_streaming_in_batches_through_json_state_equals_one_pass():
    spec = [("user", (i // 5) % 3, f"message number {i} here", i) for i in range(30)]
    turns = conv(spec)
    whole = segment(turns, CFG)
    state, pieces = SegmenterState(), []
    for start in range(0, len(turns), 4):
        for t in turns[start : start + 4]:
            state, bounds = feed(state, t, CFG)
            pieces.extend(bounds)
        state = SegmenterState.from_json(state.to_json())  # what the worker stores between batches
    assert pieces == whole and whole


def test_per_thread_overrides():
    cfg = CFG.with_overrides({"time_gap_hours": 1, "markers": ["NEW TOPIC"], "ignored": 5})
    assert cfg.time_gap_hours == 1 and cfg.markers == ("new topic",)


def test_metrics_match_nltk_reference_values():
    assert round(pk(list(map(int, "0100" * 100)), [1] * 400, 2), 2) == 0.50
    assert round(pk(list(map(int, "0100" * 100)), list(map(int, "0100" * 100)), 2), 2) == 0.0
    s1, s2, s3 = (list(map(int, s)) for s in ("000100000010", "000010000100", "100000010000"))
    assert round(windowdiff(s1, s2, 3), 2) == 0.30
    assert round(windowdiff(s2, s3, 3), 2) == 0.80
    assert window_k([0] * 12) == 6 and window_k([0, 1, 0, 1] * 3) == 2


def test_score_combines_f1_pk_wd():
    ref = [[0, 0, 1, 0, 0, 1, 0, 0]]
    perfect = evaluate(ref, ref)
    assert perfect.f1 == 1.0 and perfect.pk == 0.0 and perfect.score == 1.0
    assert evaluate(ref, [[0] * 8]).f1 == 0.0
