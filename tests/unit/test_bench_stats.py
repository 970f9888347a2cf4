"""Bootstrap intervals of benchmark figures (bench/stats.py) and the per-dialogue Scores they resample."""

import numpy as np
import pytest

from chatmem.bench.stats import bootstrap, paired
from chatmem.bench.topicseg import evaluate


def test_constant_figures_have_no_spread() -> None:
    ci = bootstrap([0.6] * 50)
    assert (ci.mean, ci.low, ci.high, ci.n) == (pytest.approx(0.6), pytest.approx(0.6), pytest.approx(0.6), 50)


def test_interval_is_seeded_and_narrows_with_more_units() -> None:
    rng = np.random.default_rng(1)
    small, large = rng.random(100), rng.random(2000)
    assert bootstrap(small) == bootstrap(small)
    a, b = bootstrap(small), bootstrap(large)
    assert a.low < a.mean < a.high and b.low < b.mean < b.high
    assert (b.high - b.low) < (a.high - a.low) / 3  # width goes as 1/sqrt(n): 1/sqrt(20) of it


def test_interval_covers_the_true_mean_about_as_often_as_it_says() -> None:
    # 200 samples of 150 coin flips with p = 0.3, each from a fixed seed: a 95% interval should
    # hold 0.3 for about 190 of them; too narrow or too wide an interval moves that count.
    held = 0
    for seed in range(200):
        flips = (np.random.default_rng(100 + seed).random(150) < 0.3).astype(float)
        ci = bootstrap(flips, rounds=400)
        held += ci.low <= 0.3 <= ci.high
    assert 180 <= held <= 198


def test_pairing_finds_a_small_steady_lead_that_separate_intervals_miss() -> None:
    base = np.random.default_rng(2).random(100)  # units vary far more than the lead
    better = base + 0.02
    apart_a, apart_b = bootstrap(better), bootstrap(base)
    assert apart_a.low < apart_b.high  # the two intervals overlap
    lead = paired(better, base)
    assert lead.mean == pytest.approx(0.02) and lead.low > 0
    assert paired(base, base).text(sign=True).startswith("+0.000")


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        bootstrap([])
    with pytest.raises(ValueError, match="same units"):
        paired([1.0, 2.0], [1.0])


def test_text() -> None:
    assert bootstrap([0.5, 0.7]).text("dialogues").startswith("0.600 (95% CI 0.500–0.700, 2 dialogues")
    assert paired([0.5], [0.7]).text(sign=True) == "-0.200 (95% CI -0.200 to -0.200, 1)"


def test_topicseg_score_is_the_mean_of_the_dialogues_scores() -> None:
    refs = [[0, 1, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0]]
    hyps = [[0, 1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 0, 0]]
    s = evaluate(refs, hyps)
    assert len(s.dialogues) == 3 and s.dialogues[2] == pytest.approx(1.0)
    assert s.score == pytest.approx(float(np.mean(s.dialogues)))
    assert s.interval().mean == pytest.approx(s.score)
    assert evaluate([[0]], [[0]]).dialogues == ()  # a one-utterance dialogue is not scored


def test_locomo_report_prints_recall_at_10_with_its_interval(tmp_path) -> None:
    import io

    from rich.console import Console

    from chatmem.bench.locomo import _report

    per_question = {"recall@5": [1.0, 0.0, 0.5, 1.0], "recall@10": [1.0, 0.0, 1.0, 1.0], "recall@25": [1.0] * 4}
    scores = {cat: {} for cat in (1, 2, 3, 4)} | {1: per_question | {"full@10": [1.0, 0.0, 1.0, 1.0]}}
    printed = io.StringIO()
    figures = _report(Console(file=printed, width=200), tmp_path / "x.json", [{}], scores)
    assert figures["all"]["recall@10"] == pytest.approx(0.75) and figures["all"]["n"] == 4
    assert "recall@10, all questions: 0.750 (95% CI 0.250–1.000, 4 questions)" in printed.getvalue()


def test_topicseg_scores_other_weights_as_a_candidate_on_the_same_dialogues(tmp_path) -> None:
    import dataclasses
    import json

    from chatmem.bench.stats import paired
    from chatmem.bench.topicseg import run
    from chatmem.memory.boundary_scorer import shipped_scorer
    from chatmem.memory.segmentation import SegmenterConfig
    from tests.fakes import FakeEmbedder
    from tests.unit.test_segmentation import chat

    rows = []
    for seed in range(4):
        lines = [f"{t.role}: {t.text}" for t in chat(seed)]
        rows.append(json.dumps({"id": str(seed), "dialogue": "[NEWLINE]".join([*lines[:5], "[BOUNDARY]", *lines[5:]])}))
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(rows))

    same = run(data, None, FakeEmbedder(), baseline=False, candidate=shipped_scorer())
    assert list(same) == ["candidate", "learned"] and same["candidate"] == same["learned"]
    assert paired(same["candidate"].dialogues, same["learned"].dialogues).mean == 0.0

    # A scorer that always finds the topic changed: the same dialogues, other boundaries.
    eager = dataclasses.replace(
        shipped_scorer(), threshold=1.01, early_margin=0.0, peer_threshold=1.01, peer_margin=0.0
    )
    other = run(data, None, FakeEmbedder(), baseline=False, candidate=eager)
    assert other["learned"] == same["learned"] and other["candidate"] != other["learned"]
    assert len(other["candidate"].dialogues) == len(other["learned"].dialogues) == 4

    # Other settings with the shipped weights: shifts off is another segmentation of the same dialogues.
    off = run(data, None, FakeEmbedder(), baseline=False, candidate_config=SegmenterConfig(shift_threshold=0.0))
    assert off["learned"] == same["learned"] and off["candidate"] != off["learned"]
