"""`chatmem bench soak --minutes N`: a steady mixed load on the whole stack (the processes
`chatmem up` runs) for N minutes: messages on many threads, edits of some of them, images with
text, and the reads a bot makes on each turn (recall, build_context). Every interval it prints
the resident memory of each process (with its worker pool), the largest thread lag, the queue
depths and read latencies, so leaks and slow drift show as trends. Printed, never asserted.
Runs in a scratch database and Redis db (see bench/ingest.py)."""

from __future__ import annotations

import io
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import psutil
from rich.console import Console
from rich.table import Table

from chatmem.adapters.celery_queue import queue_depths
from chatmem.bench.host import machine
from chatmem.bench.ingest import scratch
from chatmem.bench.pipeline import TOPICS
from chatmem.bootstrap import Container
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment, AttachmentKind, MessageEditedEvent, MessageEvent
from chatmem.schemas.settings import Settings
from chatmem.status import largest_lag
from chatmem.workers.supervisor import DEFAULT_PROCESSES, Supervisor


@dataclass
class Sample:
    minute: float
    published: int  # events: messages and edits
    stored: int
    lag: int
    queues: dict[str, int]
    rss_mb: dict[str, float]
    recall_ms: float
    context_ms: float


def _image(settings: Settings, n: int) -> Attachment:
    """A small PNG with a line of text, as a file a bot saved."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (600, 120), "white")
    ImageDraw.Draw(img).text(
        (20, 40), f"Receipt {n} total {n % 97}.50 EUR", fill="black", font=ImageFont.load_default(size=28)
    )
    path = settings.data_dir / "soak" / f"img-{n}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return Attachment(url=path.resolve().as_uri(), kind=AttachmentKind.IMAGE, mime_type="image/png")


def _rss_mb(sup: Supervisor) -> dict[str, float]:
    """Resident memory of each child with its own children (a Celery worker's pool)."""
    out: dict[str, float] = {}
    for child in sup.children:
        if child.proc is None or child.proc.poll() is not None:
            out[child.name] = 0.0
            continue
        try:
            proc = psutil.Process(child.proc.pid)
            total = proc.memory_info().rss + sum(p.memory_info().rss for p in proc.children(recursive=True))
        except psutil.Error:
            total = 0
        out[child.name] = total / 2**20
    return out


def _stored(c: Container) -> int:
    with c.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def _label(command: str) -> str:
    """'worker --queues segment,summarize,...' -> 'worker:segment+'."""
    parts = command.split()
    if parts[0] == "worker" and len(parts) > 2:
        queues = parts[2].split(",")
        return f"worker:{queues[0]}" + ("+" if len(queues) > 1 else "")
    return parts[0]


class _Reads:
    """The reads a bot makes on a turn, once a second on a thread of their own, so a slow read
    never slows the write load."""

    def __init__(self, c: Container, words: list[str], threads: int):
        self.c, self.words, self.threads = c, words, threads
        self.recall_ms: list[float] = []
        self.context_ms: list[float] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-reads", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = random.Random(13)
        while not self.stop.wait(1.0):
            started = time.perf_counter()
            self.c.recall("soak-user", " ".join(rng.choices(self.words, k=4)), limit=10)
            self.recall_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            try:
                query = " ".join(rng.choices(self.words, k=4))
                self.c.build_context(f"soak-{rng.randrange(self.threads)}", "soak-user", query=query)
            except Exception:  # noqa: S112 - a thread with nothing applied yet is not readable
                continue
            self.context_ms.append((time.perf_counter() - started) * 1000)

    def take(self) -> tuple[float, float]:
        recall, context = self.recall_ms, self.context_ms
        self.recall_ms, self.context_ms = [], []
        return (statistics.median(recall) if recall else 0.0, statistics.median(context) if context else 0.0)


def run(
    settings: Settings,
    console: Console,
    *,
    minutes: float = 10.0,
    rate: float = 10.0,
    threads: int = 50,
    samples: int = 10,
) -> list[Sample]:
    words = [w for text in TOPICS.values() for w in text.split()]
    rng = random.Random(11)
    # A SIGTERM ends the load early, like its time running out: the stack is stopped (it would
    # otherwise outlive this process) and the samples so far are printed.
    ending = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: ending.set())
    with scratch(settings) as c:
        log = c.settings.data_dir / "soak.log"
        sup = Supervisor(DEFAULT_PROCESSES, env=c.settings.as_env(), output=log)
        sup.start()
        results: list[Sample] = []
        reads = _Reads(c, words, threads)
        try:
            with Publisher.from_settings(c.settings) as pub:
                t0 = time.monotonic()
                interval = minutes * 60 / samples
                next_sample, n, edits = t0 + interval, 0, 0
                while time.monotonic() - t0 < minutes * 60 and not ending.is_set():
                    second = time.monotonic()
                    sup.check()
                    for _ in range(max(1, int(rate))):
                        n += 1
                        thread = f"soak-{rng.randrange(threads)}"
                        text = " ".join(rng.choices(words, k=rng.randint(5, 18)))
                        attachments = [_image(c.settings, n)] if n % 50 == 0 else []
                        pub.publish_nowait(
                            MessageEvent(
                                event_id=f"soak-{n}", thread_id=thread, user_id="soak-user", text=text,
                                platform_message_id=str(n), attachments=attachments,
                            )
                        )  # fmt: skip
                        if n % 10 == 0:
                            edit = MessageEditedEvent(
                                event_id=f"soak-{n}-edit", thread_id=thread, user_id="soak-user",
                                platform_message_id=str(n), text=text + " (edited)",
                            )  # fmt: skip
                            pub.publish_nowait(edit)
                            edits += 1
                    if time.monotonic() >= next_sample:
                        recall_ms, context_ms = reads.take()
                        results.append(
                            Sample(
                                minute=(time.monotonic() - t0) / 60,
                                published=n + edits,
                                stored=_stored(c),
                                lag=largest_lag(c).max_events,
                                queues=queue_depths(c.celery),
                                rss_mb={_label(k): v for k, v in _rss_mb(sup).items()},
                                recall_ms=recall_ms,
                                context_ms=context_ms,
                            )
                        )
                        while next_sample <= time.monotonic():
                            next_sample += interval
                    time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
        finally:
            reads.stop.set()
            restarts = {_label(ch.name): ch.restarts for ch in sup.children}
            sup.stop()
            signal.signal(signal.SIGTERM, previous)
    _print(console, results, restarts, minutes, rate, threads)
    return results


