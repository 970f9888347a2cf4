"""`chatmem bench ingest`: publish and ingest figures next to the raw limits of the same
machine, measured in the same run. Printed, never asserted.

Runs in isolation: a scratch database on the configured Postgres server and a scratch Redis
database number, both removed at the end, so the real event log is never touched."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import redis
from rich.console import Console
from rich.table import Table

from chatmem.adapters import migrate, services
from chatmem.adapters.sql import one, scalar
from chatmem.bench.host import machine
from chatmem.bootstrap import Container
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from chatmem.schemas.settings import Settings
from chatmem.workers.ingest import IngestRunner

BENCH_REDIS_DB = 15


def _pct(samples_ns: list[int], q: float) -> float:
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000  # microseconds


def _with_db(url: str, name: str) -> str:
    head, _, query = url.partition("?")
    return head.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


@contextmanager
def scratch(settings: Settings):
    """Settings pointing at a fresh database and an empty Redis db; removed afterwards (and the
    embedded services stopped again if this started them)."""
    with services.running(settings) as urls:
        name = f"chatmem_bench_{os.getpid()}"
        admin = urls.database_url
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        db_url = _with_db(admin, name)
        migrate.migrate(db_url, settings.vector_dim)
        redis_url = urls.redis_url.rsplit("/", 1)[0] + f"/{BENCH_REDIS_DB}"
        redis.Redis.from_url(redis_url).flushdb()
        # Its own data folder too (spool, mem0's history): nothing of a benchmark stays behind.
        data_dir = Path(tempfile.mkdtemp(prefix="chatmem-bench-"))
        bench_settings = settings.model_copy(
            update={"database_url": db_url, "redis_url": redis_url, "data_dir": data_dir, "spool_dir": None}
        )
        c = Container(bench_settings, services.ServiceUrls(db_url, redis_url, False, False))
        try:
            yield c
        finally:
            c.close()
            shutil.rmtree(data_dir, ignore_errors=True)
            redis.Redis.from_url(redis_url).flushdb()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def make_events(n: int, n_threads: int, offset: int = 0, prefix: str = "bench-thread") -> list[MessageEvent]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        MessageEvent(
            event_id=f"bench-{i}",
            thread_id=f"{prefix}-{i % n_threads}",
            user_id=f"user-{i % n_threads}",
            platform="bench",
            text=f"benchmark message number {i}, long enough to look like a short chat line",
            occurred_at=at,
        )
        for i in range(offset, offset + n)
    ]


def raw_xadd_rate(r: redis.Redis, payloads: list[bytes], chunk: int = 1000) -> float:
    key = "chatmem:bench:raw"
    t0 = time.perf_counter()
    for i in range(0, len(payloads), chunk):
        pipe = r.pipeline(transaction=False)
        for p in payloads[i : i + chunk]:
            pipe.xadd(key, {b"event": p})
        pipe.execute()
    elapsed = time.perf_counter() - t0
    r.delete(key)
    return len(payloads) / elapsed


def raw_copy_rate(c: Container, events: list[MessageEvent]) -> float:
    """COPY the same rows into a table shaped like the event log (same indexes, no triggers)."""
    rows = [
        (
            e.event_id,
            1_000_000 + i,
            e.type,
            e.schema_version,
            e.thread_id,
            e.user_id,
            e.occurred_at,
            e.model_dump_json(),
        )
        for i, e in enumerate(events)
    ]
    with c.pool.connection() as conn:
        conn.execute("CREATE TABLE raw_copy (LIKE events INCLUDING DEFAULTS INCLUDING INDEXES INCLUDING IDENTITY)")
        conn.commit()
        t0 = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            copy_sql = (
                "COPY raw_copy (event_id, stream_pos, type, schema_version, thread_id, user_id,"
                " occurred_at, payload) FROM STDIN"
            )
            with cur.copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
        elapsed = time.perf_counter() - t0
        conn.execute("DROP TABLE raw_copy")
        conn.commit()
    return len(rows) / elapsed


def multi_consumer_rate(c: Container, n_consumers: int, n_events: int, n_threads: int) -> float:
    """Ingest a second, fresh set of events with several consumer processes; the rate is
    measured between the first and the last commit, so process start-up is not counted."""
    # New threads, as in the first run: their first doorbells are part of the work.
    events = make_events(n_events, n_threads, offset=n_events, prefix="bench-second")
    with c.pool.connection() as conn:
        before = scalar(conn, "SELECT count(*) FROM events")
    c.sink.add_many([e.model_dump_json().encode() for e in events])
    env = c.settings.as_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "chatmem.api.cli", "ingest", "--consumer", f"bench-{k}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for k in range(n_consumers)
    ]
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with c.pool.connection() as conn:
                if scalar(conn, "SELECT count(*) FROM events") >= before + n_events:
                    break
            time.sleep(0.2)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    with c.pool.connection() as conn:
        first, last, stored = one(
            conn,
            "SELECT min(received_at), max(received_at), count(*) FROM events WHERE event_id = ANY(%s)",
            ([e.event_id for e in events],),
        )
    batches = max(1, stored / c.settings.ingest_batch_size)
    span = (last - first).total_seconds() * batches / max(1, batches - n_consumers)
    return stored / span if span > 0 else float("nan")


def single_consumer_rate(settings: Settings, payloads: list[bytes]) -> float:
    """One consumer draining `payloads` from a fresh scratch database and stream."""
    with scratch(settings) as c:
        c.sink.add_many(payloads)
        started = time.perf_counter()
        IngestRunner(c, "bench").run(threading.Event(), until_idle=True)
        elapsed = time.perf_counter() - started
        with c.pool.connection() as conn:
            return scalar(conn, "SELECT count(*) FROM events") / elapsed


def run(settings: Settings, console: Console, *, n_events: int = 100_000, n_threads: int = 1_000) -> dict:
    n_sync = min(10_000, n_events // 10)
    with scratch(settings) as c:
        events = make_events(n_events, n_threads)
        payloads = [e.model_dump_json().encode() for e in events]
        console.print(f"[bold]bench ingest[/bold]: {n_events:,} events over {n_threads:,} threads")

        xadd_rate = raw_xadd_rate(c.redis, payloads)
        copy_rate = raw_copy_rate(c, events)

        pub = Publisher.from_settings(c.settings, c.urls.redis_url)
        sync_ns = []
        for e in events[:n_sync]:
            t0 = time.perf_counter_ns()
            pub.publish(e)
            sync_ns.append(time.perf_counter_ns() - t0)
        nowait_ns = []
        t_start = time.perf_counter()
        for e in events[n_sync:]:
            t0 = time.perf_counter_ns()
            pub.publish_nowait(e)
            nowait_ns.append(time.perf_counter_ns() - t0)
        pub.flush(120)
        nowait_rate = len(nowait_ns) / (time.perf_counter() - t_start)
        pub.close()

        runner = IngestRunner(c, "bench")
        started = time.perf_counter()
        runner.run(threading.Event(), until_idle=True)
        ingest_s = time.perf_counter() - started
        with c.pool.connection() as conn:
            stored = scalar(conn, "SELECT count(*) FROM events")
        ingest_rate = stored / ingest_s
        ingest2_rate = multi_consumer_rate(c, 2, n_events, n_threads)
    # The cost of sealing content (crypto-shredding), side by side: the same events, fresh each.
    sealed_rate = single_consumer_rate(settings.model_copy(update={"encrypt_events": True}), payloads)
    clear_rate = single_consumer_rate(settings.model_copy(update={"encrypt_events": False}), payloads)

    figures = {
        "sync_p50_us": _pct(sync_ns, 0.50),
        "sync_p99_us": _pct(sync_ns, 0.99),
        "sync_mean_us": statistics.fmean(sync_ns) / 1000,
        "nowait_p50_us": _pct(nowait_ns, 0.50),
        "nowait_p99_us": _pct(nowait_ns, 0.99),
        "nowait_delivered_per_s": nowait_rate,
        "ingest_per_s": ingest_rate,
        "ingest_2_consumers_per_s": ingest2_rate,
        "raw_xadd_per_s": xadd_rate,
        "raw_copy_per_s": copy_rate,
        "ingest_sealed_per_s": sealed_rate,
        "ingest_clear_per_s": clear_rate,
        "stored": stored,
    }
    table = Table(title=f"chatmem bench ingest · {machine()} · {datetime.now(UTC):%Y-%m-%d}")
    for col in ("measure", "ours", "raw limit (same run)", "ratio", "target"):
        table.add_column(col)
    per_event_xadd_us = 1e6 / xadd_rate
    table.add_row(
        "sync publish p50", f"{figures['sync_p50_us']:.0f} µs", f"{per_event_xadd_us:.1f} µs/XADD pipelined", "", ""
    )
    table.add_row("sync publish p99", f"{figures['sync_p99_us']:.0f} µs", "", "", "≤ 500 µs")
    table.add_row("fire-and-forget p50", f"{figures['nowait_p50_us']:.1f} µs", "", "", "")
    table.add_row("fire-and-forget p99", f"{figures['nowait_p99_us']:.1f} µs", "", "", "≤ 50 µs")
    table.add_row(
        "fire-and-forget delivered",
        f"{nowait_rate:,.0f} ev/s",
        f"{xadd_rate:,.0f} XADD/s",
        f"{nowait_rate / xadd_rate:.0%}",
        "",
    )
    table.add_row(
        "ingest Redis → Postgres",
        f"{ingest_rate:,.0f} ev/s",
        f"{copy_rate:,.0f} rows/s COPY",
        f"{ingest_rate / copy_rate:.0%}",
        "≥ 20,000 ev/s",
    )
    table.add_row(
        "ingest, 2 consumer processes",
        f"{ingest2_rate:,.0f} ev/s",
        f"{copy_rate:,.0f} rows/s COPY",
        f"{ingest2_rate / copy_rate:.0%}",
        "≥ 20,000 ev/s",
    )
    table.add_row(
        "ingest, content sealed (default)",
        f"{sealed_rate:,.0f} ev/s",
        f"{clear_rate:,.0f} ev/s encryption off",
        f"{sealed_rate / clear_rate:.0%}",
        "",
    )
    table.add_row(
        "events stored (first run)", f"{stored:,}", f"{n_events:,} published", f"{stored / n_events:.0%}", "100%"
    )
    console.print(table)
    return figures
