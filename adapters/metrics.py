"""Prometheus metrics: every metric chatmem exports is defined here (docs/operations.md lists them).

Two kinds:
- Recorded in the process that does the work (task durations, LLM calls, embedding time, ...):
  counters and histograms in `instruments()`. With a multiprocess folder set
  (`use_multiprocess_dir`), each process writes them to its own file there and whoever serves
  /metrics adds the files up, so Celery's forked pool processes count too.
- Shared state (events ingested, dead letters, stream pending, queue depths, thread lag, the
  publish spool on this host and its refusals): read from Postgres, Redis and the spool folder
  when scraped (`SharedStateCollector`), by the API only. They are the
  same queries as `chatmem status`, so the two always agree, whichever process did the work.

Only bounded labels: task names, queues, models, kinds. Never a thread, user or text."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds: from a cached doorbell drain to a long summary or an OCR'd PDF.
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
READ_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Events behind, per thread.
LAG_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000)


@dataclass(frozen=True)
class Instruments:
    task_duration: Histogram
    task_failures: Counter
    task_retries: Counter
    llm_calls: Counter
    llm_tokens: Counter
    embed_seconds: Histogram
    attachments: Counter
    context_seconds: Histogram
    recall_seconds: Histogram
    ingest_batch_seconds: Histogram
    sweeper_requeued: Counter
    apply_failures: Counter


# functools.cache may run the builder twice when two threads ask first (replay rebuilds two
# threads at once), and a second Histogram of the same name is refused by the registry.
_BUILD_LOCK = threading.Lock()


def instruments() -> Instruments:
    """Built on first use, not at import: the multiprocess folder must be chosen first."""
    with _BUILD_LOCK:
        return _build_instruments()


@cache
def _build_instruments() -> Instruments:
    return Instruments(
        task_duration=Histogram(
            "chatmem_task_duration_seconds", "Time a Celery task attempt took.", ["task"], buckets=TASK_BUCKETS
        ),
        task_failures=Counter(
            "chatmem_task_failures", "Task attempts that failed for good (no retry left, or not retryable).", ["task"]
        ),
        task_retries=Counter("chatmem_task_retries", "Task attempts that failed and were queued again.", ["task"]),
        llm_calls=Counter(
            "chatmem_llm_calls",
            "LLM requests by model and outcome (cached: answered by the output cache).",
            ["model", "outcome"],
        ),
        llm_tokens=Counter(
            "chatmem_llm_tokens",
            "Tokens the LLM endpoint reported, by model and kind (prompt, completion).",
            ["model", "kind"],
        ),
        embed_seconds=Histogram(
            "chatmem_embed_seconds",
            "Time of one call to the embedding model (cache misses only).",
            buckets=READ_BUCKETS,
        ),
        attachments=Counter(
            "chatmem_attachments", "Attachment jobs finished, by file kind and status.", ["kind", "status"]
        ),
        context_seconds=Histogram("chatmem_context_seconds", "Time to build a context bundle.", buckets=READ_BUCKETS),
        recall_seconds=Histogram("chatmem_recall_seconds", "Time of one recall.", buckets=READ_BUCKETS),
        ingest_batch_seconds=Histogram(
            "chatmem_ingest_batch_seconds",
            "Time to store and acknowledge one batch of stream entries.",
            buckets=READ_BUCKETS,
        ),
        sweeper_requeued=Counter(
            "chatmem_sweeper_requeued",
            "What the sweeper queued again: lagging threads rung, lost final summaries, attachments and fact jobs.",
            ["what"],
        ),
        apply_failures=Counter(
            "chatmem_thread_apply_failures",
            "Doorbell passes stopped by an error applying a thread's batch, not an outage: the thread "
            "waits at that batch (chatmem dead-letters lists where and why).",
            ["error"],
        ),
    )


@contextmanager
def timed(histogram: Histogram) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        histogram.observe(time.perf_counter() - start)


def record_sweep(rung: int, finals: int, attachments: int, facts: int) -> None:
    requeued = instruments().sweeper_requeued
    requeued.labels("threads").inc(rung)
    requeued.labels("final_summaries").inc(finals)
    requeued.labels("attachments").inc(attachments)
    requeued.labels("fact_jobs").inc(facts)


# --- processes --------------------------------------------------------------------------------
def use_multiprocess_dir(path: Path, *, clear: bool = False) -> None:
    """Record this process's metrics (and its children's) as files under `path`. Call it before
    anything is recorded; `clear` starts from zero (`chatmem up` does, for the processes it runs)."""
    if _build_instruments.cache_info().currsize:
        raise RuntimeError("metrics were recorded before the multiprocess folder was set")
    if clear and path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    # prometheus_client chooses its value class when it is imported; it may have been already.
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


def multiprocess_dir() -> Path | None:
    found = os.environ.get(MULTIPROC_ENV)
    return Path(found) if found else None


def process_registry() -> CollectorRegistry:
    """What this process exposes: the sum of every process's files in multiprocess mode, else the
    metrics recorded in this process."""
    folder = multiprocess_dir()
    if folder is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    return registry


def serve(port: int, host: str) -> None:
    """Serve /metrics on its own port in a background thread (ingest, workers, sweeper)."""
    from prometheus_client import start_http_server

    start_http_server(port, host, registry=process_registry())
    log.info("metrics on http://%s:%d/metrics", host, port)


# --- shared state, read at scrape time --------------------------------------------------------
@dataclass(frozen=True)
class SharedState:
    """What the pipeline's shared stores say right now (chatmem/status.py reads it)."""

    events: int
    dead_letters: dict[str, int]  # by reason class
    stream_pending: int
    queue_depths: dict[str, int]
    thread_lags: list[int] = field(default_factory=list)  # events behind, one per lagging thread
    threads: int = 0  # every thread, lagging or not
    spooled: int = 0  # events in this host's publish spools
    spool_refused: int = 0  # events refused because a spool was full


