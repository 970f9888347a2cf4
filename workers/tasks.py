"""Celery tasks: each validates its payload and calls one job function (memory/jobs.py,
memory/sequencer.py, memory/sweeper.py). Nothing else lives here. The composition root puts a
factory for the wiring on the app (`chatmem_wiring`); each worker process builds its own."""

from __future__ import annotations

import inspect
import os
import time
from contextlib import ExitStack
from typing import Any, Protocol

from celery import Task, shared_task
from celery.signals import task_postrun, task_prerun, worker_process_init

from chatmem.adapters.celery_queue import BULK_PRIORITY, enqueue_episode_facts
from chatmem.adapters.embedding_state_pg import EmbeddingState
from chatmem.adapters.errors import TRANSIENT_ERRORS
from chatmem.adapters.logs import IDS, log_context
from chatmem.adapters.metrics import instruments, record_sweep
from chatmem.adapters.procs import process_name
from chatmem.memory import sequencer
from chatmem.memory.attachments import AttachmentJob
from chatmem.memory.attachments.ports import AttachmentStore
from chatmem.memory.episodes import Job
from chatmem.memory.jobs import Jobs
from chatmem.memory.pipeline import ThreadProcessor
from chatmem.memory.ports import LLM, Doorbell, ThreadLog
from chatmem.memory.sweeper import Sweeper
from chatmem.schemas.events import InvalidEvent, validate_identifier
from chatmem.schemas.records import LoggedEvent
from chatmem.schemas.settings import Settings

# Only failures that a later attempt can fix are retried; a bad payload fails at once.
RETRY = {"autoretry_for": TRANSIENT_ERRORS, "retry_backoff": 2, "retry_backoff_max": 120, "retry_jitter": True}


class Wiring(Protocol):
    """What the tasks use; the composition root's Container provides it."""

    @property
    def settings(self) -> Settings: ...
    @property
    def thread_log(self) -> ThreadLog: ...
    @property
    def doorbell(self) -> Doorbell: ...
    @property
    def processor(self) -> ThreadProcessor: ...
    @property
    def jobs(self) -> Jobs: ...
    @property
    def sweeper(self) -> Sweeper: ...
    @property
    def celery(self) -> Any: ...  # the Celery app, for what a task queues next
    @property
    def attachment_store(self) -> AttachmentStore: ...

    def llm(self, queue: str, *, refresh: bool = False, offline: bool = False, thread_id: str | None = None) -> LLM: ...

    def attachment_job(self, *, offline: bool = False) -> AttachmentJob: ...

    @property
    def embedding_state(self) -> EmbeddingState: ...

    def erasure_subject(self, thread_id: str, event_id: str) -> str | None: ...

    def apply_failed(self, thread_id: str, event: LoggedEvent, error: Exception) -> None: ...

    def apply_retention(self) -> dict[str, int]: ...

    def forget_deleted(self, thread_id: str) -> dict[str, int]: ...

    def erase(
        self, *, user_id: str | None = None, thread_id: str | None = None, requested_by: str = "cli"
    ) -> dict[str, int]: ...


_wirings: dict[int, Wiring] = {}


def wiring(task: Task) -> Wiring:
    # Keyed by pid: a forked pool child must not reuse its parent's connections.
    pid = os.getpid()
    if pid not in _wirings:
        _wirings[pid] = task.app.conf.chatmem_wiring()
    return _wirings[pid]


@worker_process_init.connect
def _preload_model(**_: object) -> None:
    """Load the embedding model when a pool process starts, not on its first message."""
    from celery import current_app

    conf = current_app.conf
    if conf.get("chatmem_preload_model") and conf.get("chatmem_wiring"):
        c = conf.chatmem_wiring()
        _wirings[os.getpid()] = c
        c.embedder.inner.embed(["warm up"])
        encoder = c.boundary_scorer.encoder if conf.get("chatmem_preload_segmenter") else None
        if encoder is not None:
            encoder.logit("warm up", "warm up")  # the pair model's file: most of a second to load
        if conf.get("chatmem_preload_mem0"):
            c.mem0  # noqa: B018 - importing and configuring mem0 takes seconds: not on the first fact
        if conf.get("chatmem_preload_ocr"):
            # OCR and document reading run in a helper process: start it (and load its models)
            # now, outside any job's time limit.
            c.analysis_reader.start()


# Per attempt: when it started and the log context of its ids, keyed by task id.
_attempts: dict[str, tuple[float, ExitStack]] = {}


