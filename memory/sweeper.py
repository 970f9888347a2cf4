"""The sweeper: what a lost message would otherwise leave undone. Run every few seconds by
`chatmem sweeper` or by the `chatmem.sweep` task (for Celery beat); both call `sweep`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from chatmem.memory import sequencer
from chatmem.memory.episodes import Job
from chatmem.memory.ports import Doorbell, ThreadLog

STALE_ATTACHMENT_S = 1800  # well past the longest retry delay of an attachment or facts job


class LostFinals(Protocol):
    def missing_finals(self) -> list[tuple[str, int, Job]]:
        """Closed episodes of active generations with no final summary."""
        ...


class LostFacts(Protocol):
    def missing_facts(self, older_than_s: float) -> list[tuple[str, int, str]]:
        """Closed episodes of active generations whose final summary is older than `older_than_s`
        seconds and whose facts job never finished: (thread, generation, episode)."""
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
    facts: int = 0


@dataclass(frozen=True)
class Sweeper:
    threads: ThreadLog
    doorbell: Doorbell
    finals: LostFinals
    attachments: LostAttachments
    facts: LostFacts
    queue_depth: Callable[[str], int]
    enqueue_summary: Callable[[str, int, Job], None]
    enqueue_attachment: Callable[[str, int], None]
    enqueue_facts: Callable[[str, int, str], None]
    # A facts job not finished this long after its episode's final summary was saved is taken for
    # lost (its worker was killed holding it unacknowledged); longer than a job with all its retries.
    facts_after_s: float = float(STALE_ATTACHMENT_S)
    # A missing final summary is taken for lost only once it has been missing this long: one
    # being written has left the queue, so an empty queue alone does not tell it from a lost one,
    # and queueing it again would run its LLM call twice (and hand its facts job on twice).
    finals_after_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    _missing_since: dict[tuple[str, int, str], float] = field(default_factory=dict, repr=False, compare=False)

    def sweep(self) -> SweepResult:
        rung = sequencer.sweep(self.threads, self.doorbell)
        # A final summary is lost only if nothing waits in the summarize queue; re-queueing while
        # a backlog drains would multiply the backlog. Jobs are keyed: a duplicate does nothing.
        finals = self._overdue(self.finals.missing_finals()) if self.queue_depth("summarize") == 0 else []
        for thread_id, generation, job in finals:
            self.enqueue_summary(thread_id, generation, job)
        stale = self.attachments.stale_references(STALE_ATTACHMENT_S) if self.queue_depth("attachments") == 0 else []
        for event_id, position in stale:
            self.enqueue_attachment(event_id, position)
        # The same rule for facts jobs; the ledger makes a repeat of a finished one do nothing.
        facts = self.facts.missing_facts(self.facts_after_s) if self.queue_depth("facts") == 0 else []
        for thread_id, generation, episode_id in facts:
            self.enqueue_facts(thread_id, generation, episode_id)
        return SweepResult(rung, len(finals), len(stale), len(facts))

    def _overdue(self, missing: list[tuple[str, int, Job]]) -> list[tuple[str, int, Job]]:
        """The missing finals first seen missing at least `finals_after_s` ago; one queued again
        gets as long again before the next time."""
        now = self.clock()
        since = self._missing_since
        keys = {(t, g, job.episode_id) for t, g, job in missing}
        for gone in since.keys() - keys:
            del since[gone]  # written meanwhile
        due = []
        for thread_id, generation, job in missing:
            key = (thread_id, generation, job.episode_id)
            if now - since.setdefault(key, now) >= self.finals_after_s:
                due.append((thread_id, generation, job))
                since[key] = now
        return due
