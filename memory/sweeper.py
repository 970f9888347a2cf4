"""The sweeper: what a lost message would otherwise leave undone. Run every few seconds by
`chatmem sweeper` or by the `chatmem.sweep` task (for Celery beat); both call `sweep`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from chatmem.memory import sequencer
from chatmem.memory.episodes import Job
from chatmem.memory.ports import Doorbell, ThreadLog

STALE_ATTACHMENT_S = 1800  # well past the longest attachment retry delay


class LostFinals(Protocol):
    def missing_finals(self) -> list[tuple[str, int, Job]]:
        """Closed episodes of active generations with no final summary."""
        ...


class LostAttachments(Protocol):
    def stale_references(self, older_than_s: int) -> list[tuple[str, int]]:
        """Attachments still unprocessed after `older_than_s` seconds."""
        ...


@dataclass(frozen=True)
class SweepResult:
    rung: int
    finals: int
    attachments: int


@dataclass(frozen=True)
class Sweeper:
    threads: ThreadLog
    doorbell: Doorbell
    finals: LostFinals
    attachments: LostAttachments
    queue_depth: Callable[[str], int]
    enqueue_summary: Callable[[str, int, Job], None]
    enqueue_attachment: Callable[[str, int], None]

    def sweep(self) -> SweepResult:
        rung = sequencer.sweep(self.threads, self.doorbell)
        # A final summary is lost only if nothing waits in the summarize queue; re-queueing while
        # a backlog drains would multiply the backlog. Jobs are keyed: a duplicate does nothing.
        finals = self.finals.missing_finals() if self.queue_depth("summarize") == 0 else []
        for thread_id, generation, job in finals:
            self.enqueue_summary(thread_id, generation, job)
        stale = self.attachments.stale_references(STALE_ATTACHMENT_S) if self.queue_depth("attachments") == 0 else []
        for event_id, position in stale:
            self.enqueue_attachment(event_id, position)
        return SweepResult(rung, len(finals), len(stale))