@task_prerun.connect
def _attempt_started(task_id: str, task: Task, args: tuple, kwargs: dict, **_: object) -> None:
    """Every log line of the attempt carries the ids in its payload (thread, episode, event)."""
    try:
        given = inspect.signature(task.run).bind_partial(*args, **kwargs).arguments
    except TypeError:  # a malformed payload: the task itself says what is wrong
        given = {}
    ids = {k: str(v) for k, v in given.items() if k in IDS and v is not None}
    stack = ExitStack()
    stack.enter_context(log_context(**ids))
    _attempts[task_id] = (time.perf_counter(), stack)


@task_postrun.connect
def _attempt_finished(task_id: str, task: Task, state: str | None = None, **_: object) -> None:
    started, stack = _attempts.pop(task_id, (None, None))
    if stack is not None:
        stack.close()
    name = task.name.removeprefix("chatmem.")
    m = instruments()
    if started is not None:
        m.task_duration.labels(name).observe(time.perf_counter() - started)
    if state == "FAILURE":
        m.task_failures.labels(name).inc()
    elif state == "RETRY":
        m.task_retries.labels(name).inc()


def _pass_args(c: Wiring) -> dict[str, Any]:
    """What every doorbell pass is given: this worker's name, the lease and batch sizes, the processor."""
    return {
        "owner": process_name("worker"),
        "lease_s": c.settings.thread_lease_s,
        "batch_size": c.settings.apply_batch_size,
        "apply": c.processor.apply,
        # An outage is retried with backoff; any other error is noted where it stopped the thread.
        "transient": TRANSIENT_ERRORS,
        "on_failure": c.apply_failed,
    }


@shared_task(name="chatmem.advance_thread", bind=True, **RETRY)
def advance_thread(self: Task, thread_id: str, bulk: bool = False) -> dict:
    thread_id = _checked(thread_id, "advance_thread")
    c = wiring(self)
    max_batches = c.settings.bulk_batches_per_task if bulk else None
    result = sequencer.advance_thread(c.thread_log, c.doorbell, thread_id, **_pass_args(c), max_batches=max_batches)
    if result.busy and c.embedding_state.paused():
        pass  # a re-embedding holds every thread: the sweeper rings the lagging ones once it is done
    elif result.busy:
        # Another worker holds the thread; look again shortly in case it finished just before
        # the events that rang this bell became visible to it.
        self.apply_async(args=[thread_id, bulk], countdown=1, priority=BULK_PRIORITY if bulk else None)
    elif result.more:
        c.doorbell.ring([thread_id])  # back of the bulk line: live doorbells go first
    return {"thread_id": thread_id, "applied": result.applied, "busy": result.busy, "more": result.more}


@shared_task(name="chatmem.advance_threads", bind=True, **RETRY)
def advance_threads(self: Task, thread_ids: list[str]) -> dict:
    """Live threads rung together: their new messages embedded in one call, then a batch of each applied."""
    if not isinstance(thread_ids, list):
        raise ValueError(f"advance_threads: thread_ids must be a list, got {type(thread_ids).__name__}")
    ids = [_checked(t, "advance_threads") for t in thread_ids]
    c = wiring(self)
    results = sequencer.advance_threads(c.thread_log, c.doorbell, ids, **_pass_args(c), prefetch=c.processor.prefetch)
    paused = c.embedding_state.paused()
    for result in results:
        if result.busy and not paused:  # as advance_thread: look again shortly, on its own
            advance_thread.apply_async(args=[result.thread_id], countdown=1)
    c.doorbell.ring([r.thread_id for r in results if r.more])  # a backlog: another turn each
    return {
        "threads": len(results),
        "applied": sum(r.applied for r in results),
        "busy": [r.thread_id for r in results if r.busy],
        "more": [r.thread_id for r in results if r.more],
    }


@shared_task(name="chatmem.summarize", bind=True, **RETRY)
def summarize(
    self: Task, thread_id: str, generation: int, kind: str, episode_id: str, from_seq: int, upto_seq: int
) -> dict:
    thread_id = _checked(thread_id)
    if kind not in ("running", "chunk", "final"):
        raise ValueError(f"summarize: unknown kind {kind!r}")
    c = wiring(self)
    # The last attempt degrades to the offline LLM rather than leave the episode unsummarised.
    last_try = self.request.retries >= max(0, (self.max_retries or 0) - 1)
    llm = c.llm("summarize", offline=last_try and bool(c.settings.llm_api_key), thread_id=thread_id)
    app = c.celery
    outcome = c.jobs.summarize(
        llm,
        thread_id,
        int(generation),
        Job(kind, episode_id, int(from_seq), int(upto_seq)),
        facts_next=lambda t, g, e: enqueue_episode_facts(app, t, g, e),
    )
    return {"episode_id": episode_id, "kind": kind, "upto_seq": upto_seq, "outcome": outcome}


