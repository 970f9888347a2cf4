"""`chatmem bench attachments`: what attachment work costs and whether messages wait for it.

1. OCR images per second (decode + rapidocr + description) on Pillow-drawn images with text, and
   what a minute of video costs (its pictures decoded, then OCR'd);
2. document pages per second (PDF text extraction + structure-aware chunks, then with the
   file summary and embeddings too) on a generated PDF;
3. message latency (publish -> projected with its embedding) for a steady trickle of messages
   while a flood of image attachments is queued, with real processes, in three set-ups side by
   side: no attachments; attachments on their own worker (the default); attachments sharing
   the segment worker (what a single "all queues" worker with one process would do).
Printed, never asserted. Each set-up runs in a scratch database (see bench/ingest.py)."""

from __future__ import annotations

import io
import math
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chatmem.bench.ingest import scratch
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment, MessageEvent
from chatmem.schemas.settings import Settings

WORDS = (
    "invoice total receipt gate seat flight boarding order number date amount paid card station platform "
    "train coach ticket hotel room booking reference customer account balance meeting agenda"
).split()


def text_image(rng: random.Random, size: tuple[int, int] = (900, 420)) -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=28)
    for i in range(5):
        line = " ".join(rng.choice(WORDS).capitalize() for _ in range(4)) + f" {rng.randint(10, 9999)}"
        draw.text((30, 30 + i * 70), line, fill="black", font=font)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def text_pdf(rng: random.Random, pages: int) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    for p in range(pages):
        pdf.add_page()
        pdf.set_font("Helvetica", size=16)
        pdf.cell(0, 10, f"Section {p + 1} {rng.choice(WORDS).capitalize()}", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        for _ in range(4):
            sentence = " ".join(rng.choice(WORDS) for _ in range(60)).capitalize() + "."
            pdf.multi_cell(0, 6, sentence)
            pdf.ln(3)
    return bytes(pdf.output())


def text_video(rng: random.Random, seconds: int, size: tuple[int, int] = (1280, 720), fps: int = 30) -> bytes:
    """An MP4 (MPEG-4 Part 2: the one encoder OpenCV's wheel carries) showing a new card of text
    every 10 s, with a moving bar so no two pictures are alike (as a camera's are not)."""
    import cv2
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="chatmem-bench-video-") as folder:
        path = str(Path(folder) / "video.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter.fourcc(*"mp4v"), fps, size)
        cards = [
            np.asarray(cv2.imdecode(np.frombuffer(text_image(rng, size), np.uint8), cv2.IMREAD_COLOR))
            for _ in range(math.ceil(seconds / 10))
        ]
        for n in range(seconds * fps):
            frame = cards[n // (10 * fps)].copy()
            x = (n * 7) % size[0]
            frame[-40:, x : x + 40] = (0, 0, 255)
            writer.write(frame)
        writer.release()
        return Path(path).read_bytes()


def _video_rows(settings: Settings, analyzer, seconds: int) -> list[tuple[str, str, str]]:  # noqa: ANN001
    from chatmem.adapters.video import OpenCvVideoReader
    from chatmem.memory.attachments import Sniffed
    from chatmem.memory.attachments.analysis import VIDEO_PICTURES_MAX

    data = text_video(random.Random(9), seconds)
    videos = OpenCvVideoReader(settings.attachment_max_pixels)
    t0 = time.perf_counter()
    seen = videos.frames(data, VIDEO_PICTURES_MAX)
    decode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = analyzer(data, Sniffed("video/mp4", "video"), None)
    whole_s = time.perf_counter() - t0
    n = len(seen.pictures)
    shape = f"{seconds} s, 1280×720, 30/s, {len(data) / 1e6:.1f} MB"
    return [
        (f"video ({shape}): pictures decoded", f"{decode_s:.2f} s a video", f"{n} picture{'s' if n != 1 else ''}"),
        (
            f"video ({shape}): decoded + OCR + description",
            f"{whole_s:.2f} s a video",
            f"{1000 * whole_s / max(1, n):.0f} ms a picture, {len(result.texts)} texts",
        ),
    ]


def _throughput(settings: Settings, n_images: int, n_pages: int) -> list[tuple[str, str, str]]:
    from chatmem.adapters.documents import DocumentReader
    from chatmem.adapters.embedders import minilm_embedder
    from chatmem.adapters.video import OpenCvVideoReader
    from chatmem.bootstrap import Container
    from chatmem.memory.attachments import Analyzer, Sniffed, chunk_blocks
    from chatmem.memory.offline_llm import OfflineLLM

    rng = random.Random(5)
    c = Container(settings, start_services=False)  # no database needed: the analyzer alone
    images = [text_image(rng) for _ in range(n_images)]

    embedder = minilm_embedder(settings.embedding_backend)
    analyzer = Analyzer(
        images=c.image_reader,
        ocr=c.ocr,
        documents=DocumentReader(settings.attachment_max_pages, settings.attachment_max_text_chars),
        llm=OfflineLLM(embedder),
        count=c.token_counter.count,
        chunk_tokens=settings.attachment_chunk_tokens,
        videos=OpenCvVideoReader(settings.attachment_max_pixels),
    )
    png = Sniffed("image/png", "image")
    analyzer(images[0], png, None)  # load the OCR models before timing
    t0 = time.perf_counter()
    for img in images:
        analyzer(img, png, None)
    ocr_s = time.perf_counter() - t0

    pdf = text_pdf(rng, n_pages)
    reader = DocumentReader(settings.attachment_max_pages, settings.attachment_max_text_chars)
    t0 = time.perf_counter()
    blocks, _ = reader.read(pdf, "application/pdf")
    chunks = chunk_blocks(blocks, settings.attachment_chunk_tokens, c.token_counter.count)
    extract_s = time.perf_counter() - t0
    embedder.embed(["warm up"])
    t0 = time.perf_counter()
    full = analyzer(pdf, Sniffed("application/pdf", "document"), "bench.pdf")
    embedder.embed([t.text for t in full.texts])
    full_s = time.perf_counter() - t0
    return [
        (
            "OCR images (900×420, 5 lines of text)",
            f"{n_images / ocr_s:.2f} images/s",
            f"{1000 * ocr_s / n_images:.0f} ms",
        ),
        *_video_rows(settings, analyzer, 10),
        *_video_rows(settings, analyzer, 60),
        ("PDF pages: text + chunks", f"{n_pages / extract_s:.1f} pages/s", f"{len(chunks)} chunks"),
        ("PDF pages: + summary + embeddings", f"{n_pages / full_s:.1f} pages/s", f"{len(full.texts)} texts"),
    ]


def _processes(c, attachments: str) -> list[subprocess.Popen]:  # noqa: ANN001
    env = c.settings.as_env()
    commands: list[tuple[str, ...]] = [("ingest",)]
    if attachments == "shared":
        commands.append(("worker", "--queues", "segment,attachments", "--concurrency", "1"))
    else:
        commands.append(("worker", "--queues", "segment", "--concurrency", "1"))
        if attachments == "own worker":
            commands.append(("worker", "--queues", "attachments", "--concurrency", "1"))
    return [
        subprocess.Popen(
            [sys.executable, "-m", "chatmem.api.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for args in commands
    ]


def _wait(predicate, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _count(c, sql: str, *params) -> int:  # noqa: ANN001
    with c.pool.connection() as conn:
        return int(conn.execute(sql, params).fetchone()[0])


def _latency_run(settings: Settings, setup: str, images: list[Path], n_messages: int, rate: float) -> dict[str, Any]:
    with scratch(settings) as c:
        procs = _processes(c, setup)
        pub = Publisher(c.sink, c.settings.resolved_spool_dir)
        at = datetime(2026, 1, 1, tzinfo=UTC)
        try:
            # Warm up: every process has loaded its models once a message and an image went through.
            warm = [MessageEvent(event_id="warm", thread_id="warm", user_id="u", text="hello", occurred_at=at)]
            if setup != "no attachments":
                warm.append(
                    MessageEvent(
                        event_id="warm-img",
                        thread_id="warm-img",
                        user_id="u",
                        text="a photo",
                        occurred_at=at,
                        attachments=[Attachment(url=images[0].as_uri(), kind="image")],
                    )
                )
            pub.publish_many(warm)
            ready = _wait(lambda: _count(c, "SELECT count(*) FROM messages") == len(warm), 180)
            if setup != "no attachments":
                ready = ready and _wait(
                    lambda: _count(c, "SELECT count(*) FROM artifacts WHERE status = 'done'") == 1, 180
                )
            if not ready:
                return {"setup": setup, "error": "workers did not start"}
            flood = []
            if setup != "no attachments":
                flood = [
                    MessageEvent(
                        event_id=f"flood-{i}",
                        thread_id=f"flood-{i % 10}",
                        user_id="u",
                        text="see the picture",
                        occurred_at=at + timedelta(seconds=i),
                        attachments=[Attachment(url=img.as_uri(), kind="image")],
                    )
                    for i, img in enumerate(images[1:])
                ]
                pub.publish_many(flood)
            sent: dict[str, float] = {}
            seen: dict[str, float] = {}
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    with c.pool.connection() as conn:
                        rows = conn.execute("SELECT event_id FROM messages WHERE thread_id LIKE 'probe-%%'").fetchall()
                    now = time.perf_counter()
                    for (event_id,) in rows:
                        seen.setdefault(event_id, now)
                    time.sleep(0.01)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t_start = time.perf_counter()
            for i in range(n_messages):
                event = MessageEvent(
                    event_id=f"probe-{i}",
                    thread_id=f"probe-{i % 10}",
                    user_id="u",
                    text=f"message {i} about the train booking and the hotel room",
                    occurred_at=at + timedelta(seconds=i),
                )
                sent[event.event_id] = time.perf_counter()
                pub.publish(event)
                time.sleep(max(0.0, t_start + (i + 1) / rate - time.perf_counter()))
            _wait(lambda: len(seen) >= n_messages, 600)
            stop.set()
            watcher.join()
            settled = "SELECT count(*) FROM artifacts WHERE status IN ('done', 'failed')"
            done = bool(flood) and _wait(lambda: _count(c, settled) == len(images), 900)
            drained = time.perf_counter() - t_start
            latencies = sorted(1000 * (seen[e] - sent[e]) for e in sent if e in seen)
            q = statistics.quantiles(latencies, n=20) if len(latencies) >= 2 else latencies * 19
            return {
                "setup": setup,
                "p50": statistics.median(latencies),
                "p95": q[18],
                "max": latencies[-1],
                "flood": len(flood),
                "drained": drained if (flood and done) else 0.0,
            }
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)


def run(
    settings: Settings,
    console: Console,
    *,
    images: int = 20,
    pages: int = 40,
    flood: int = 40,
    messages: int = 100,
    rate: float = 10.0,
) -> None:
    console.print("[bold]chatmem bench attachments[/bold] (this machine, offline providers)")
    table = Table(title="attachment work in one process")
    for col in ("work", "rate", "per item / output"):
        table.add_column(col)
    for row in _throughput(settings, images, pages):
        table.add_row(*row)
    console.print(table)

    rng = random.Random(11)
    folder = Path(tempfile.mkdtemp(prefix="chatmem-bench-images-"))
    paths = []
    for i in range(flood + 1):
        path = folder / f"img-{i}.png"
        path.write_bytes(text_image(rng))
        paths.append(path)
    results = [
        _latency_run(settings, setup, paths, messages, rate) for setup in ("no attachments", "own worker", "shared")
    ]
    table = Table(
        title=f"message latency, {messages} messages at {rate:g}/s while {flood} images are queued "
        "(publish -> projected)"
    )
    for col in ("attachments worker", "p50 ms", "p95 ms", "max ms", "p95 vs none", "images drained after"):
        table.add_column(col)
    base = results[0].get("p95") or 0
    for r in results:
        if "error" in r:
            table.add_row(str(r["setup"]), r["error"], "", "", "", "")
            continue
        drained = f"{r['drained']:.1f} s" if r["drained"] else "-"
        ratio = f"{r['p95'] / base:.1f}×" if base else "-"
        table.add_row(str(r["setup"]), f"{r['p50']:.0f}", f"{r['p95']:.0f}", f"{r['max']:.0f}", ratio, drained)
    console.print(table)
