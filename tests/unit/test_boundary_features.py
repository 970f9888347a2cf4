"""The scorer's features, computed from running sums, against the same features spelled out one
block mean and one cosine at a time (as the shipped weights were trained)."""

from __future__ import annotations

import numpy as np
import pytest

from chatmem.memory.boundary_scorer import LEFT_CONTEXT, LEFT_WIDTHS, TurnInfo, features


def _unit_mean(vectors):
    m = np.mean(np.asarray(vectors, dtype=np.float64), axis=0)
    norm = float(np.linalg.norm(m))
    return m / norm if norm > 0 else m


def _cos(a, b):
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b)) / (na * nb) if na > 0 and nb > 0 else 0.0


def spelled_out(left, window):
    """The similarity part of the features (the first 15), block by block."""
    cand = window[0]
    lv = [t.vector for t in left if t.vector is not None]
    rv = [t.vector for t in window if t.vector is not None]
    right = _unit_mean(rv)
    sims = []
    for w in LEFT_WIDTHS:
        lw = _unit_mean(lv[-w:])
        sims += [_cos(lw, cand.vector), _cos(lw, right), _cos(lw, rv[-1])]
    seq = lv + rv
    at = len(lv)
    gaps = range(max(1, at - 3), len(seq))
    adjacent = [_cos(seq[g - 1], seq[g]) for g in gaps]
    paired = [_cos(_unit_mean(seq[max(0, g - 2) : g]), _unit_mean(seq[g : g + 2])) for g in gaps]
    here = at - max(1, at - 3)

    def depth(values, i):
        lo, hi = values[:i], values[i + 1 :]
        return (max(lo) - values[i] if lo else 0.0) + (max(hi) - values[i] if hi else 0.0)

    return [*sims, _cos(cand.vector, rv[-1]), depth(adjacent, here), depth(paired, here)]


@pytest.mark.parametrize("seed", range(40))
def test_running_sums_give_the_spelled_out_features(seed):
    rng = np.random.default_rng(seed)
    n_left, n_window = int(rng.integers(1, LEFT_CONTEXT + 1)), int(rng.integers(1, 4))

    def turn(i, role, with_vector=True):
        vec = rng.normal(size=16).astype(np.float32) if with_vector else None
        if with_vector and rng.random() < 0.1:
            vec = np.zeros(16, dtype=np.float32)  # a zero vector: cosine 0, as before
        return TurnInfo.of(i, role, "some words here?" if rng.random() < 0.3 else "plain words", vec)

    left = [
        turn(i, "user" if i % 2 == 0 else "assistant", i == n_left - 1 or rng.random() > 0.2) for i in range(n_left)
    ]
    window = [turn(n_left, "user")] + [
        turn(n_left + i, "assistant" if i % 2 else "user", rng.random() > 0.2) for i in range(1, n_window)
    ]
    got = features(left, window)
    assert got[:15] == pytest.approx(spelled_out(left, window), abs=1e-6)


@pytest.mark.parametrize(
    ("written", "tokenised"),
    [
        ("Thanks, that's all I need.", "thanks , that 's all i need ."),
        ("No, I don't need anything else. You're welcome!", "no , i do n't need anything else . you 're welcome !"),
        ("I'd like a taxi, please.", "i 'd like a taxi , please ."),
        ("It's in the north. And what's the phone number?", "it 's in the north . and what 's the phone number ?"),
    ],
)
def test_a_tokenised_turn_gives_the_cues_of_the_turn_as_written(written, tokenised):
    # Corpora split contractions off their words; the cues read them joined, the word count as sent.
    for role in ("user", "assistant"):
        a, b = TurnInfo.of(0, role, written, None), TurnInfo.of(0, role, tokenised, None)
        assert a.cues == b.cues and a.cues != 0
        assert b.words == len(tokenised.replace(" ,", "").replace(" .", "").replace(" !", "").replace(" ?", "").split())


def test_a_phone_s_typographic_apostrophes_give_the_cues_and_word_count_of_plain_ones():
    plain = "No, I don't need anything else. You're welcome!"
    typed = plain.replace("'", "\u2019")
    for role in ("user", "assistant"):
        a, b = TurnInfo.of(0, role, plain, None), TurnInfo.of(0, role, typed, None)
        assert (a.cues, a.words) == (b.cues, b.words) and a.cues != 0
