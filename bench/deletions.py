"""`chatmem bench deletions`: what forgetting one deleted message costs: the LLM requests and the
wall time of its thread's rebuild, with the thread's cached model answers (LLM outputs, pair model
logits) dropped before the rebuild (how retention and deletions worked until 2026-11-30) and kept
through it (how they work now), in alternating rounds of one run. Printed, never asserted.

A LoCoMo conversation is processed by the real pipeline with the offline LLM; each round deletes a
message of another episode. The offline LLM answers in microseconds, so the wall time here is the
rebuild's own; a remote model adds its latency for each request counted."""

from __future__ import annotations

import statistics
import threading
import time
from datetime import date
from pathlib import Path

from rich.console import Console
from rich.table import Table

from chatmem.adapters.metrics import instruments
from chatmem.bench.host import machine
from chatmem.bench.locomo import processed
from chatmem.bootstrap import Container
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageDeletedEvent
from chatmem.schemas.settings import Settings
from chatmem.workers.ingest import IngestRunner

WAYS = ("answers dropped first (before)", "answers kept, unused swept (now)")


def run(
    settings: Settings, console: Console, data: Path, sample: str, rounds: int = 6, keep: Path | None = None
) -> dict:
    with processed(settings, data, {sample}, keep) as (c, _corpus, done):
        victims = _one_message_per_episode(c, sample, rounds)
        figures: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
        for i, message_id in enumerate(victims):
            way = WAYS[i % 2]
            _log_deletion(c, sample, message_id, i)
            if way == WAYS[0]:
                with c.pool.connection() as conn:
                    conn.execute("DELETE FROM llm_cache WHERE thread_id = %s", (sample,))
                    conn.execute("DELETE FROM pair_cache WHERE thread_id = %s", (sample,))
            before = _requests(c)
            t0 = time.perf_counter()
            removed = c.forget_deleted(sample)
            wall = time.perf_counter() - t0
            assert removed["events"] >= 1, f"message {message_id} was not found"
            figures[way].append((_requests(c) - before, wall))
        with c.pool.connection() as conn:
            row = conn.execute(
                """SELECT (SELECT count(*) FROM messages m JOIN threads t USING (thread_id, generation)
                           WHERE thread_id = %(t)s),
                          (SELECT count(*) FROM llm_cache WHERE thread_id = %(t)s)""",
                {"t": sample},
            ).fetchone()
    assert row is not None
    table = Table(title=f"Forgetting one deleted message of {sample} ({row[0]} messages, {row[1]} LLM outputs)")
    for column in ("thread's model answers", "rounds", "LLM requests, median (min–max)", "wall s, median (min–max)"):
        table.add_column(column)
    out: dict = {}
    for way in WAYS:
        asked, walls = [a for a, _ in figures[way]], [w for _, w in figures[way]]
        table.add_row(
            way,
            str(len(asked)),
            f"{statistics.median(asked):.0f} ({min(asked):.0f}–{max(asked):.0f})",
            f"{statistics.median(walls):.2f} ({min(walls):.2f}–{max(walls):.2f})",
        )
        out[way] = {"requests": asked, "wall_s": walls}
    table.caption = f"{machine()} · {date.today()} · {done}"
    console.print(table)
    return out


def _one_message_per_episode(c: Container, thread_id: str, n: int) -> list[str]:
    """A user message from the middle of each of n episodes spread over the thread."""
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT DISTINCT ON (e.start_seq) m.platform_message_id FROM episodes e
               JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
               JOIN messages m ON m.episode_id = e.episode_id AND m.generation = e.generation
               WHERE e.thread_id = %s AND m.role = 'user' AND m.platform_message_id IS NOT NULL
               ORDER BY e.start_seq, abs(m.seq - (e.start_seq + coalesce(e.end_seq, e.start_seq)) / 2)""",
            (thread_id,),
        ).fetchall()
    picked = [r[0] for r in rows]
    step = max(1, len(picked) // n)
    return picked[::step][:n]


def _log_deletion(c: Container, thread_id: str, message_id: str, i: int) -> None:
    event = MessageDeletedEvent(
        event_id=f"bench-deletion-{i}-{message_id}",
        thread_id=thread_id,
        user_id="bench",
        platform_message_ids=[message_id],
    )
    Publisher(c.sink, c.settings.resolved_spool_dir).publish_many([event])
    IngestRunner(c, "bench").run(threading.Event(), until_idle=True)


def _requests(c: Container) -> float:
    return instruments().llm_calls.labels(c.llm("maintenance").model, "ok")._value.get()
