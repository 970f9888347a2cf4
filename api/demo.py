"""`chatmem demo` (what `make run` shows): the whole pipeline on a bundled conversation."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chatmem.adapters import migrate, services
from chatmem.adapters.sql import scalar
from chatmem.bootstrap import Container
from chatmem.producers.importers import publish_jsonl
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment, MessageEvent, parse_event
from chatmem.schemas.settings import Settings
from chatmem.status import report
from chatmem.workers.supervisor import Supervisor

SAMPLE = Path(__file__).resolve().parent.parent / "producers" / "samples" / "demo_conversation.jsonl"


def _wait_processed(c: Container, event_ids: list[str], thread_ids: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with c.pool.connection() as conn:
            stored = scalar(conn, "SELECT count(*) FROM events WHERE event_id = ANY(%s)", (event_ids,))
            behind = scalar(
                conn,
                """SELECT count(*) FROM events e JOIN threads t USING (thread_id)
                   WHERE e.thread_id = ANY(%s) AND e.stream_pos > t.cursor_pos""",
                (thread_ids,),
            )
        if stored == len(event_ids) and behind == 0:
            return True
        time.sleep(0.25)
    return False


def _summaries_settled(c: Container, thread_ids: list[str]) -> bool:
    """Every closed episode has its final summary. An open episode gets a running summary only
    every few messages, so it is not waited for (the photo opens one of a single message)."""
    with c.pool.connection() as conn:
        missing = scalar(
            conn,
            """SELECT count(*) FROM episodes e
               JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
               WHERE e.thread_id = ANY(%s) AND e.status = 'closed' AND NOT EXISTS (
                   SELECT 1 FROM summaries s WHERE s.generation = e.generation AND s.episode_id = e.episode_id
                   AND s.kind = 'final')""",
            (thread_ids,),
        )
    return missing == 0


def _print_episodes(c: Container, console: Console, thread_ids: list[str]) -> None:
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT e.thread_id, e.episode_id, e.start_seq, e.end_seq, e.status, e.opened_by,
                      coalesce(e.topic_label, ''), s.kind, s.text, s.content
               FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
               LEFT JOIN LATERAL (
                   SELECT kind, text, content FROM summaries s WHERE s.generation = e.generation
                   AND s.episode_id = e.episode_id AND s.kind IN ('final', 'running')
                   ORDER BY (s.kind = 'final') DESC, s.upto_seq DESC LIMIT 1) s ON true
               WHERE e.thread_id = ANY(%s) ORDER BY e.thread_id, e.ordinal""",
            (thread_ids,),
        ).fetchall()
    table = Table(title="episodes", show_lines=True)
    for col in ("episode", "messages", "opened by", "summary", "open loops"):
        table.add_column(col, overflow="fold")
    for _tid, eid, start, end, status, opened_by, label, kind, text, content in rows:
        loops = (content or {}).get("open_loops") or (content or {}).get("open_questions") or []
        todos = (content or {}).get("todos") or []
        span = f"{start}-{end if end else '…'} ({status})"
        head = escape(f"[{kind or 'no summary yet'}] {label}".strip())
        table.add_row(eid, span, opened_by, f"{head}\n{text or ''}", "\n".join(f"• {x}" for x in [*loops, *todos][:5]))
    console.print(table)


DEMO_QUESTION = "Which flights should I book, and is there anything about food I told you?"
IMAGE_QUESTION = "Which gate and seat are on the boarding pass photo I sent?"
BOARDING_PASS = ["BOARDING PASS", "ALICE MARTIN", "Flight TP 1357 Porto to Lisbon", "Gate B17   Seat 14C"]