def _print(
    console: Console, results: list[Sample], restarts: dict[str, int], minutes: float, rate: float, threads: int
) -> None:
    console.print(
        f"[bold]chatmem bench soak[/bold] · {datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {machine()}"
        f" · {minutes:g} min at {rate:g} msg/s over {threads} threads"
        " (every 10th message edited, every 50th with an image; recall + build_context every second)"
    )
    if not results:
        console.print("no samples (run longer)")
        return
    names = list(results[0].rss_mb)
    table = Table(title="over time (RSS in MiB per process, its worker pool included)")
    for col in ("min", "published", "stored", "max lag", "queued", "recall p50 ms", "context p50 ms", *names):
        table.add_column(col, justify="right")
    for s in results:
        table.add_row(
            f"{s.minute:.1f}", str(s.published), str(s.stored), str(s.lag), str(sum(s.queues.values())),
            f"{s.recall_ms:.1f}", f"{s.context_ms:.1f}", *(f"{s.rss_mb[n]:.0f}" for n in names),
        )  # fmt: skip
    console.print(table)
    first, last = results[0], results[-1]
    drift = ", ".join(f"{n}: {last.rss_mb[n] - first.rss_mb[n]:+.0f} MiB" for n in names)
    console.print(f"RSS from the first to the last sample: {drift}")
    console.print(f"restarts during the run: {restarts}")
