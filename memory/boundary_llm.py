"""LLM-assisted topic boundaries (opt-in: `segment_llm_assist`, with an LLM endpoint configured).

The segmenter (memory/segmentation.py) asks this assist only about decisions its scorer is unsure
of, at the moment it decides anyway. The question is Def-DTS style (memory/prompts.py
`topic_shift`): the turns before the candidate, the candidate and the turns after it seen so far;
the model sums up both sides, labels each turn's intent and topic, then says whether the
candidate starts a new topic. The call goes through the LLM port, which the composition root
backs with the output cache, so a replay gets the same answers without asking again.

A failed question (after the client's own retries) leaves the scorer's decision, and for
`FAILURE_COOLDOWN_S` after it no question is asked: a down or stalled endpoint then costs one
question's wait, not one per uncertain boundary of a batch held under the thread's lease."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chatmem.memory.boundary_scorer import TurnInfo
from chatmem.memory.ports import LLM, LLMRefused, TransientError
from chatmem.memory.prompts import Line, TopicShift, topic_shift
from chatmem.memory.segmentation import BoundaryAssist

log = logging.getLogger(__name__)

FAILURE_COOLDOWN_S = 60.0


class Cooldown:
    """Shared by a process's assists: after a failure, no question for `seconds`."""

    def __init__(self, seconds: float = FAILURE_COOLDOWN_S, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.until = float("-inf")

    def active(self) -> bool:
        return self.clock() < self.until

    def start(self) -> None:
        self.until = self.clock() + self.seconds


@dataclass
class AssistCounts:
    """What the assist did (the benchmark prints it; logs say it per question)."""

    asked: int = 0
    new_topic: int = 0
    same_topic: int = 0
    failed: int = 0
    skipped: int = 0  # not asked: cooling down after a failure, or a turn without its text


def _reason(error: Exception) -> str:
    """The failure's kind and status, never its text: an endpoint's error body may echo the request
    (the conversation) or part of the key."""
    cause = error.__cause__
    status = getattr(cause, "status_code", None)
    return " ".join(
        [type(error).__name__, *([type(cause).__name__] if cause else []), *([f"HTTP {status}"] if status else [])]
    )


def _line(t: TurnInfo) -> Line:
    return Line(seq=t.seq, role=t.role, text=t.text or "")


class LLMBoundaryAssist:
    def __init__(self, llm: LLM, band: float, cooldown: Cooldown, counts: AssistCounts | None = None):
        self.llm = llm
        self.band = band
        self.cooldown = cooldown
        self.counts = counts or AssistCounts()

    def new_topic(self, before: Sequence[TurnInfo], window: Sequence[TurnInfo], p_continues: float) -> bool | None:
        # Turns kept before the assist was switched on carry no text: the scorer decides those.
        if any(t.text is None for t in window) or self.cooldown.active():
            self.counts.skipped += 1
            return None
        prompt = topic_shift([_line(t) for t in before if t.text is not None], [_line(t) for t in window])
        self.counts.asked += 1
        try:
            answer = self.llm.complete(prompt, TopicShift)
        except (TransientError, LLMRefused) as error:
            self.counts.failed += 1
            self.cooldown.start()
            log.warning(
                "topic shift at message %d: the model failed, the scorer decides (and alone for %.0f s): %s",
                window[0].seq,
                self.cooldown.seconds,
                _reason(error),
            )
            return None
        if answer.new_topic:
            self.counts.new_topic += 1
        else:
            self.counts.same_topic += 1
        log.debug(
            "topic shift at message %d: P(continues) %.2f, the model says %s",
            window[0].seq,
            p_continues,
            "new topic" if answer.new_topic else "same topic",
        )
        return answer.new_topic


class KeepingLease:
    """An assist that keeps the thread's lease while it waits for answers: a batch with many
    uncertain boundaries may take longer than the lease, and another worker must not take the
    thread meanwhile. `renew` raises LeaseLost when the lease is gone (the batch is then dropped)."""

    def __init__(
        self,
        inner: BoundaryAssist,
        renew: Callable[[], None],
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.inner = inner
        self.renew = renew
        self.every_s = every_s
        self.clock = clock
        self.renewed = clock()

    @property
    def band(self) -> float:
        return self.inner.band

    def new_topic(self, before: Sequence[TurnInfo], window: Sequence[TurnInfo], p_continues: float) -> bool | None:
        if self.clock() - self.renewed >= self.every_s:
            self.renew()
            self.renewed = self.clock()
        return self.inner.new_topic(before, window, p_continues)


# thread_id -> the assist for that thread's batches (its LLM outputs are tagged with the thread)
AssistFactory = Callable[[str], BoundaryAssist]


def for_batch(
    factory: AssistFactory | None, thread_id: str, renew: Callable[[], None] | None, lease_s: float
) -> BoundaryAssist | None:
    """The assist for one batch of a thread held under a lease of `lease_s`, renewed every
    quarter of it while questions are asked (settings keep one question within a sixth)."""
    if factory is None:
        return None
    assist = factory(thread_id)
    return assist if renew is None else KeepingLease(assist, renew, lease_s / 4)
