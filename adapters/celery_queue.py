"""The enqueue side of Celery: the app built from settings (never at import time), the task
names and routes, and the calls that put work on a queue. The tasks themselves live in
workers/tasks.py; the composition root tells Celery to load them."""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery
from kombu.exceptions import ChannelError

from chatmem.memory.episodes import Job
from chatmem.schemas.queues import PROFILES, VISIBILITY_TIMEOUT_S, Queue
from chatmem.schemas.settings import Settings

ADVANCE_THREAD = "chatmem.advance_thread"
ADVANCE_THREADS = "chatmem.advance_threads"
SUMMARIZE = "chatmem.summarize"
EPISODE_FACTS = "chatmem.episode_facts"
FACT_COMMAND = "chatmem.fact_command"
SWEEP = "chatmem.sweep"
PROCESS_ATTACHMENT = "chatmem.process_attachment"
FORGET_ME = "chatmem.forget_me"
FORGET_DELETED = "chatmem.forget_deleted"
RETENTION = "chatmem.retention"

TASK_QUEUES: dict[str, Queue] = {
    ADVANCE_THREAD: Queue.SEGMENT,
    ADVANCE_THREADS: Queue.SEGMENT,
    SUMMARIZE: Queue.SUMMARIZE,
    EPISODE_FACTS: Queue.FACTS,
    FACT_COMMAND: Queue.FACTS,
    SWEEP: Queue.MAINTENANCE,
    PROCESS_ATTACHMENT: Queue.ATTACHMENTS,
    FORGET_ME: Queue.MAINTENANCE,
    FORGET_DELETED: Queue.MAINTENANCE,
    RETENTION: Queue.MAINTENANCE,
}


def create_celery(settings: Settings, broker_url: str, include: Sequence[str] = ()) -> Celery:
    app = Celery("chatmem", broker=broker_url, include=list(include))
    annotations = {
        name: {
            "soft_time_limit": PROFILES[queue].soft_time_limit_s,
            "time_limit": PROFILES[queue].time_limit_s,
            "max_retries": settings.task_max_retries,
        }
        for name, queue in TASK_QUEUES.items()
    }
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        # A pool process loads the embedding model as it starts (worker_process_init): on a busy
        # machine that outlasts Celery's 4 s default, and a replaced child would be killed and
        # replaced forever after a crash.
        worker_proc_alive_timeout=120,
        task_default_queue=Queue.MAINTENANCE.value,
        task_routes={name: {"queue": queue.value} for name, queue in TASK_QUEUES.items()},
        task_annotations=annotations,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=True,
        task_send_sent_event=False,
        enable_utc=True,
    )
    app.conf.chatmem_settings = settings
    return app


# A pool process on its way out waits until the main process has read its last result: billiard
# polls 300 times at 0.1 s. At a warm shutdown the main process has already stopped reading, so a
# task that ended just then held the whole stop for 30 s, and `chatmem up` killed the worker at
# 20 s (the fault matrix caught it on 2-3 stops of 15). While a worker runs, the main process reads
# a result within milliseconds; a result left unread at a stop leaves its task unacknowledged, to
# be delivered again, and every task is idempotent. So 3 s.
POOL_EXIT_WAIT_POLLS = 30
_POOL_EXIT_WAIT = "GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT"  # billiard.pool's (billiard pinned)


def bound_pool_exit_wait(polls: int = POOL_EXIT_WAIT_POLLS) -> None:
    """Shorten the wait of billiard's exiting pool processes; call before the pool forks."""
    import billiard.pool

    if not hasattr(billiard.pool, _POOL_EXIT_WAIT):
        raise RuntimeError(f"billiard.pool has no {_POOL_EXIT_WAIT}: check the pinned billiard release")
    setattr(billiard.pool, _POOL_EXIT_WAIT, polls)


# On the Redis broker a lower number is served first; live doorbells keep the default (0), so a
# worker takes every waiting live doorbell before the next bulk one.
BULK_PRIORITY = 9


def ring_thread(app: Celery, thread_id: str, bulk: bool = False, countdown: float | None = None) -> None:
    if bulk:
        app.send_task(ADVANCE_THREAD, args=[thread_id, True], countdown=countdown, priority=BULK_PRIORITY)
    else:
        app.send_task(ADVANCE_THREAD, args=[thread_id], countdown=countdown)


def ring_threads(app: Celery, thread_ids: Sequence[str]) -> None:
    """Several live threads for one doorbell task; one thread keeps the task of its own."""
    if len(thread_ids) == 1:
        app.send_task(ADVANCE_THREAD, args=[thread_ids[0]])
    else:
        app.send_task(ADVANCE_THREADS, args=[list(thread_ids)])


def enqueue_summary(app: Celery, thread_id: str, generation: int, job: Job) -> None:
    """Queue a planned job: summaries on `summarize`, remember / forget on `facts`, an erasure
    (forget_me) and the shredding of deleted messages (forget_deleted) on `maintenance`."""
    if job.kind in ("remember", "forget"):
        app.send_task(FACT_COMMAND, args=[thread_id, generation, job.event_id])
    elif job.kind == "forget_me":
        app.send_task(FORGET_ME, args=[thread_id, job.event_id])
    elif job.kind == "forget_deleted":
        app.send_task(FORGET_DELETED, args=[thread_id])
    else:
        app.send_task(SUMMARIZE, args=[thread_id, generation, job.kind, job.episode_id, job.from_seq, job.upto_seq])


def enqueue_retention(app: Celery) -> None:
    app.send_task(RETENTION)


def enqueue_episode_facts(app: Celery, thread_id: str, generation: int, episode_id: str) -> None:
    app.send_task(EPISODE_FACTS, args=[thread_id, generation, episode_id])


def enqueue_attachment(app: Celery, event_id: str, position: int) -> None:
    app.send_task(PROCESS_ATTACHMENT, args=[event_id, position])


def queue_depths(app: Celery) -> dict[str, int]:
    """Messages waiting in each queue of the catalogue."""
    depths = {}
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        for queue in Queue:
            try:
                depths[queue.value] = channel.queue_declare(queue=queue.value, passive=True).message_count
            except ChannelError:  # Redis keeps no key for an empty queue
                depths[queue.value] = 0
    return depths
