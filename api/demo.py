"""`chatmem demo` (what `make run` shows): the whole pipeline on a bundled conversation."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chatmem.adapters import migrate, services
from chatmem.bootstrap import Container
from chatmem.producers.importers import publish_jsonl
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment, MessageEvent, parse_event
from chatmem.schemas.settings import Settings
from chatmem.schemas.status import ModelState
from chatmem.status import report
from chatmem.workers.supervisor import Supervisor

SAMPLE = Path(__file__).resolve().parent.parent / "producers" / "samples" / "demo_conversation.jsonl"


def _print_models(console: Console, models: list[ModelState]) -> int:
    """The model check's line; 1 (the demo fails) when a model answers otherwise here."""
    off = [m for m in models if m.problem is not None]
    for m in off:
        console.print(f"[red]model {m.model}: {escape(m.problem or '')}[/red]")
    console.print(f"models: {len(models) - len(off)} of {len(models)} answer here as recorded")
    return 1 if off else 0


def _wait_processed(c: Container, event_ids: list[str], thread_ids: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if c.progress.unprocessed(event_ids, thread_ids) == 0:
            return True
        time.sleep(0.25)
    return False


def _print_episodes(c: Container, console: Console, thread_ids: list[str]) -> None:
    rows = c.progress.episodes(thread_ids)
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
VIDEO_QUESTION = "What room is the hotel in the video I sent?"
BOARDING_PASS = ["BOARDING PASS", "ALICE MARTIN", "Flight TP 1357 Porto to Lisbon", "Gate B17   Seat 14C"]
HOTEL_SIGNS = [["HOTEL LISBOA", "Welcome Alice"], ["ROOM 305", "Check-out 11:00"]]  # a scene each, 3 s


@contextmanager
def demo_photo() -> Iterator[MessageEvent]:
    """A message with a photo with text in it, drawn now and sent by file:// as a bot would after
    downloading it, from a folder of its own for as long as the block runs: not under data_dir,
    whose files the attachment fetcher refuses."""
    with tempfile.TemporaryDirectory(prefix="chatmem-demo-") as folder:
        yield _image_event(Path(folder))


@contextmanager
def demo_video() -> Iterator[MessageEvent]:
    """A message with a short video of two signs, made now, sent as the photo is."""
    with tempfile.TemporaryDirectory(prefix="chatmem-demo-") as folder:
        yield _video_event(Path(folder))


def _card(lines: list[str], size: tuple[int, int]):  # noqa: ANN202 - a PIL image
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=32)
    for i, line in enumerate(lines):
        draw.text((30, 25 + i * 65), line, fill="black", font=font)
    return img


def _image_event(folder: Path) -> MessageEvent:
    import io

    img = _card(BOARDING_PASS, (900, 300))
    path = folder / "boarding-pass.png"
    buf = io.BytesIO()
    img.save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    photo = Attachment(url=path.resolve().as_uri(), kind="image", mime_type="image/png", caption="boarding pass")
    return _alice_sends("photo", "Here is my boarding pass for the trip.", datetime(2026, 3, 2, 9, 50), photo)


def _video_event(folder: Path) -> MessageEvent:
    """MPEG-4 Part 2 in MP4: the encoder OpenCV's wheel carries (a phone's H.264 is read alike)."""
    import cv2
    import numpy as np

    path = folder / "hotel.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 10, (640, 200))
    for sign in HOTEL_SIGNS:
        picture = cv2.cvtColor(np.asarray(_card(sign, (640, 200))), cv2.COLOR_RGB2BGR)
        for _ in range(30):
            writer.write(picture)
    writer.release()
    clip = Attachment(url=path.resolve().as_uri(), kind="video", mime_type="video/mp4")
    return _alice_sends("video", "We made it to the hotel!", datetime(2026, 3, 2, 19, 5), clip)


def _alice_sends(what: str, text: str, at: datetime, attachment: Attachment) -> MessageEvent:
    return MessageEvent(
        event_id=f"demo-alice-{what}-1",
        thread_id="demo-alice",
        user_id="alice",
        platform="demo",
        text=text,
        platform_message_id=f"demo-alice-m-{what}",
        occurred_at=at.replace(tzinfo=UTC),
        attachments=[attachment],
    )


def _print_attachments(c: Container, console: Console, event_ids: list[str]) -> int:
    """The attachments' table; returns how many were not read (the demo's photo and video must be)."""
    table = Table(title="attachments (the message's history text gets a surrogate; derived texts are searchable)")
    for col in ("message text", "status", "derived texts"):
        table.add_column(col, overflow="fold")
    unread = 0
    for text, status, reason, texts in c.progress.attachments(event_ids):
        table.add_row(escape(text), f"{status or 'failed'} {reason}".strip(), escape(texts or ""))
        unread += status != "done"
    console.print(table)
    return unread


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
    rows = c.progress.threads(thread_ids)
    recent = c.progress.messages(thread_ids)
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
    with services.running(settings) as urls, ExitStack() as stack:
        migrate.migrate(urls.database_url, settings.vector_dim)
        console.print(
            f"[bold]chatmem demo[/bold] · postgres {services.shown(urls.database_url)} · "
            f"redis {services.shown(urls.redis_url)}"
        )
        c = Container(settings, urls)
        supervisor = Supervisor()
        try:
            supervisor.start()
            events = [parse_event(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
            files = [stack.enter_context(demo_photo()), stack.enter_context(demo_video())]
            with Publisher.from_settings(settings, urls.redis_url) as pub:
                result = publish_jsonl(pub, SAMPLE, settings)
                pub.publish_many(files)
            events += files
            sent = [e.event_id for e in files]
            console.print(
                f"published {result.accepted} events from {SAMPLE.name}, a photo and a video with text in them"
            )
            thread_ids = sorted({e.thread_id for e in events})
            if not _wait_processed(c, [e.event_id for e in events], thread_ids, timeout):
                console.print(f"[red]not processed within {timeout:.0f}s[/red]; failed: {supervisor.failed()}")
                return 1
            deadline = time.monotonic() + timeout
            # An open episode gets a running summary only every few messages, so only closed
            # episodes' finals are waited for (the photo opens one of a single message).
            while (
                c.progress.closed_without_final(thread_ids)
                + c.progress.fact_work_waiting(thread_ids)
                + c.progress.attachments_waiting(sent)
            ):
                if time.monotonic() > deadline:
                    console.print("[yellow]summaries or facts still pending; showing what is there[/yellow]")
                    break
                time.sleep(0.25)
            _print_memory(c, console, thread_ids)
            _print_episodes(c, console, thread_ids)
            _print_facts(c, console, sorted({e.user_id for e in events}))
            unread = _print_attachments(c, console, sent)
            _answer(c, console, "demo-alice", "alice", DEMO_QUESTION)
            _answer(c, console, "demo-alice", "alice", IMAGE_QUESTION)
            _answer(c, console, "demo-alice", "alice", VIDEO_QUESTION)
            rep = report(c)
            console.print(f"status: {rep.counts} · queues {rep.queues} · largest lag {rep.lag.max_events}")
            code = _print_models(console, rep.models)
            if unread:
                console.print("[red]the photo or the video was not read (its row above says why)[/red]")
            return code or int(bool(unread))
        finally:
            supervisor.stop()
            c.close()