def _image_event(settings: Settings) -> MessageEvent:
    """A photo with text in it, drawn now and sent by file:// (as a bot would after downloading it)."""
    import io

    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (900, 300), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=32)
    for i, line in enumerate(BOARDING_PASS):
        draw.text((30, 25 + i * 65), line, fill="black", font=font)
    path = settings.data_dir / "demo" / "boarding-pass.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return MessageEvent(
        event_id="demo-alice-photo-1",
        thread_id="demo-alice",
        user_id="alice",
        platform="demo",
        text="Here is my boarding pass for the trip.",
        platform_message_id="demo-alice-m-photo",
        occurred_at=datetime(2026, 3, 2, 9, 50, tzinfo=UTC),
        attachments=[
            Attachment(url=path.resolve().as_uri(), kind="image", mime_type="image/png", caption="boarding pass")
        ],
    )


def _attachments_settled(c: Container, event_ids: list[str]) -> bool:
    with c.pool.connection() as conn:
        waiting = scalar(
            conn,
            """SELECT count(*) FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
               WHERE a.event_id = ANY(%s) AND a.status <> 'failed'
                 AND coalesce(ar.status, '') NOT IN ('done', 'failed')""",
            (event_ids,),
        )
    return waiting == 0


def _print_attachments(c: Container, console: Console, event_ids: list[str]) -> None:
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT m.text, ar.status, coalesce(a.reason, ar.reason, ''),
                      (SELECT string_agg(t.kind || ': ' || t.text, E'\n' ORDER BY t.kind, t.ord)
                       FROM artifact_text t
                       WHERE t.sha256 = a.sha256 OR (t.event_id = a.event_id AND t.position = a.position))
               FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
               JOIN messages m ON m.event_id = a.event_id
               JOIN threads th ON th.thread_id = m.thread_id AND th.generation = m.generation
               WHERE a.event_id = ANY(%s)""",
            (event_ids,),
        ).fetchall()
    table = Table(title="attachments (the message's history text gets a surrogate; derived texts are searchable)")
    for col in ("message text", "status", "derived texts"):
        table.add_column(col, overflow="fold")
    for text, status, reason, texts in rows:
        table.add_row(escape(text), f"{status or 'failed'} {reason}".strip(), escape(texts or ""))
    console.print(table)


def _answer(c: Container, console: Console, thread_id: str, user_id: str, question: str) -> None:
    """What a bot does on its next turn: recall with citations, then the token-budgeted context."""
    from chatmem.memory.recall_tool import format_hits

    console.print(f"\n[bold]{user_id} asks:[/bold] {escape(question)}")
    result = c.recall(user_id, question, limit=5)
    console.print("[bold]recall_memory[/bold] (what the model would get back from the tool):")
    console.print(escape(format_hits(result)))
    bundle = c.build_context(thread_id, user_id, question, max_tokens=1200)
    table = Table(title=f"build_context: {bundle.tokens} of {bundle.max_tokens} tokens ({bundle.counter})")
    for col in ("section", "items", "tokens", "first item"):
        table.add_column(col, overflow="fold")
    for sec in bundle.sections:
        if sec.items:
            table.add_row(sec.name, str(len(sec.items)), str(sec.tokens), escape(sec.items[0].text[:100]))
    console.print(table)
    console.print(f"→ {len(bundle.messages)} chat messages ready for the model (system memory + recent turns)")


def _facts_settled(c: Container, thread_ids: list[str]) -> bool:
    """Every closed episode's facts job and every remember/forget command has run."""
    with c.pool.connection() as conn:
        waiting = scalar(
            conn,
            """SELECT (SELECT count(*) FROM episodes e JOIN threads t
                         ON t.thread_id = e.thread_id AND t.generation = e.generation
                       WHERE e.thread_id = ANY(%(t)s) AND e.status = 'closed' AND NOT EXISTS (
                           SELECT 1 FROM fact_ledger l
                           WHERE l.op_key = e.episode_id || ':g' || e.generation || ':facts'))
                    + (SELECT count(*) FROM commands_applied WHERE thread_id = ANY(%(t)s)
                       AND command IN ('remember', 'forget') AND detail LIKE '%%queued')""",
            {"t": thread_ids},
        )
    return waiting == 0


