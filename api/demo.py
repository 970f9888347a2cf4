"""`chatmem demo` (what `make run` shows): the whole pipeline on a bundled conversation."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from adapters import migrate, services
from adapters.bootstrap import Container
from adapters.status import report
from producers.importers import publish_jsonl
from producers.publisher import Publisher
from schemas.events import parse_event
from schemas.settings import Settings
from workers.supervisor import Supervisor

SAMPLE = Path(__file__).resolve().parent.parent / "producers" / "samples" / "demo_conversation.jsonl"


def _wait_processed(c: Container, event_ids: list[str], thread_ids: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with c.pool.connection() as conn:
            stored = conn.execute("SELECT count(*) FROM events WHERE event_id = ANY(%s)", (event_ids,)).fetchone()[0]
            behind = conn.execute(
                """SELECT count(*) FROM events e JOIN threads t USING (thread_id)
                   WHERE e.thread_id = ANY(%s) AND e.stream_pos > t.cursor_pos""",
                (thread_ids,),
            ).fetchone()[0]
        if stored == len(event_ids) and behind == 0:
            return True
        time.sleep(0.25)
    return False


def _print_memory(c: Container, console: Console, thread_ids: list[str]) -> None:
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT t.thread_id, t.applied_events, count(e.id), min(e.occurred_at), max(e.occurred_at)
               FROM threads t JOIN events e USING (thread_id)
               WHERE t.thread_id = ANY(%s) GROUP BY t.thread_id, t.applied_events ORDER BY t.thread_id""",
            (thread_ids,),
        ).fetchall()
        recent = conn.execute(
            """SELECT thread_id, payload->>'role', coalesce(payload->>'text', payload->>'command')
               FROM events WHERE thread_id = ANY(%s) ORDER BY thread_id, stream_pos""",
            (thread_ids,),
        ).fetchall()
    table = Table(title="threads in memory")
    for col in ("thread", "events logged", "events applied", "first", "last"):
        table.add_column(col)
    for tid, applied, logged, first, last in rows:
        table.add_row(tid, str(logged), str(applied), f"{first:%Y-%m-%d %H:%M}", f"{last:%Y-%m-%d %H:%M}")
    console.print(table)
    log_table = Table(title="event log (publish order)")
    for col in ("thread", "role", "text"):
        log_table.add_column(col)
    for tid, role, text in recent:
        log_table.add_row(tid, role or "command", (text or "")[:90])
    console.print(log_table)


def run_demo(settings: Settings, console: Console, timeout: float) -> int:
    with services.running(settings) as urls:
        migrate.migrate(urls.database_url)
        console.print(f"[bold]chatmem demo[/bold] · postgres {urls.database_url} · redis {urls.redis_url}")
        c = Container(settings, urls)
        supervisor = Supervisor()
        try:
            supervisor.start()
            events = [parse_event(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
            with Publisher.from_settings(settings, urls.redis_url) as pub:
                result = publish_jsonl(pub, SAMPLE, settings)
            console.print(f"published {result.accepted} events from {SAMPLE.name}")
            thread_ids = sorted({e.thread_id for e in events})
            if not _wait_processed(c, [e.event_id for e in events], thread_ids, timeout):
                console.print(f"[red]not processed within {timeout:.0f}s[/red]; failed: {supervisor.failed()}")
                return 1
            _print_memory(c, console, thread_ids)
            rep = report(c)
            console.print(f"status: {rep.counts} · queues {rep.queues} · largest lag {rep.lag.max_events}")
            return 0
        finally:
            supervisor.stop()
            c.close()
