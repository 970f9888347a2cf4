"""Episode segmentation: a pure, streaming function over a thread's messages.

A new episode starts
- on a time gap longer than `time_gap_hours`;
- on an explicit marker in a user message ("by the way", "кстати", ...), at once;
- on a topic shift judged by the learned boundary scorer (memory/boundary_scorer.py). Every user
  turn is a candidate boundary with a window: the candidate and the turns after it up to the next
  user turn (the hysteresis window of two user turns). The scorer gives the probability that the
  topic changes at the candidate when it arrives, after each reply, and when the next user turn
  closes the window. A shift is declared when the probability that the topic continues falls
  below `shift_threshold`; before the window closes it must fall below it by the scorer's early
  margin. Threshold and margin are the scorer's: one pair where an assistant is in view (a bot's
  conversation), another where none is (people chatting). While the episode holds a single user
  turn before the candidate, the threshold is lower by the scorer's fresh margin: a topic of one
  turn is rare among people. A closed window that stayed above it is no boundary. So every
  decision is made within two user turns of the boundary, never later; a boundary decided late
  lies at an earlier message, and the messages after it move to the new episode.
  In a conversation with a bot whose user has already ended a task with a thanks ("Thanks, that's
  all"), a shift with no such closing since the last boundary needs P(topic continues) below
  `closed_thread_bar` (0.4) as well: that user closes tasks, so a turn that follows no closing is
  more likely a follow-up than a new task, and the scorer, which learned from data that splits at
  every sub-question, must find a new topic clearly more likely than not. The user's closing itself
  is no candidate there: it belongs to the task it ends.

Optionally (`segment_llm_assist`) a model gives a second opinion on the decisions the scorer is
unsure of: when a decision is taken (a shift at any moment, or no shift when the window closes)
and the probability that the topic continues lies strictly within `band` of the threshold, the
`BoundaryAssist` is asked whether the candidate starts a new topic, and its answer decides; with
no answer the scorer's decision stands. It is asked only at the moments the segmenter decides
anyway, so the two-user-turn bound holds; a rejected early shift leaves the window open.

Among people, the scorer may stack a pair model that reads the words of the turns before the
candidate and of the candidate (memory/boundary_pair.py) with the bag; with it the state keeps the
first TEXT_CHARS characters of each turn it holds that is not an assistant's, and with the assist
of every turn it holds.

The state is small and JSON-serialisable (the last few turns' vectors and cues), so the worker
keeps it per thread between batches; the same function runs in the workers, in `chatmem bench
topicseg` and in the trainer (bench/train_segmenter.py), which reads the features through it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from chatmem.memory.boundary_pair import TEXT_CHARS  # of each turn, kept for the assist and the pair model
from chatmem.memory.boundary_scorer import (
    LEFT_CONTEXT,
    Bar,
    TurnInfo,
    among_people,
    closes_conversation,
    shipped_scorer,
)
from chatmem.memory.text import pattern_text

DEFAULT_MARKERS: tuple[str, ...] = (
    # English
    "by the way",
    "btw",
    "let's talk about something else",
    "lets talk about something else",
    "on another note",
    "on a different note",
    "changing the subject",
    "change of topic",
    "different topic",
    "new topic",
    "unrelated question",
    "unrelated,",
    "anyway,",
    "speaking of which",
    # Russian
    "кстати",
    "давай про другое",
    "давай поговорим о другом",
    "давайте поговорим о другом",
    "сменим тему",
    "другой вопрос",
    "другая тема",
    "о другом",
    "не по теме",
    "а вот ещё",
)

MAX_WINDOW = 8  # turns in a window without a second user turn: then it closes undecided (bounds the state)


class Scorer(Protocol):
    def bar(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> Bar:
        """When a shift is declared for this candidate and window."""
        ...

    def boundary_probability(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> float: ...


def thread_scorer(scorer: Scorer | None, thread_id: str) -> Scorer | None:
    """`scorer` for one thread's turns: a scorer whose model answers are cached keeps them under
    the thread (memory/boundary_scorer.py, `for_thread`), so an erasure finds them."""
    bind = getattr(scorer, "for_thread", None)
    return bind(thread_id) if bind is not None else scorer


class BoundaryAssist(Protocol):
    """A second opinion on decisions the scorer is unsure of (memory/boundary_llm.py)."""

    @property
    def band(self) -> float:
        """Ask only when P(topic continues) is strictly within this distance of the threshold."""
        ...

    def new_topic(self, before: Sequence[TurnInfo], window: Sequence[TurnInfo], p_continues: float) -> bool | None:
        """Does `window[0]` start a new topic after `before`? None: no answer (the scorer decides)."""
        ...


@dataclass(frozen=True)
class SegmenterConfig:
    time_gap_hours: float = 8.0
    # A shift when the scorer's probability that the topic continues falls below this. None: the
    # threshold trained with the shipped weights, one default for every kind of conversation.
    # A value at or below 0 turns topic shifts off (gaps, markers and length still split).
    shift_threshold: float | None = None
    markers: tuple[str, ...] = DEFAULT_MARKERS
    max_episode_turns: int = 400  # a very long episode is cut so summaries stay bounded
    # With a bot in view, once the user has closed a task with a thanks, a shift with no closing
    # since the last boundary needs P(topic continues) below this too. None: no such bar.
    closed_thread_bar: float | None = 0.4

    @property
    def thanks_rules(self) -> bool:
        """The closed-thread bar, and a closing opening no episode: on unless the bar is off (None,
        or 1 and more, which would cap nothing)."""
        return self.closed_thread_bar is not None and self.closed_thread_bar < 1

    def with_overrides(self, overrides: dict) -> SegmenterConfig:
        known = {k: v for k, v in overrides.items() if k in self.__dataclass_fields__ and k != "markers"}
        if "markers" in overrides:
            known["markers"] = tuple(str(m).lower() for m in overrides["markers"])
        return replace(self, **known)


@dataclass(frozen=True)
class SegTurn:
    seq: int
    role: str  # user | assistant | system
    text: str
    at: datetime
    vector: np.ndarray | None  # unit-normalised embedding, None when the text is empty


@dataclass(frozen=True)
class Boundary:
    seq: int  # the first message of the new episode
    reason: str  # gap | marker | shift | length


def _vector_json(v: np.ndarray | None) -> str | None:
    # float32 bytes: exact across the JSON round trip and a fraction of the size of a float list
    return None if v is None else base64.b64encode(np.asarray(v, dtype=np.float32).tobytes()).decode()


def _vector_from(s: str | None) -> np.ndarray | None:
    return None if s is None else np.frombuffer(base64.b64decode(s), dtype=np.float32).copy()


@dataclass(frozen=True)
class TaskEnds:
    """Whether the user has ended a task with a thanks in this thread (`closes_conversation`), and
    whether since the last boundary: what the closed-thread bar reads."""

    seen: bool = False
    since_boundary: bool = False

    def after(self, turn: TurnInfo, boundary: bool) -> TaskEnds:
        """The flags once `turn` is behind us, a boundary at it or not."""
        ends = closes_conversation(turn)
        return TaskEnds(self.seen or ends, ends if boundary else self.since_boundary or ends)

    @property
    def gates(self) -> bool:
        return self.seen and not self.since_boundary


@dataclass
class SegmenterState:
    last_at: str | None = None
    turns: int = 0  # turns in the current episode
    recent: list[TurnInfo] = field(default_factory=list)  # left context, then the open window
    window: int = 0  # the last `window` turns of `recent` are the open window (0: none)
    ends: TaskEnds = TaskEnds()  # over the turns before the open window's candidate
    users: int = 0  # user turns in the current episode, the newest turn included

    @property
    def pending_since(self) -> int | None:
        """The candidate of the open window: it and the messages after it may still move to a
        new episode."""
        return self.recent[-self.window].seq if self.window else None

    def to_json(self) -> dict[str, Any]:
        return {
            "last_at": self.last_at,
            "turns": self.turns,
            "recent": [
                {
                    "seq": t.seq,
                    "role": t.role,
                    "v": _vector_json(t.vector),
                    "words": t.words,
                    "q": t.question,
                    "cues": t.cues,
                    **({"t": t.text} if t.text is not None else {}),
                }
                for t in self.recent
            ],
            "window": self.window,
            "ends": [self.ends.seen, self.ends.since_boundary],
            "users": self.users,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> SegmenterState:
        if not data or "recent" not in data:
            # Empty, or kept by the rule-based segmenter before the learned scorer: start afresh
            # on this thread's next message, keeping the clock for the time-gap rule.
            return cls(last_at=(data or {}).get("last_at"), turns=int((data or {}).get("turns", 0)))
        recent = [
            TurnInfo(
                int(r["seq"]),
                str(r["role"]),
                _vector_from(r["v"]),
                int(r["words"]),
                bool(r["q"]),
                # a state kept before a cue was added lacks its bit: the turns in flight then
                # read as without it, once, until they leave the state
                int(r["cues"]),
                r.get("t"),
            )
            for r in data["recent"]
        ]
        return cls(
            data.get("last_at"),
            int(data.get("turns", 0)),
            recent,
            int(data.get("window", 0)),
            # a state kept before these flags reads as a thread with no closing seen yet
            TaskEnds(*(bool(b) for b in data.get("ends", (False, False)))),
            # a state kept before the count: exact where every turn is a user's, as among people;
            # with a bot it can overcount, where the fresh margin is 0
            int(data.get("users", data.get("turns", 0))),
        )


def _folded(text: str) -> str:
    return text.lower().replace("ё", "е")


@lru_cache(maxsize=8)
def _folded_markers(markers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(map(_folded, markers))  # once per configuration, not once a message


def has_marker(text: str, markers: Sequence[str]) -> bool:
    """A marker counts at the start of the message or of a sentence in it. Read as the patterns
    read a message (a phone's "let’s" is "let's"), and with ё as е, which Russian typists drop."""
    lowered = _folded(pattern_text(text))
    for marker in _folded_markers(tuple(markers)):
        idx = lowered.find(marker)
        while idx != -1:
            before = lowered[:idx].rstrip()
            at_word_edge = idx == 0 or not lowered[idx - 1].isalnum()
            after = lowered[idx + len(marker) : idx + len(marker) + 1]
            ends_word = not after or not after.isalnum()
            if at_word_edge and ends_word and (not before or before[-1] in ".!?,;:-—(" or len(before) <= 12):
                return True
            idx = lowered.find(marker, idx + 1)
    return False


def _shifts(
    p_continues: float,
    cut: float,
    final: bool,
    threshold: float,
    left: Sequence[TurnInfo],
    window: Sequence[TurnInfo],
    assist: BoundaryAssist | None,
) -> bool:
    """Whether the topic shifts at `window[0]` now. The scorer's verdict, unless a decision is
    taken now (a shift, or the window's end) that the scorer is unsure of and the assist answers."""
    shift = p_continues < cut
    if assist is None or not (shift or final) or abs(p_continues - threshold) >= assist.band:
        return shift
    answer = assist.new_topic(left, window, p_continues)
    return shift if answer is None else answer


def _bar(
    judge: Scorer,
    cfg: SegmenterConfig,
    left: Sequence[TurnInfo],
    window: Sequence[TurnInfo],
    ends: TaskEnds,
    fresh: bool,
) -> tuple[float, float]:
    """The (threshold, early margin) for this window: the scorer's threshold, or a per-thread one;
    capped by the closed-thread bar where it applies; lowered by the fresh margin while the episode
    holds a single user turn before the candidate (`fresh`)."""
    threshold, margin, fresh_margin = judge.bar(left, window)
    if cfg.shift_threshold is not None:
        threshold = cfg.shift_threshold
    if ends.gates and cfg.closed_thread_bar is not None and not among_people(left, window):
        threshold = min(threshold, cfg.closed_thread_bar)
    return threshold - (fresh_margin if fresh else 0.0), margin


def _closing_stays(cfg: SegmenterConfig, left: Sequence[TurnInfo], turn: TurnInfo) -> bool:
    """A user's closing in a bot's conversation belongs to the task it ends: no candidate for a
    shift (an episode of "Thanks, bye" alone holds nothing to remember)."""
    return cfg.thanks_rules and closes_conversation(turn) and not among_people(left, [turn])


def feed(
    state: SegmenterState,
    turn: SegTurn,
    cfg: SegmenterConfig,
    scorer: Scorer | None = None,
    assist: BoundaryAssist | None = None,
) -> tuple[SegmenterState, list[Boundary]]:
    """Consume one message; return the new state and the boundaries decided now (a shift decided
    after replies or at the next user turn lies at the earlier candidate turn)."""
    judge: Scorer = scorer or shipped_scorer()
    info = TurnInfo.of(turn.seq, turn.role, turn.text, turn.vector)
    # The pair model reads only windows with no assistant in view: an assistant's words are never kept for it.
    if assist is not None or (getattr(judge, "reads_text", False) and turn.role != "assistant"):
        info = replace(info, text=turn.text[:TEXT_CHARS])
    at = turn.at.isoformat()
    user = int(turn.role == "user")
    if state.turns == 0:
        return SegmenterState(at, 1, [info], 0, state.ends.after(info, True), user), []
    gap = state.last_at is not None and (
        (turn.at - datetime.fromisoformat(state.last_at)).total_seconds() > cfg.time_gap_hours * 3600
    )
    hard = (
        "gap"
        if gap
        else "length"
        if state.turns >= cfg.max_episode_turns
        else "marker"
        if turn.role == "user" and has_marker(turn.text, cfg.markers)
        else None
    )
    if hard:
        # A window still open is dropped: the episode restarts here (its candidate still counts).
        ends = state.ends.after(state.recent[-state.window], False) if state.window else state.ends
        return SegmenterState(at, 1, [info], 0, ends.after(info, True), user), [Boundary(turn.seq, hard)]

    recent, window, turns, users = [*state.recent, info], state.window, state.turns + 1, state.users + user
    bounds: list[Boundary] = []
    ends = state.ends
    if window:
        window += 1
        closes = turn.role == "user"
        final = closes or window >= MAX_WINDOW
        left, open_window = recent[:-window][-LEFT_CONTEXT:], recent[-window:]
        p = judge.boundary_probability(left, open_window)
        in_window = sum(t.role == "user" for t in open_window)
        threshold, margin = _bar(judge, cfg, left, open_window, ends, users - in_window == 1)
        cut = threshold - (0.0 if closes else margin)
        if _shifts(1.0 - p, cut, final, threshold, left, open_window, assist):
            bounds.append(Boundary(recent[-window].seq, "shift"))
            ends = ends.after(open_window[0], True)
            turns, window, users = window, 0, in_window
        elif final:
            ends = ends.after(open_window[0], False)
            window = 0
    opened = False
    if turn.role == "user" and not window and (cfg.shift_threshold is None or cfg.shift_threshold > 0):
        left = recent[:-1][-LEFT_CONTEXT:]
        if info.vector is not None and any(t.vector is not None for t in left) and not _closing_stays(cfg, left, info):
            window, opened = 1, True
            p = judge.boundary_probability(left, [info])
            threshold, margin = _bar(judge, cfg, left, [info], ends, users - 1 == 1)
            if _shifts(1.0 - p, threshold - margin, False, threshold, left, [info], assist):
                bounds.append(Boundary(info.seq, "shift"))
                ends = ends.after(info, True)
                turns, window, users = 1, 0, 1
    if turn.role == "user" and not opened:
        # a user turn that is no candidate (no vector, shifts off) counts at once
        ends = ends.after(info, False)
    return SegmenterState(at, turns, recent[-(window + LEFT_CONTEXT) :], window, ends, users), bounds


def segment(
    turns: Iterable[SegTurn],
    cfg: SegmenterConfig,
    state: SegmenterState | None = None,
    scorer: Scorer | None = None,
    assist: BoundaryAssist | None = None,
) -> list[Boundary]:
    """Boundaries over a whole sequence (what the benchmark and tests use)."""
    st = state or SegmenterState()
    out: list[Boundary] = []
    for turn in turns:
        st, bounds = feed(st, turn, cfg, scorer, assist)
        out.extend(bounds)
    return out