def lag_buckets(lags: Iterable[int], threads: int) -> list[tuple[str, float]]:
    """Cumulative buckets of a gauge histogram over all threads (the ones not lagging are 0)."""
    lags = list(lags)
    idle = max(0, threads - len(lags))
    out = [(floatToGoString(b), float(idle + sum(1 for v in lags if v <= b))) for b in LAG_BUCKETS]
    return [*out, ("+Inf", float(idle + len(lags)))]


class SharedStateCollector(Collector):
    """Reads the shared state on every scrape. When Postgres or Redis cannot be read, the scrape
    still answers, with `chatmem_state_up 0` and without these series (an exporter's `up`)."""

    def __init__(self, read: Callable[[], SharedState]):
        self._read = read

    def describe(self) -> list[Metric]:
        return []  # registering must not touch the database

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("chatmem_state_up", "1 when Postgres and Redis answered this scrape, else 0.")
        try:
            state = self._read()
        except Exception as error:  # noqa: BLE001 - reported as a metric and a log line
            log.warning("metrics: shared state unavailable: %s", error)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        events = CounterMetricFamily("chatmem_events_ingested", "Events stored in the event log.")
        events.add_metric([], state.events)
        yield events
        dead = CounterMetricFamily(
            "chatmem_dead_letters",
            "Stream entries refused, by reason class (`chatmem dead-letters`).",
            labels=["reason"],
        )
        for reason, n in sorted(state.dead_letters.items()):
            dead.add_metric([reason], n)
        yield dead
        pending = GaugeMetricFamily("chatmem_stream_pending", "Stream entries read by ingest but not acknowledged.")
        pending.add_metric([], state.stream_pending)
        yield pending
        depth = GaugeMetricFamily("chatmem_queue_depth", "Tasks waiting in each Celery queue.", labels=["queue"])
        for queue, n in sorted(state.queue_depths.items()):
            depth.add_metric([queue], n)
        yield depth
        spooled = GaugeMetricFamily(
            "chatmem_spool_events", "Events in this host's publish spools, waiting for Redis (`chatmem status`)."
        )
        spooled.add_metric([], state.spooled)
        yield spooled
        refused = CounterMetricFamily(
            "chatmem_spool_refused",
            "Events a full publish spool refused (CHATMEM_SPOOL_MAX_BYTES): not stored anywhere.",
        )
        refused.add_metric([], state.spool_refused)
        yield refused
        lag_max = GaugeMetricFamily("chatmem_thread_lag_events_max", "Events the most lagging thread has not applied.")
        lag_max.add_metric([], max(state.thread_lags, default=0))
        yield lag_max
        lag = GaugeHistogramMetricFamily(
            "chatmem_thread_lag_events", "Threads by how many logged events they have not applied yet."
        )
        lag.add_metric([], lag_buckets(state.thread_lags, state.threads), gsum_value=sum(state.thread_lags))
        yield lag


class _Both(Collector):
    def __init__(self, *collectors: Collector):
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for c in self.collectors:
            yield from c.collect()


def exposition(shared: SharedStateCollector | None = None) -> bytes:
    """The text format for a /metrics answer: this process (or every process, in multiprocess
    mode) plus, for the API, the shared state."""
    own = process_registry()
    return generate_latest(_Both(own, shared) if shared is not None else own)