@shared_task(name="chatmem.episode_facts", bind=True, **RETRY)
def episode_facts(self: Task, thread_id: str, generation: int, episode_id: str) -> dict:
    c = wiring(self)
    thread_id = _checked(thread_id)
    return c.jobs.episode_facts(c.llm("facts", thread_id=thread_id), thread_id, int(generation), str(episode_id))


@shared_task(name="chatmem.fact_command", bind=True, **RETRY)
def fact_command(self: Task, thread_id: str, generation: int, event_id: str) -> dict:
    return {"detail": wiring(self).jobs.fact_command(_checked(thread_id), int(generation), str(event_id))}


@shared_task(name="chatmem.forget_me", bind=True, **RETRY)
def forget_me(self: Task, thread_id: str, event_id: str) -> dict:
    """A forget_me command: erase its sender, as `chatmem erase --user` does."""
    c = wiring(self)
    user_id = c.erasure_subject(_checked(thread_id), str(event_id))
    if user_id is None:
        return {"erased": None}
    return {"erased": user_id, "removed": c.erase(user_id=user_id, requested_by=f"command:{event_id}")}


@shared_task(name="chatmem.forget_deleted", bind=True, **RETRY)
def forget_deleted(self: Task, thread_id: str) -> dict:
    """Messages deleted on the platform: shred them and rebuild the thread without them. One run
    covers every deletion logged in the thread so far, so a burst of deletions costs one rebuild
    and the runs after it find nothing left to do."""
    return wiring(self).forget_deleted(_checked(thread_id))


@shared_task(name="chatmem.retention", bind=True, **RETRY)
def retention(self: Task) -> dict:
    """Shred events past their retention and rebuild their threads (queued by the sweeper)."""
    return wiring(self).apply_retention()


@shared_task(name="chatmem.process_attachment", bind=True, acks_late=True)
def process_attachment(self: Task, event_id: str, position: int) -> dict:
    if not isinstance(event_id, str) or not event_id or not isinstance(position, int) or position < 0:
        raise ValueError(f"process_attachment: bad arguments {event_id!r}, {position!r}")
    c = wiring(self)
    s = c.settings
    last = self.request.retries >= s.attachment_max_retries
    try:
        outcome = c.attachment_job(offline=last)(event_id, position, last_attempt=last)
    except TRANSIENT_ERRORS as error:
        delay = min(600.0, s.attachment_retry_backoff_s * 2**self.request.retries)
        raise self.retry(exc=error, countdown=delay, max_retries=s.attachment_max_retries) from None
    _count_attachment(c, event_id, position, outcome)
    return {"event_id": event_id, "position": position, "outcome": outcome}


# The job's outcome in a word -> the status label; "claimed elsewhere" is counted by the claimant.
_ATTACHMENT_STATUS = {"done": "done", "failed": "failed", "artifact done": "reused", "artifact failed": "failed"}


def _count_attachment(c: Wiring, event_id: str, position: int, outcome: str) -> None:
    status = _ATTACHMENT_STATUS.get(outcome)
    if status is None:
        return
    ref = c.attachment_store.reference(event_id, position)
    kind = (ref.kind or ref.attachment.get("kind")) if ref is not None else None
    instruments().attachments.labels(str(kind or "unknown"), status).inc()


@shared_task(name="chatmem.sweep", bind=True, **RETRY)
def sweep(self: Task) -> dict:
    """What `chatmem sweeper` does once; for a Celery beat schedule instead of that loop."""
    result = wiring(self).sweeper.sweep()
    record_sweep(result.rung, result.finals, result.attachments, result.facts)
    return {"rung": result.rung, "finals": result.finals, "attachments": result.attachments, "facts": result.facts}


def _checked(thread_id: str, task: str = "") -> str:
    try:
        return validate_identifier(thread_id)
    except InvalidEvent as error:
        raise ValueError(f"{task}: {error.reason}" if task else error.reason) from None