def _print_facts(c: Container, console: Console, user_ids: list[str]) -> None:
    table = Table(title="facts (active values; replaced and forgotten ones are kept as history)")
    for col in ("user", "category", "key", "value", "confidence", "from"):
        table.add_column(col, overflow="fold")
    for uid in user_ids:
        for f in c.fact_store.user_facts(uid):
            table.add_row(
                uid,
                f["category"],
                f["key"],
                f["value"],
                f"{f['confidence']:.2f}",
                f["episode_id"] or f"{f['source']} ({', '.join(f['source_event_ids'])})",
            )
    console.print(table)


def _print_memory(c: Container, console: Console, thread_ids: list[str]) -> None:
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT t.thread_id, t.applied_events, count(e.id), min(e.occurred_at), max(e.occurred_at)
               FROM threads t JOIN events e USING (thread_id)
               WHERE t.thread_id = ANY(%s) GROUP BY t.thread_id, t.applied_events ORDER BY t.thread_id""",
            (thread_ids,),
        ).fetchall()
        recent = conn.execute(
            """SELECT m.thread_id, m.episode_id, m.role, m.text FROM messages m
               JOIN threads t ON t.thread_id = m.thread_id AND t.generation = m.generation
               WHERE m.thread_id = ANY(%s) ORDER BY m.thread_id, m.seq""",
            (thread_ids,),
        ).fetchall()
    table = Table(title="threads in memory")
    for col in ("thread", "events logged", "events applied", "first", "last"):
        table.add_column(col)
    for tid, applied, logged, first, last in rows:
        table.add_row(tid, str(logged), str(applied), f"{first:%Y-%m-%d %H:%M}", f"{last:%Y-%m-%d %H:%M}")
    console.print(table)
    log_table = Table(title="messages by episode")
    for col in ("episode", "role", "text"):
        log_table.add_column(col)
    for _tid, eid, role, text in recent:
        log_table.add_row(eid, role, (text or "")[:90])
    console.print(log_table)


def run_demo(settings: Settings, console: Console, timeout: float) -> int:
    with services.running(settings) as urls:
        migrate.migrate(urls.database_url, settings.vector_dim)
        console.print(f"[bold]chatmem demo[/bold] · postgres {urls.database_url} · redis {urls.redis_url}")
        c = Container(settings, urls)
        supervisor = Supervisor()
        try:
            supervisor.start()
            events = [parse_event(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
            photo = _image_event(settings)
            with Publisher.from_settings(settings, urls.redis_url) as pub:
                result = publish_jsonl(pub, SAMPLE, settings)
                pub.publish(photo)
            events.append(photo)
            console.print(f"published {result.accepted} events from {SAMPLE.name} and a photo with text in it")
            thread_ids = sorted({e.thread_id for e in events})
            if not _wait_processed(c, [e.event_id for e in events], thread_ids, timeout):
                console.print(f"[red]not processed within {timeout:.0f}s[/red]; failed: {supervisor.failed()}")
                return 1
            deadline = time.monotonic() + timeout
            while not (
                _summaries_settled(c, thread_ids)
                and _facts_settled(c, thread_ids)
                and _attachments_settled(c, [photo.event_id])
            ):
                if time.monotonic() > deadline:
                    console.print("[yellow]summaries or facts still pending; showing what is there[/yellow]")
                    break
                time.sleep(0.25)
            _print_memory(c, console, thread_ids)
            _print_episodes(c, console, thread_ids)
            _print_facts(c, console, sorted({e.user_id for e in events}))
            _print_attachments(c, console, [photo.event_id])
            _answer(c, console, "demo-alice", "alice", DEMO_QUESTION)
            _answer(c, console, "demo-alice", "alice", IMAGE_QUESTION)
            rep = report(c)
            console.print(f"status: {rep.counts} · queues {rep.queues} · largest lag {rep.lag.max_events}")
            return 0
        finally:
            supervisor.stop()
            c.close()
