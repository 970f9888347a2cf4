"""Celery tasks: each validates its payload and calls one handler. Nothing else lives here."""

from __future__ import annotations

import os

from celery import Task, shared_task
from celery.signals import worker_process_init

from adapters.bootstrap import TRANSIENT_ERRORS, Container, process_name
from memory import sequencer
from memory.episodes import Job
from memory.fact_jobs import write_episode_facts
from memory.summaries import run_job
from schemas.events import InvalidEvent, validate_identifier
from workers.celery_app import enqueue_episode_facts

# Only failures that a later attempt can fix are retried; a bad payload fails at once.
RETRY = {"autoretry_for": TRANSIENT_ERRORS, "retry_backoff": 2, "retry_backoff_max": 120, "retry_jitter": True}

_containers: dict[int, Container] = {}


@worker_process_init.connect
def _preload_model(**_: object) -> None:
    """Load the embedding model when a pool process starts, not on its first message."""
    from celery import current_app

    if current_app.conf.get("chatmem_preload_model"):
        c = Container(current_app.conf.chatmem_settings, start_services=False)
        _containers[os.getpid()] = c
        c.embedder.inner.embed(["warm up"])
        if current_app.conf.get("chatmem_preload_mem0"):
            c.mem0  # noqa: B018 - importing and configuring mem0 takes seconds: not on the first fact
        if current_app.conf.get("chatmem_preload_ocr"):
            c.ocr.engine  # noqa: B018 - the OCR models load in about a second


def container(task: Task) -> Container:
    # Keyed by pid: a forked pool child must not reuse its parent's connections.
    pid = os.getpid()
    if pid not in _containers:
        _containers[pid] = Container(task.app.conf.chatmem_settings, start_services=False)
    return _containers[pid]


@shared_task(name="chatmem.advance_thread", bind=True, **RETRY)
def advance_thread(self: Task, thread_id: str) -> dict:
    try:
        thread_id = validate_identifier(thread_id)
    except InvalidEvent as error:
        raise ValueError(f"advance_thread: {error.reason}") from None
    c = container(self)
    result = sequencer.advance_thread(
        c.thread_log,
        c.doorbell,
        thread_id,
        owner=process_name("worker"),
        lease_s=c.settings.thread_lease_s,
        batch_size=c.settings.apply_batch_size,
        apply=c.processor.apply,
    )
    if result.busy:
        # Another worker holds the thread; look again shortly in case it finished just before
        # the events that rang this bell became visible to it.
        self.apply_async(args=[thread_id], countdown=1)
    return {"thread_id": thread_id, "applied": result.applied, "busy": result.busy}


@shared_task(name="chatmem.summarize", bind=True, **RETRY)
def summarize(
    self: Task, thread_id: str, generation: int, kind: str, episode_id: str, from_seq: int, upto_seq: int
) -> dict:
    thread_id = _checked(thread_id)
    if kind not in ("running", "chunk", "final"):
        raise ValueError(f"summarize: unknown kind {kind!r}")
    c = container(self)
    # The last attempt degrades to the offline LLM rather than leave the episode unsummarised.
    last_try = self.request.retries >= max(0, (self.max_retries or 0) - 1)
    llm = c.llm("summarize", offline=last_try and bool(c.settings.llm_api_key))
    job = Job(kind, episode_id, int(from_seq), int(upto_seq))
    outcome = run_job(
        c.projections, llm, job, thread_id, int(generation), fanin=c.settings.rollup_fanin, keep=c.settings.rollup_keep
    )
    c.projections.embed_summaries(thread_id, c.embedder)
    if kind == "final" and outcome in ("saved", "duplicate"):
        enqueue_episode_facts(c.celery, thread_id, int(generation), episode_id)  # keyed: a repeat is a no-op
    return {"episode_id": episode_id, "kind": kind, "upto_seq": upto_seq, "outcome": outcome}


@shared_task(name="chatmem.episode_facts", bind=True, **RETRY)
def episode_facts(self: Task, thread_id: str, generation: int, episode_id: str) -> dict:
    thread_id = _checked(thread_id)
    c = container(self)
    return write_episode_facts(
        c.fact_store,
        c.mem0,
        c.llm("facts"),
        thread_id=thread_id,
        generation=int(generation),
        episode_id=str(episode_id),
    )


