"""`chatmem bench pipeline`: messages per second end to end (publish -> ingest -> segmentation
with embeddings -> summaries on the offline LLM) next to the raw throughput of the same
embedding model in the same run; then the replay rate with warm caches next to the live rate.
Printed, never asserted. Runs in a scratch database and Redis db (see bench/ingest.py)."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from psycopg.types.json import Jsonb
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chatmem.adapters.celery_queue import queue_depths
from chatmem.adapters.embedders import BACKENDS, minilm_embedder, torch_available
from chatmem.adapters.procs import process_name
from chatmem.bench.cpu import CpuMeter, listening_pid, postmaster_of
from chatmem.bench.host import machine
from chatmem.bench.ingest import scratch
from chatmem.memory.replay import ReplayFailed, ReplayResult
from chatmem.producers.importers import locomo_events
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from chatmem.schemas.settings import ENV_PREFIX, Settings

TOPICS = {
    "travel": "flight hotel Lisbon Berlin train booking luggage passport museum beach weekend trip",
    "cooking": "recipe pasta oven garlic tomato sauce bake dinner spices vegetarian dessert",
    "laptop": "laptop battery overheating fan compile linux driver keyboard screen memory upgrade",
    "fitness": "running marathon knee stretching gym protein training plan recovery shoes",
    "money": "budget savings rent invoice tax bank transfer salary pension insurance",
}


def make_conversation(n_messages: int, n_threads: int, seed: int = 7, prefix: str = "pipe") -> list[MessageEvent]:
    rng = random.Random(seed)
    names = list(TOPICS)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    events = []
    for t in range(n_threads):
        topic = rng.choice(names)
        for i in range(n_messages // n_threads):
            if i and i % 12 == 0:
                topic = rng.choice(names)  # a topic change every dozen turns
            words = TOPICS[topic].split()
            text = " ".join(rng.choice(words) for _ in range(rng.randint(8, 16))).capitalize() + "."
            if rng.random() < 0.3:
                text += " What do you think?"
            events.append(
                MessageEvent(
                    event_id=f"{prefix}-{t}-{i}",
                    thread_id=f"{prefix}-{t}",
                    user_id=f"user-{t}",
                    role="user" if i % 2 == 0 else "assistant",
                    text=text,
                    occurred_at=t0 + timedelta(minutes=i),
                )
            )
    return events


STAGES = {
    "ingest": ("ingest",),
    "segment": ("worker", "--queues", "segment", "--concurrency", "1"),
    "summarize": ("worker", "--queues", "summarize", "--concurrency", "1"),
    "facts": ("worker", "--queues", "facts", "--concurrency", "1"),
}


@contextmanager
def pipeline_processes(c, extra_env: dict[str, str] | None = None) -> Iterator[dict[str, int]]:  # noqa: ANN001
    """The ingest consumer and one worker per pipeline queue, as separate processes; yields
    each stage's pid."""
    env = c.settings.as_env() | (extra_env or {})
    procs = {
        stage: subprocess.Popen(
            [sys.executable, "-m", "chatmem.api.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for stage, args in STAGES.items()
    }
    try:
        yield {stage: p.pid for stage, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(30)


def service_pids(c) -> dict[str, list[int]]:  # noqa: ANN001
    with c.pool.connection() as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    return {
        "postgres": [p for p in (postmaster_of(backend),) if p],
        "redis": [p for p in (listening_pid(c.urls.redis_url),) if p],
    }


def database_bytes(c) -> int:  # noqa: ANN001
    with c.pool.connection() as conn:
        conn.execute("CHECKPOINT")  # dirty pages count once written
        return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def cpu_table(title: str, cpu: dict[str, float], n: int, wall_s: float) -> Table:
    """CPU milliseconds per message by stage, and the messages per second one core gives it."""
    table = Table(title=title)
    for col in ("stage", "CPU ms / message", "share", "msg/s per core"):
        table.add_column(col)
    total = sum(cpu.values())
    for stage, seconds in [*cpu.items(), ("all stages", total)]:
        per = seconds / n
        table.add_row(
            stage, f"{per * 1000:.2f}", f"{seconds / total:.0%}" if total else "", f"{1 / per:,.0f}" if per else "–"
        )
    table.caption = f"{n:,} messages in {wall_s:.1f} s wall: {total / wall_s:.2f} cores busy on average"
    return table


def wait_until_settled(  # noqa: ANN001
    c, n_messages: int, t0: float, limit_s: float = 900, threads: list[str] | None = None
) -> float:
    """Seconds until every message is applied and the summary and facts work has drained (their
    queues are empty, every closed episode of `threads` (default: all) has its facts, and nothing
    changed for a second). Episodes loaded without the pipeline never get facts: leave them out."""
    last, last_change = -1, time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        time.sleep(0.1)
        with c.pool.connection() as conn:
            applied = conn.execute("SELECT coalesce(sum(message_count), 0) FROM threads").fetchone()[0]
            count = conn.execute("SELECT (SELECT count(*) FROM summaries) + (SELECT count(*) FROM facts)").fetchone()[0]
            facts_missing = conn.execute(
                """SELECT count(*) FROM episodes e
                   WHERE e.status = 'closed' AND (%(threads)s::text[] IS NULL OR e.thread_id = ANY(%(threads)s))
                     AND NOT EXISTS (SELECT 1 FROM fact_ledger l
                                     WHERE l.op_key = e.episode_id || ':g' || e.generation || ':facts')""",
                {"threads": threads},
            ).fetchone()[0]
        if count != last:
            last, last_change = count, time.perf_counter()
        depths = queue_depths(c.celery)
        idle = depths["summarize"] == 0 and depths["facts"] == 0 and facts_missing == 0
        if applied >= n_messages and idle and time.perf_counter() - last_change > 1.0:
            return last_change - t0
    raise TimeoutError("the pipeline did not settle")


def applied_messages(c) -> int:  # noqa: ANN001
    with c.pool.connection() as conn:
        return int(conn.execute("SELECT coalesce(sum(message_count), 0) FROM threads").fetchone()[0])


def live_phase(c, events: list[MessageEvent], extra_env: dict[str, str] | None = None):  # noqa: ANN001, ANN201
    """Publish `events` to the running pipeline: seconds until settled, CPU by stage, and the
    bytes Postgres grew by per message."""
    with pipeline_processes(c, extra_env) as pids:
        time.sleep(15)  # let the workers load the model and mem0: start-up is not throughput
        meter = CpuMeter({stage: [pid] for stage, pid in pids.items()} | service_pids(c))
        db_before, applied_before = database_bytes(c), applied_messages(c)
        meter.start()
        t0 = time.perf_counter()
        with Publisher.from_settings(c.settings, c.urls.redis_url) as pub:
            for e in events:
                pub.publish_nowait(e)
        live_s = wait_until_settled(c, applied_before + len(events), t0, threads=sorted({e.thread_id for e in events}))
        live_cpu = meter.stop()
        db_per_message = (database_bytes(c) - db_before) / len(events)
    return live_s, live_cpu, db_per_message


def per_thread_doorbells(c, events: list[MessageEvent]) -> tuple[float, dict[str, float]]:  # noqa: ANN001
    """The live rate again with a doorbell task per thread (groups of one, as before doorbells
    were grouped): the same messages as new threads, with the embedding and LLM caches emptied
    so that neither run finds the other's work."""
    with c.pool.connection() as conn:
        conn.execute("TRUNCATE embedding_cache, llm_cache, pair_cache")
    solo = [e.model_copy(update={"event_id": f"solo-{e.event_id}", "thread_id": f"solo-{e.thread_id}"}) for e in events]
    live_s, cpu, _ = live_phase(c, solo, {f"{ENV_PREFIX}DOORBELL_GROUP_SIZE": "1"})
    return live_s, cpu


def replay_rate_of(c, thread_ids: list[str], llm) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    results = list(c.replay_many(thread_ids, llm, process_name("bench")))
    if failed := [r for r in results if isinstance(r, ReplayFailed)]:
        raise RuntimeError(f"{len(failed)} thread(s) not rebuilt, the first {failed[0].thread_id}: {failed[0].error!r}")
    replayed = sum(r.events for r in results if isinstance(r, ReplayResult))
    return replayed / (time.perf_counter() - t0)


def clear_copies(c, thread_ids: list[str]) -> list[str]:  # noqa: ANN001
    """A copy of each thread with its events logged in clear (as with encryption off)."""
    copies = []
    with c.pool.connection() as conn, conn.transaction():
        for tid in thread_ids:
            copy = f"clear-{tid}"
            for e in c.thread_log.pending_events(tid, 0, 1_000_000):
                payload = {**e.payload, "event_id": f"clear-{e.event_id}", "thread_id": copy}
                conn.execute(
                    """INSERT INTO events (event_id, stream_pos, type, schema_version, thread_id, user_id,
                                           occurred_at, payload)
                       VALUES (%s, %s, %s, 1, %s, %s, %s, %s)""",
                    (payload["event_id"], e.stream_pos, e.type, copy, e.user_id, e.occurred_at, Jsonb(payload)),
                )
            # Replay rebuilds up to the thread's cursor: the copy's is the original's.
            conn.execute(
                """INSERT INTO threads (thread_id, cursor_pos) SELECT %s, cursor_pos FROM threads WHERE thread_id = %s
                   ON CONFLICT DO NOTHING""",
                (copy, tid),
            )
            copies.append(copy)
    return copies


def real_dialogues(path: Path, n_messages: int) -> list[MessageEvent]:
    """LoCoMo conversations (one thread each), interleaved turn by turn as concurrent chats
    arrive; the first `n_messages` turns. Real dialogue segments as real users' threads do, which
    a bag of topic words does not (it split into ten times the episodes it planted)."""
    by_thread: dict[str, list[MessageEvent]] = {}
    for e in locomo_events(path):
        by_thread.setdefault(e.thread_id, []).append(e)
    rounds = itertools.zip_longest(*by_thread.values())
    return [e for e in itertools.chain.from_iterable(rounds) if e is not None][:n_messages]


def raw_embedding_rates(texts: list[str]) -> dict[str, float]:
    """Texts/s of each all-MiniLM-L6-v2 backend installed, on the same texts and cores."""
    rates = {}
    for backend in BACKENDS:
        if backend == "torch" and not torch_available():
            continue
        embedder = minilm_embedder(backend)
        embedder.embed(texts[:64])  # load the model before timing
        t0 = time.perf_counter()
        embedder.embed(texts)
        rates[backend] = len(texts) / (time.perf_counter() - t0)
    return rates


def run(
    settings: Settings,
    console: Console,
    *,
    n_messages: int = 2000,
    n_threads: int = 20,
    dialogues: Path | None = None,
    preload: int = 0,
) -> dict:
    """`preload`: afterwards, fill the table with that many messages and their HNSW graph, and run
    the live pipeline again on another generated conversation of the same size, so the cost of a
    large table shows beside the small one's (generated conversations only, like for like: the
    command refuses `--preload` with `--dialogues`)."""
    events = real_dialogues(dialogues, n_messages) if dialogues else make_conversation(n_messages, n_threads)
    n_threads = len({e.thread_id for e in events})
    texts = [e.text for e in events]
    with scratch(settings) as c:
        backend = settings.embedding_backend
        minilm_embedder(backend)  # the workers' backend must be installed: a clear error if not
        raw_rates = raw_embedding_rates(texts)
        raw_rate = raw_rates[backend]  # the workers' backend: the limit the live rate is compared with

        live_s, live_cpu, db_per_message = live_phase(c, events)
        live_rate = len(events) / live_s

        llm = c.llm("maintenance")
        sealed_threads = c.thread_log.all_threads()
        meter = CpuMeter({"replay (one process)": [os.getpid()]} | service_pids(c))
        meter.start()
        t0 = time.perf_counter()
        replay_rate = replay_rate_of(c, sealed_threads, llm)
        replay_s, replay_cpu = time.perf_counter() - t0, meter.stop()
        # What an operator runs: `chatmem replay --all --jobs N`, a process per core (start-up and
        # model load included).
        jobs = os.cpu_count() or 1
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "chatmem.api.cli", "replay", "--all", "--jobs", str(jobs)],
            env=c.settings.as_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        parallel_replay_rate = len(events) / (time.perf_counter() - t0)
        # The cost of opening sealed content in replay: the same threads copied with their content
        # in clear, both replayed again with the same warm caches.
        clear_threads = clear_copies(c, sealed_threads)
        replay_rate_of(c, clear_threads, llm)  # their first build warms the caches for their ids
        clear_replay_rate = replay_rate_of(c, clear_threads, llm)
        sealed_replay_rate = replay_rate_of(c, sealed_threads, llm)
        with c.pool.connection() as conn:
            n_episodes = conn.execute("SELECT count(*) FROM episodes").fetchone()[0]
            n_summaries = conn.execute("SELECT count(*) FROM summaries").fetchone()[0]
        # Last, so that it changes nothing the figures above measured.
        solo_s, solo_cpu = per_thread_doorbells(c, events)
        solo_rate = len(events) / solo_s
        large = _large_table_phase(c, console, preload, n_messages, n_threads) if preload else None

    table = Table(title=f"chatmem bench pipeline · {machine()} · {datetime.now(UTC):%Y-%m-%d}")
    for col in ("measure", "rate", "compared with (same run)", "ratio", "target"):
        table.add_column(col)
    for name, rate in raw_rates.items():
        in_use = " (workers)" if name == backend else ""
        versus = (
            ("", "", "")
            if name == "torch" or "torch" not in raw_rates
            else (f"{raw_rates['torch']:,.0f} texts/s torch", f"{rate / raw_rates['torch']:.1f}×", "≥ 2×")
        )
        table.add_row(f"raw embedding, {name}{in_use} (all-MiniLM-L6-v2)", f"{rate:,.0f} texts/s", *versus)
    if "torch" not in raw_rates:
        table.add_row("raw embedding, torch", "not installed", escape("pip install 'chatmem[torch]'"), "", "")
    table.add_row(
        "live pipeline, end to end",
        f"{live_rate:,.0f} msg/s",
        f"{raw_rate:,.0f} texts/s raw",
        f"{live_rate / raw_rate:.0%}",
        "≥ 75%",
    )
    table.add_row(
        f"live, doorbells grouped (up to {c.settings.doorbell_group_size} threads a task)",
        f"{live_rate:,.0f} msg/s",
        f"{solo_rate:,.0f} msg/s with a task per thread",
        f"{live_rate / solo_rate:.2f}×",
        "",
    )
    table.add_row(
        "replay, one process (two rebuilds in flight), warm caches",
        f"{replay_rate:,.0f} msg/s",
        f"{live_rate:,.0f} msg/s live",
        f"{replay_rate / live_rate:.1f}×",
        "≥ 5×",
    )
    table.add_row(
        f"replay --all --jobs {jobs} (processes, start-up included)",
        f"{parallel_replay_rate:,.0f} msg/s",
        f"{live_rate:,.0f} msg/s live",
        f"{parallel_replay_rate / live_rate:.1f}×",
        "≥ 5×",
    )
    table.add_row(
        "replay again, content sealed (default)",
        f"{sealed_replay_rate:,.0f} msg/s",
        f"{clear_replay_rate:,.0f} msg/s in clear",
        f"{sealed_replay_rate / clear_replay_rate:.0%}",
        "",
    )
    table.add_row("LLM calls during replay", str(llm.calls), "", "", "0")
    console.print(
        f"{len(events):,} messages over {n_threads} threads → {n_episodes} episode rows, "
        f"{n_summaries} summary rows (both generations)"
    )
    console.print(table)
    console.print(cpu_table("live pipeline: CPU by stage", live_cpu, len(events), live_s))
    console.print(
        f"Postgres grew by {db_per_message / 1024:.1f} KiB per message (tables, indexes, TOAST; one generation)"
    )
    console.print(cpu_table("replay: CPU by stage", replay_cpu, len(events), replay_s))
    console.print(cpu_table("live again, a doorbell task per thread: CPU by stage", solo_cpu, len(events), solo_s))
    if large is not None:
        large_s, large_cpu, total = large
        console.print(_large_table(live_cpu, len(events), live_s, large_cpu, large_s, total))
    return {
        "live_cpu_s": live_cpu,
        "db_bytes_per_message": db_per_message,
        "replay_cpu_s": replay_cpu,
        "raw_rate": raw_rate,
        "raw_rates": raw_rates,
        "live_rate": live_rate,
        "live_rate_per_thread_doorbells": solo_rate,
        "replay_rate": replay_rate,
        "parallel_replay_rate": parallel_replay_rate,
        "replay_sealed_rate": sealed_replay_rate,
        "replay_clear_rate": clear_replay_rate,
        "llm_calls": llm.calls,
    } | ({"large_table_cpu_s": large[1], "large_table_rate": len(events) / large[0]} if large else {})


def _large_table_phase(c, console: Console, preload: int, n_messages: int, n_threads: int):  # noqa: ANN001, ANN202
    """Load `preload` messages with their HNSW graph (as `bench context --hnsw` does), then run the
    live phase again on a new conversation: seconds, CPU by stage, and the table's size."""
    from chatmem.bench.context import load  # context builds on this module's topics

    per_thread = 1_000
    console.print(f"loading {preload:,} messages and their HNSW graph")
    load(c, random.Random(3), max(1, preload // per_thread), per_thread, max(1, preload // 500), console, True)
    with c.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE messages")  # what autovacuum would have done over the months of load
        total = int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
    events = make_conversation(n_messages, n_threads, seed=8, prefix="large")
    large_s, large_cpu, _ = live_phase(c, events)
    return large_s, large_cpu, total


def _large_table(
    small_cpu: dict[str, float], n: int, small_s: float, large_cpu: dict[str, float], large_s: float, total: int
) -> Table:
    table = Table(
        title=f"live pipeline, CPU ms a message: a new table against one of {total:,} messages with its graph"
    )
    for col in ("stage", "new table", f"{total:,} messages", "ratio"):
        table.add_column(col, justify="right")
    for stage in small_cpu:
        a, b = small_cpu[stage] * 1000 / n, large_cpu.get(stage, 0.0) * 1000 / n
        table.add_row(stage, f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}×" if a else "")
    a, b = sum(small_cpu.values()) * 1000 / n, sum(large_cpu.values()) * 1000 / n
    table.add_row("all stages", f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}×" if a else "")
    table.add_row("live rate, msg/s", f"{n / small_s:,.0f}", f"{n / large_s:,.0f}", f"{small_s / large_s:.2f}×")
    return table
