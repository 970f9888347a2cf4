"""The rule-based segmenter that the learned scorer replaced (2026-11-22), kept as the baseline of
`chatmem bench topicseg`: similarity of a user message to the centroid of the episode's recent
turns, adjusted by dialogue cues, below `shift_threshold` is a shift; hysteresis confirms it on the
next user message, and a one-turn digression never splits. Thresholds were tuned on the
development splits of TIAGE and SuperDialseg. Time gaps, markers and the length cut are the same
rules as the workers' segmenter (memory/segmentation.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from chatmem.memory.segmentation import DEFAULT_MARKERS, Boundary, SegTurn, has_marker

_WORD = re.compile(r"[\w']+", re.UNICODE)


@dataclass(frozen=True)
class RulesConfig:
    time_gap_hours: float = 8.0
    shift_threshold: float = 0.20
    window: int = 2  # recent turns of the current episode that form its centroid
    # Dialogue cues adjust the similarity: a reply to a question continues the topic; a new
    # question that answers nothing tends to open one; a few-word acknowledgement never does.
    answer_bonus: float = 0.3
    question_penalty: float = 0.4
    min_shift_words: int = 3
    markers: tuple[str, ...] = DEFAULT_MARKERS
    max_episode_turns: int = 400


@dataclass
class RulesState:
    window: list[list[float]] = field(default_factory=list)  # recent vectors of the episode
    pending: list[tuple[int, list[float] | None]] = field(default_factory=list)  # first shifted user turn on
    last_at: str | None = None
    turns: int = 0  # turns in the current episode
    prev_question: bool = False  # the previous message asked something


def _centroid(vectors: Sequence[Sequence[float]]) -> np.ndarray | None:
    if not vectors:
        return None
    c = np.mean(np.asarray(vectors, dtype=np.float32), axis=0)
    norm = float(np.linalg.norm(c))
    return c / norm if norm > 0 else None


def similarity(vector: np.ndarray | None, window: Sequence[Sequence[float]]) -> float | None:
    centroid = _centroid(window)
    if vector is None or centroid is None:
        return None
    return float(np.dot(vector, centroid))


def _push(window: list[list[float]], vector: np.ndarray | None, size: int) -> None:
    if vector is not None:
        window.append([float(x) for x in vector])
        del window[:-size]


def asks(text: str) -> bool:
    return "?" in text


def shift_score(
    turn: SegTurn, window: Sequence[Sequence[float]], prev_question: bool, cfg: RulesConfig
) -> float | None:
    """Similarity of the turn to the topic, adjusted by dialogue cues; below the threshold is a shift."""
    sim = similarity(turn.vector, window)
    if sim is None:
        return None
    if len(_WORD.findall(turn.text)) < cfg.min_shift_words:
        return 1.0
    if prev_question and not asks(turn.text):
        sim += cfg.answer_bonus
    elif asks(turn.text) and not prev_question:
        sim -= cfg.question_penalty
    return sim


def feed(state: RulesState, turn: SegTurn, cfg: RulesConfig) -> tuple[RulesState, list[Boundary]]:
    """Consume one message; return the new state and any boundaries decided now (a confirmed
    shift's boundary lies at an earlier message: the first shifted one)."""
    st, bounds = _feed(state, turn, cfg)
    st.prev_question = asks(turn.text)
    return st, bounds


def _feed(state: RulesState, turn: SegTurn, cfg: RulesConfig) -> tuple[RulesState, list[Boundary]]:
    st = RulesState(list(state.window), list(state.pending), state.last_at, state.turns, state.prev_question)
    at_iso = turn.at.isoformat()
    gap = (
        st.last_at is not None
        and (turn.at - datetime.fromisoformat(st.last_at)).total_seconds() > cfg.time_gap_hours * 3600
    )
    st.last_at = at_iso
    if st.turns == 0:
        st.turns = 1
        _push(st.window, turn.vector, cfg.window)
        return st, []
    if gap or st.turns >= cfg.max_episode_turns:
        return _restart(turn, cfg), [Boundary(turn.seq, "gap" if gap else "length")]

    if turn.role != "user":
        # Replies follow the user's topic: they extend whichever topic is pending or current.
        if st.pending:
            st.pending.append((turn.seq, None if turn.vector is None else [float(x) for x in turn.vector]))
        else:
            _push(st.window, turn.vector, cfg.window)
        st.turns += 1
        return st, []

    if has_marker(turn.text, cfg.markers):
        return _restart(turn, cfg), [Boundary(turn.seq, "marker")]

    score = shift_score(turn, st.window, st.prev_question, cfg)
    shifted = score is not None and score < cfg.shift_threshold
    if st.pending:
        if not _returns(turn, st, score, cfg):
            # The shift persisted: the episode starts at the first shifted user turn.
            first = st.pending[0][0]
            new = RulesState(window=[], pending=[], last_at=at_iso, turns=len(st.pending) + 1)
            for _, vec in st.pending:
                if vec is not None:
                    _push(new.window, np.asarray(vec), cfg.window)
            # This turn may itself open the next topic (a chain of new questions): judge it
            # against the new episode as any turn is.
            own = shift_score(turn, new.window, st.prev_question, cfg)
            if own is not None and own < cfg.shift_threshold:
                new.pending = [(turn.seq, [float(x) for x in turn.vector])]  # type: ignore[union-attr]
            else:
                _push(new.window, turn.vector, cfg.window)
            return new, [Boundary(first, "shift")]
        # A one-turn digression: stay, and keep the digression out of the topic centroid.
        st.pending = []
        _push(st.window, turn.vector, cfg.window)
        st.turns += 1
        return st, []
    if shifted:
        st.pending = [(turn.seq, [float(x) for x in turn.vector])]  # type: ignore[union-attr]
    else:
        _push(st.window, turn.vector, cfg.window)
    st.turns += 1
    return st, []


def _returns(turn: SegTurn, st: RulesState, score_old: float | None, cfg: RulesConfig) -> bool:
    """Is this user turn, the one after a shifted turn, back on the old topic (a digression
    ended) rather than going on with the new one?"""
    pending_vecs = [v for _, v in st.pending if v is not None]
    if st.prev_question and not asks(turn.text):
        # It answers what was just asked: it goes on with whichever topic that question was on.
        question = pending_vecs[-1] if len(pending_vecs) > 1 else None
        if question is None or (similarity(np.asarray(question), pending_vecs[:1]) or 0.0) > (
            similarity(np.asarray(question), st.window) or 0.0
        ):
            return False
    if score_old is not None and score_old < cfg.shift_threshold:
        return False  # still away from the old topic
    sim_old = similarity(turn.vector, st.window)
    sim_new = similarity(turn.vector, pending_vecs)
    if sim_old is None or sim_new is None:
        return sim_new is None
    return sim_old >= sim_new


def _restart(turn: SegTurn, cfg: RulesConfig) -> RulesState:
    st = RulesState(window=[], pending=[], last_at=turn.at.isoformat(), turns=1)
    _push(st.window, turn.vector, cfg.window)
    return st


def segment(turns: Iterable[SegTurn], cfg: RulesConfig, state: RulesState | None = None) -> list[Boundary]:
    """Boundaries over a whole sequence (what the benchmark and tests use)."""
    st = state or RulesState()
    out: list[Boundary] = []
    for turn in turns:
        st, bounds = feed(st, turn, cfg)
        out.extend(bounds)
    return out