@shared_task(name="chatmem.fact_command", bind=True, **RETRY)
def fact_command(self: Task, thread_id: str, generation: int, event_id: str) -> dict:
    thread_id = _checked(thread_id)
    return {"detail": apply_fact_command(container(self), thread_id, int(generation), str(event_id))}


def run_job_inline(c: Container, llm, thread_id: str, generation: int, job: Job) -> None:  # noqa: ANN001
    """What the summarize and facts tasks do, synchronously (replay runs jobs this way)."""
    if job.kind in ("remember", "forget"):
        apply_fact_command(c, thread_id, generation, job.event_id or "")
        return
    outcome = run_job(
        c.projections, llm, job, thread_id, generation, fanin=c.settings.rollup_fanin, keep=c.settings.rollup_keep
    )
    c.projections.embed_summaries(thread_id, c.embedder)
    if job.kind == "final" and outcome in ("saved", "duplicate"):
        write_episode_facts(
            c.fact_store, c.mem0, llm, thread_id=thread_id, generation=generation, episode_id=job.episode_id
        )


def replay(c: Container, thread_id: str, llm, owner: str):  # noqa: ANN001, ANN201
    """Rebuild one thread (see memory/replay.py), facts included, and retire what the old
    generation derived that the rebuild did not, in Postgres and in mem0."""
    from memory.replay import replay_thread

    def after_switch(generation: int) -> None:
        for _, mem0_id in c.fact_store.archive_rebuilt(thread_id, generation):
            if mem0_id:
                c.mem0.delete(mem0_id)

    s = c.settings
    return replay_thread(
        thread_id,
        threads=c.thread_log,
        projections=c.projections,
        embedder=c.embedder,
        run=lambda job, generation: run_job_inline(c, llm, thread_id, generation, job),
        seg_cfg=c.seg_config,
        policy=c.summary_policy,
        owner=owner,
        lease_s=s.thread_lease_s,
        batch_size=s.apply_batch_size,
        after_switch=after_switch,
    )


def apply_fact_command(c: Container, thread_id: str, generation: int, event_id: str) -> str:
    from memory import fact_jobs

    cmd = c.fact_store.command_event(event_id)
    if cmd is None or cmd["thread_id"] != thread_id or cmd["command"] not in ("remember", "forget"):
        raise ValueError(f"fact_command: no remember/forget event {event_id!r} in thread {thread_id!r}")
    handler = fact_jobs.remember if cmd["command"] == "remember" else fact_jobs.forget
    text = str((cmd["args"] or {}).get("text", ""))
    return handler(
        c.fact_store,
        c.mem0,
        thread_id=thread_id,
        generation=generation,
        event_id=event_id,
        user_id=cmd["user_id"],
        text=text,
    )


def _checked(thread_id: str) -> str:
    try:
        return validate_identifier(thread_id)
    except InvalidEvent as error:
        raise ValueError(error.reason) from None


@shared_task(name="chatmem.process_attachment", bind=True, acks_late=True)
def process_attachment(self: Task, event_id: str, position: int) -> dict:
    if not isinstance(event_id, str) or not event_id or not isinstance(position, int) or position < 0:
        raise ValueError(f"process_attachment: bad arguments {event_id!r}, {position!r}")
    c = container(self)
    s = c.settings
    last = self.request.retries >= s.attachment_max_retries
    try:
        outcome = c.attachment_job(offline=last)(event_id, position, last_attempt=last)
    except TRANSIENT_ERRORS as error:
        delay = min(600.0, s.attachment_retry_backoff_s * 2**self.request.retries)
        raise self.retry(exc=error, countdown=delay, max_retries=s.attachment_max_retries) from None
    return {"event_id": event_id, "position": position, "outcome": outcome}


@shared_task(name="chatmem.sweep", bind=True, **RETRY)
def sweep(self: Task) -> dict:
    c = container(self)
    return {"rung": sequencer.sweep(c.thread_log, c.doorbell)}
