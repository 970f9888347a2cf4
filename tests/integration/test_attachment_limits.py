"""Hostile attachments on the real stack: decompression bombs (a 50,000×50,000 image, a PDF of
100,000 pages, a page tree or content nested too deeply, a stream that inflates past the limit)
and a document that takes too long to read. Each fails at once with a reason, the reading
happens in a helper process that is killed past its time limit, and the worker takes the next
job. Files are built here, byte by byte where the libraries would refuse to write them."""

import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import asdict

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from chatmem.adapters.analysis_runner import IsolatedReader, ReaderFailed, ReaderSpec
from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.memory.attachments import BadFile, Sniffed
from chatmem.schemas.events import Attachment
from tests.conftest import ROOT, scalar, wait_for
from tests.integration.test_attachments import REPORT, message, message_text, put, text_pdf
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration
PLAIN = Sniffed("text/plain", "document")

# --- files ---------------------------------------------------------------------------------------


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width`×`height` (1 bit per pixel) and holds almost nothing."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1024)) + chunk(b"IEND", b"")
    )


def raw_pdf(objects: dict[int, bytes]) -> bytes:
    """A PDF of these numbered objects (1 is the catalog), with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n"
    xref, size = len(out), max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for number in range(1, size):
        out += b"%010d 00000 n \n" % offsets[number] if number in offsets else b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
PAGE = b"<< /Type /Page /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>"
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
HELLO = b"BT /F1 12 Tf 72 700 Td (Hello) Tj ET"


def stream(data: bytes, *, deflate: bool = False) -> bytes:
    if deflate:
        data = zlib.compress(data, 9)
    return (
        b"<< /Length %d%s >>\nstream\n" % (len(data), b" /Filter /FlateDecode" if deflate else b"")
        + data
        + (b"\nendstream")
    )


def one_page(content: bytes, *, deflate: bool = False) -> bytes:
    return raw_pdf(
        {
            1: CATALOG,
            2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            3: PAGE,
            4: stream(content, deflate=deflate),
            5: FONT,
        }
    )


def page_dag(levels: int, declared: int) -> bytes:
    """10**levels pages in a 1.5 KB file: each level of the page tree lists the one below ten
    times. `declared` is what the root's /Count says."""
    objects = {1: CATALOG, 3: PAGE, 4: stream(HELLO), 5: FONT}
    below = b"3 0 R"
    for level in range(levels):
        objects[10 + level] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join([below] * 10), 10 ** (level + 1))
        below = b"%d 0 R" % (10 + level)
    objects[2] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (below, declared)
    return raw_pdf(objects)


def deep_page_tree(depth: int) -> bytes:
    objects = {1: CATALOG, 3: PAGE, 4: stream(HELLO), 5: FONT}
    below = b"3 0 R"
    for level in range(depth):
        objects[10 + level] = b"<< /Type /Pages /Kids [%s] /Count 1 >>" % below
        below = b"%d 0 R" % (10 + level)
    objects[2] = b"<< /Type /Pages /Kids [%s] /Count 1 >>" % below
    return raw_pdf(objects)


def slow_pdf(operations: int = 200_000) -> bytes:
    """One page whose (deflated, 20 KB) content stream sets the text matrix and shows a letter
    `operations` times: valid, within pypdf's parsing budget, and tens of seconds of extraction."""
    return one_page(b"BT /F1 12 Tf " + b"1 0 0 1 72 700 Tm (x) Tj " * operations + b"ET", deflate=True)


# --- the stack -----------------------------------------------------------------------------------


@pytest.fixture
def limited(settings_factory):
    settings = settings_factory(
        attachment_max_pdf_pages=1000, attachment_max_decoded_bytes=10_000_000, attachment_analysis_timeout_s=3.0
    )
    c = Container(settings, ServiceUrls(settings.database_url, settings.redis_url, False, False))
    yield c
    c.close()


def reasons(c: Container) -> dict[str, str]:
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT a.event_id, coalesce(a.reason, ar.reason, ar.status) FROM attachments a
               LEFT JOIN artifacts ar ON ar.sha256 = a.sha256"""
        ).fetchall()
    return dict(rows)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_bombs_fail_at_once_with_a_reason_and_the_next_file_is_read(limited, tmp_path):
    cases = [
        ("a 50,000×50,000 image", png_header(50_000, 50_000), "image is 2,500,000,000 pixels, above the limit of"),
        ("100,000 pages", page_dag(5, 100_000), "the PDF has 100,000 pages, above the limit of 1,000"),
        ("a /Count that lies", page_dag(5, 1), "the PDF has more than 1,000 pages"),
        ("a deep page tree", deep_page_tree(1000), "nests its objects too deeply"),
        ("deeply nested content", one_page(HELLO[:-3] + b"[" * 100_000 + b"]" * 100_000 + b" TJ ET"), "too deeply"),
        ("a deflate bomb", one_page(b"BT (" + b"A" * 30_000_000 + b") Tj ET", deflate=True), "more than 10,000,000 b"),
    ]
    assert all(len(data) < 300_000 for _, data, _ in cases)  # small files, all of them
    driver = Driver(limited)
    events = [
        message("bombs", "alice", n, name, [Attachment(url=put(tmp_path, f"{n}.bin", data))])
        for n, (name, data, _) in enumerate(cases, start=1)
    ]
    events.append(message("bombs", "alice", 99, "the plan", [Attachment(url=put(tmp_path, "p.pdf", text_pdf(REPORT)))]))
    driver.publish(events)
    driver.advance("bombs")
    # Refused up front: a bomb worked through would pass the 3 s limit and fail for that instead.
    assert driver.run_attachments() == ["failed"] * len(cases) + ["done"]
    found = reasons(limited)
    for n, (name, _, expected) in enumerate(cases, start=1):
        assert expected in found[f"bombs-{n}"], (name, found[f"bombs-{n}"])
        assert message_text(limited, f"bombs-{n}").endswith("(not readable)"), name
    assert "3 pages" in message_text(limited, "bombs-99")


def test_a_document_that_reads_too_long_is_stopped_and_the_worker_takes_the_next_job(limited, tmp_path):
    """The real path: the production reader in its helper process, a real PDF that would take
    tens of seconds, a limit of 3 s."""
    driver = Driver(limited)
    slow, plan = put(tmp_path, "slow.pdf", slow_pdf()), put(tmp_path, "plan.pdf", text_pdf(REPORT))
    driver.publish(
        [
            message("slow", "alice", 1, "a heavy one", [Attachment(url=slow, kind="document")]),
            message("slow", "alice", 2, "the plan", [Attachment(url=plan, kind="document")]),
        ]
    )
    driver.advance("slow")
    reader = limited.analysis_reader
    first = reader.start()  # the OCR models load here, outside any job's time
    started = time.monotonic()
    assert driver.run_attachments() == ["failed", "done"]
    assert time.monotonic() - started < 20
    assert reasons(limited)["slow-1"] == "analysis took longer than 3 s; it was stopped"
    assert not alive(first)  # killed, and reaped
    assert reader.pid is not None and reader.pid != first  # a fresh helper read the next file
    assert message_text(limited, "slow-1").endswith("(not readable)")
    assert "3 pages" in message_text(limited, "slow-2")
    assert scalar(limited, "SELECT count(*) FROM artifacts WHERE status = 'done'") == 1


SCRIPTED = ReaderSpec(
    1_000_000, 960, 1, 10, 10_000, 10, 1_000_000, preload_ocr=False, factory="tests.fakes:scripted_reader"
)


def scripted(timeout_s: float = 1.0) -> IsolatedReader:
    return IsolatedReader(SCRIPTED, timeout_s)


@pytest.fixture
def importable_tests(monkeypatch):
    # The helper imports the scripted reader from tests/, wherever pytest was started.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def test_the_celery_task_records_a_hang_or_a_crash_and_its_process_takes_the_next_task(
    limited, tmp_path, monkeypatch, importable_tests
):
    """A reader that hangs or kills its own process, injected through the Read port, behind the
    real `process_attachment` task run in this process (this process is the worker)."""
    from chatmem.workers import tasks

    reader = scripted()
    monkeypatch.setitem(limited.__dict__, "analysis_reader", reader)
    monkeypatch.setitem(tasks._wirings, os.getpid(), limited)
    driver = Driver(limited)
    files = {"hang": b"hang on", "crash": b"crash now", "oops": b"oops, a bug", "fine": b"fine words here"}
    driver.publish(
        [
            message("t", "alice", n, name, [Attachment(url=put(tmp_path, name + ".txt", data))])
            for n, (name, data) in enumerate(files.items(), start=1)
        ]
    )
    driver.advance("t")
    assert [e for e, _ in driver.attachments] == ["t-1", "t-2", "t-3", "t-4"]

    def run(event_id: str) -> dict:
        return tasks.process_attachment.apply(args=[event_id, 0]).get()

    first = reader.start()
    assert run("t-1")["outcome"] == "failed"
    assert not alive(first)
    second = reader.start()
    assert run("t-2")["outcome"] == "failed"
    assert not alive(second)
    with pytest.raises(ReaderFailed, match="ZeroDivisionError"):  # a bug is not the file's fault
        run("t-3")
    assert scalar(
        limited, "SELECT a.status FROM artifacts a JOIN attachments r USING (sha256) WHERE r.event_id = 't-3'"
    ) == (
        "pending"  # released for a retry
    )
    assert run("t-4")["outcome"] == "done"
    found = reasons(limited)
    assert found["t-1"] == "analysis took longer than 1 s; it was stopped"
    assert found["t-2"] == "the reading process died while reading this file (killed by SIGSEGV)"
    assert found["t-4"] == "done"
    assert "fine words here" in scalar(limited, "SELECT text FROM artifact_text WHERE kind = 'chunk'")


def test_the_helper_is_replaced_after_a_timeout_and_exits_with_its_worker(importable_tests):
    reader = scripted(timeout_s=0.5)
    try:
        assert reader(b"fine", PLAIN).blocks[0].text == "fine"
        first = reader.pid
        with pytest.raises(BadFile, match=r"analysis took longer than 0.5 s"):
            reader(b"hang", PLAIN)
        assert reader.pid is None and not alive(first)
        with pytest.raises(BadFile, match="scripted bad file"):  # a BadFile from the reader crosses as is
            reader(b"bad", PLAIN)
        assert reader(b"again", PLAIN).meta["pid"] == reader.pid != first
        # Celery's soft time limit arrives as an exception in the middle of a read: the helper,
        # still busy, is stopped, so its late answer cannot be taken for the next file's.
        busy = reader.pid

        def soft_limit(signum, frame):
            raise SoftTimeLimitExceeded()

        previous = signal.signal(signal.SIGALRM, soft_limit)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(SoftTimeLimitExceeded):
                reader.timeout_s = 30
                reader(b"hang", PLAIN)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert reader.pid is None and not alive(busy)
        assert reader(b"next", PLAIN).blocks[0].text == "next"
    finally:
        reader.close()
    assert reader.pid is None

    # A worker killed in the middle of a read takes its helper with it.
    script = (
        "from chatmem.adapters.analysis_runner import IsolatedReader, ReaderSpec\n"
        "from chatmem.memory.attachments import Sniffed\n"
        f"reader = IsolatedReader(ReaderSpec(**{asdict(SCRIPTED)!r}), 600)\n"
        "print(reader.start(), flush=True)\n"
        "reader(b'hang', Sniffed('text/plain', 'document'))\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        helper = int(worker.stdout.readline())
        assert alive(helper)
        time.sleep(0.3)  # the hanging read is under way
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        assert wait_for(lambda: not alive(helper), timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()


def test_pillow_and_pypdf_limits_come_from_the_settings(monkeypatch):
    from PIL import Image

    from chatmem.adapters.documents import DocumentReader
    from chatmem.adapters.images import PillowImageReader

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored afterwards
    # Pillow's own ceiling (2 × MAX_IMAGE_PIXELS) never stands below the configured limit.
    PillowImageReader(400_000_000)
    assert Image.MAX_IMAGE_PIXELS >= 400_000_000
    with pytest.raises(BadFile, match=r"image is 7000×7000 \(49,000,000 pixels\), above the limit of 40,000,000"):
        PillowImageReader(40_000_000).inspect(png_header(7000, 7000))
    # Within the limit the same bytes are only corrupt (their pixel data is missing).
    with pytest.raises(BadFile, match="corrupt image"):
        PillowImageReader(50_000_000).inspect(png_header(7000, 7000))

    bomb = one_page(b"BT (" + b"A" * 3_000_000 + b") Tj ET", deflate=True)
    assert DocumentReader(10, 10_000_000, max_decoded_bytes=5_000_000).read(bomb, "application/pdf")[1]["pages"] == 1
    with pytest.raises(BadFile, match="decompresses to more than 1,000,000 bytes"):
        DocumentReader(10, 10_000_000, max_decoded_bytes=1_000_000).read(bomb, "application/pdf")
    with pytest.raises(BadFile, match="decompresses to more than 1,000,000 bytes"):
        DocumentReader(10, 10_000_000, max_decoded_bytes=1_000_000).page_images(bomb, 5)
    hundred = page_dag(2, 100)  # 100 pages: read up to max_pages below the refusal limit
    blocks, meta = DocumentReader(3, 10_000, max_pdf_pages=100).read(hundred, "application/pdf")
    assert (meta["pages"], meta["pages_read"], len(blocks)) == (100, 3, 3)
    with pytest.raises(BadFile, match="the PDF has 100 pages, above the limit of 99"):
        DocumentReader(3, 10_000, max_pdf_pages=99).read(hundred, "application/pdf")
