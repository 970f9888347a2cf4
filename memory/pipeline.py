"""Turning a thread's committed events into memory, batch by batch, for the doorbell (live) and
for replay. Embeddings are computed before the write transaction; the write moves the cursor
with the projections; summary and attachment jobs are queued after the commit (the sweeper re-queues any that
are lost in between)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from chatmem.memory.boundary_llm import AssistFactory, for_batch
from chatmem.memory.episodes import (
    Job,
    Plan,
    SummaryPolicy,
    ThreadContext,
    is_erased,
    plan_batch,
    texts_to_embed,
)
from chatmem.memory.ports import Embedder, concrete
from chatmem.memory.segmentation import Scorer, SegmenterConfig, thread_scorer
from chatmem.schemas.records import LoggedEvent, ThreadLease

EnqueueJob = Callable[[str, int, Job], None]
log = logging.getLogger(__name__)


class Projections(Protocol):
    def load_context(self, thread_id: str) -> ThreadContext: ...

    def memory_on_ahead(self, thread_id: str, after_pos: int, watermark_key: str) -> bool: ...

    def deletion_ahead(self, thread_id: str, after_pos: int, watermark_key: str) -> bool: ...

    def deletions_naming(self, thread_id: str, logged: Sequence[tuple[str, int]]) -> list[str]: ...

    def apply(self, plan: Plan, *, lease: ThreadLease | None, advance) -> ThreadLease | None: ...  # noqa: ANN001


def embed_batch(embedder: Embedder, events: Sequence[LoggedEvent]) -> dict:
    texts = texts_to_embed(events)
    if not texts:
        return {}
    vectors = embedder.embed(list(texts.values()))
    return dict(zip(texts.keys(), vectors, strict=True))


class ThreadProcessor:
    def __init__(
        self,
        projections: Projections,
        embedder: Embedder,
        seg_cfg: SegmenterConfig,
        policy: SummaryPolicy,
        enqueue: EnqueueJob,
        advance,
        stream_key: str,
        enqueue_attachment: Callable[[str, int], None] | None = None,
        assist: AssistFactory | None = None,
        renew_lease: Callable[[ThreadLease], None] | None = None,
        scorer: Scorer | None = None,
    ):  # noqa: ANN001
        self.projections = projections
        self.embedder = embedder
        self.seg_cfg = seg_cfg
        self.policy = policy
        self.enqueue = enqueue
        self.advance = advance  # moves the cursor inside the write transaction
        self.stream_key = stream_key
        self.enqueue_attachment = enqueue_attachment
        self.assist = assist  # None (the default): the offline segmenter alone
        self.renew_lease = renew_lease
        self.scorer = scorer  # None: the shipped bag alone, without the pair model

    def _late_for_a_deletion(
        self, thread_id: str, generation: int, batch: Sequence[LoggedEvent], *, queued: bool
    ) -> None:
        """A message (or edit) logged after the deletion that names it, as a producer's spool
        delivered late sends it: the deletion's thread (this one, or the chat this thread is a
        topic of) shreds it again. `queued`: this thread's run is queued already."""
        named = [
            (pid, ev.stream_pos)
            for ev in batch
            if ev.type in ("message", "message_edited")
            and not is_erased(ev.payload)  # shredded already: a paused thread sees it again
            and (pid := ev.payload.get("platform_message_id"))
        ]
        if not named:
            return
        for owner in self.projections.deletions_naming(thread_id, named):
            if not (owner == thread_id and queued):
                # The job names its thread only; the generation is read by summary jobs alone.
                self.enqueue(owner, generation, Job("forget_deleted", "", 0, 0))

    def prefetch(self, batches: Sequence[Sequence[LoggedEvent]]) -> int:
        """Embed the texts of several threads' batches in one call, so that each thread's
        `apply` reads them from the embedder's cache: larger model calls cost less per text."""
        texts = list(dict.fromkeys(t for batch in batches for t in texts_to_embed(batch).values()))
        if texts:
            concrete(self.embedder).embed(texts)
        return len(texts)

    def apply(self, lease: ThreadLease, batch: Sequence[LoggedEvent]) -> ThreadLease:
        ctx = self.projections.load_context(lease.thread_id)
        if not ctx.memory_on:
            if not self.projections.memory_on_ahead(lease.thread_id, lease.cursor_pos, self.stream_key):
                # Paused: events wait in the log (no progress ends the drain). A deletion does not
                # wait: what someone deleted is shredded now, memory on or off, whether the deletion
                # waits here or the message does (delivered late, after its deletion).
                ahead = self.projections.deletion_ahead(lease.thread_id, lease.cursor_pos, self.stream_key)
                if ahead:
                    self.enqueue(lease.thread_id, ctx.generation, Job("forget_deleted", "", 0, 0))
                self._late_for_a_deletion(lease.thread_id, ctx.generation, batch, queued=ahead)
                return lease
            ctx = replace(ctx, memory_on=True)  # catch up, in order, up to and past the memory_on
        embedder = concrete(self.embedder)
        vectors = embed_batch(embedder, batch)
        renew_lease = self.renew_lease
        renew = None if renew_lease is None else lambda: renew_lease(lease)
        assist = for_batch(self.assist, lease.thread_id, renew, lease.lease_s)
        scorer = thread_scorer(self.scorer, lease.thread_id)
        plan = plan_batch(ctx, batch, vectors, self.seg_cfg, self.policy, assist, scorer)
        plan.embed_model = embedder.model
        new_lease = self.projections.apply(plan, lease=lease, advance=self.advance)
        for ack in plan.commands:
            log.info("thread %s: %s %s (%s): %s", lease.thread_id, ack.command, ack.status, ack.event_id, ack.detail)
        for job in plan.jobs:
            self.enqueue(lease.thread_id, ctx.generation, job)
        queued = any(j.kind == "forget_deleted" for j in plan.jobs)
        self._late_for_a_deletion(lease.thread_id, ctx.generation, batch, queued=queued)
        if self.enqueue_attachment is not None:
            for event_id, position, *_ in plan.attachments:
                self.enqueue_attachment(event_id, position)  # keyed: a repeat does nothing
        return new_lease  # type: ignore[return-value]
