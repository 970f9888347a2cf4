"""Attachments on the real stack: real OCR (rapidocr), real PDF parsing, Postgres + pgvector,
the real embedder. Files are made here (Pillow, fpdf2) and sent as file:// or data: URLs."""

import base64
import io
import re
import subprocess
import sys
import zipfile
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import docx
import numpy as np
import odfdo
import openpyxl
import pptx
import pytest
import xlwt
from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFont
from pptx.util import Inches
from pypdf import PdfReader, PdfWriter

from chatmem.adapters.documents import DocumentReader
from chatmem.adapters.images import PillowImageReader, RapidOcr, guess_binary
from chatmem.memory.attachments import Analysis, BadFile, DerivedText, Reader
from chatmem.memory.attachments.filetypes import (
    DOC_MIME,
    DOCX_MIME,
    PPT_MIME,
    PPTX_MIME,
    XLS_MIME,
    XLSX_MIME,
    Sniffed,
    sniff,
)
from chatmem.memory.ports import TransientError
from chatmem.schemas.events import Attachment, MessageEvent
from chatmem.schemas.read import Scope
from tests import emulator, office97
from tests.conftest import scalar
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


def text_image(lines: list[str], size=(900, 420)) -> bytes:
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=30)
    for i, line in enumerate(lines):
        draw.text((30, 30 + i * 60), line, fill="black", font=font)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def saved(document: Any) -> bytes:
    """A document made by python-docx, python-pptx or odfdo, as the file it saves."""
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def text_pdf(sections: list[tuple[str, str]]) -> bytes:
    pdf = FPDF()
    for heading, body in sections:
        pdf.add_page()
        pdf.set_font("Helvetica", size=16)
        pdf.cell(0, 10, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        pdf.multi_cell(0, 6, body)
    return bytes(pdf.output())


TICKET = ["Boarding pass", "Flight LH 1234 to Lisbon", "Gate B17 seat 14C", "Departure 09:45"]
REPORT = [
    ("Budget Overview", "The office budget for next year was approved by the board. " * 5),
    ("Hiring Plan", "We will hire two engineers in spring and one designer in autumn. " * 5),
    ("Travel Policy", "Employees travelling to the Porto conference book trains, not flights. " * 5),
]


def put(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return path.as_uri()


def message(thread, user, n, text, attachments=(), minutes=0):
    return MessageEvent(
        event_id=f"{thread}-{n}",
        thread_id=thread,
        user_id=user,
        text=text,
        platform_message_id=f"{thread}-m{n}",
        occurred_at=T0 + timedelta(minutes=minutes or n),
        attachments=list(attachments),
    )


def message_text(c, event_id):
    return scalar(c, "SELECT text FROM messages WHERE event_id = %s", event_id)


@pytest.fixture
def driver(container):
    return Driver(container)


def test_image_text_is_read_by_ocr_and_found_by_recall(driver, container, tmp_path):
    url = put(tmp_path, "ticket.png", text_image(TICKET))
    driver.publish(
        [
            message("trip", "alice", 1, "here is my ticket", [Attachment(url=url, kind="image", caption="my ticket")]),
            message("trip", "alice", 2, "thanks"),
        ]
    )
    driver.advance("trip")
    # The message is projected at once, with a placeholder, before any OCR runs.
    assert message_text(container, "trip-1") == "here is my ticket\n[image] my ticket"
    assert driver.run_attachments() == ["done"]
    ocr = scalar(container, "SELECT string_agg(text, ' ') FROM artifact_text WHERE kind = 'ocr'")
    assert "Lisbon" in ocr and "B17" in ocr
    sha = scalar(container, "SELECT sha256 FROM artifacts")
    text = message_text(container, "trip-1")
    assert text.startswith(f"here is my ticket\n[image#{sha[:8]}] my ticket — PNG image, 900×420 with the text")
    assert "Lisbon" in text
    with container.pool.connection() as conn:
        kinds = {r[0] for r in conn.execute("SELECT kind FROM artifact_text")}
    assert kinds == {"ocr", "user_caption"}
    assert scalar(container, "SELECT count(*) FROM artifact_text WHERE embedding IS NULL") == 0

    hits = container.recall("alice", "which gate does my flight leave from", scope=Scope.ARTIFACTS).hits
    assert hits and hits[0].kind == "artifact"
    assert "B17" in hits[0].snippet
    cit = hits[0].citation
    assert (cit.thread_id, cit.event_id, cit.platform_message_id, cit.seq) == ("trip", "trip-1", "trip-m1", 1)
    assert cit.artifact_id == sha
    everything = container.recall("alice", "flight to Lisbon gate", scope=Scope.ALL).hits
    assert any(h.citation.event_id == "trip-1" for h in everything[:3])


def encrypted(pdf: bytes) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.encrypt("secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def bomb() -> bytes:
    out = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(out, "PNG")  # 100M pixels in a few kilobytes
    return out.getvalue()


def test_a_pdf_is_chunked_by_section_summarised_and_found(driver, container, tmp_path):
    url = put(tmp_path, "plan.pdf", text_pdf(REPORT))
    driver.publish([message("work", "alice", 1, "the plan for next year", [Attachment(url=url, kind="document")])])
    driver.advance("work")
    assert driver.run_attachments() == ["done"]
    with container.pool.connection() as conn:
        chunks = conn.execute("SELECT text, meta FROM artifact_text WHERE kind = 'chunk' ORDER BY ord").fetchall()
        summary = conn.execute("SELECT text FROM artifact_text WHERE kind = 'file_summary'").fetchone()[0]
        meta = conn.execute("SELECT meta FROM artifacts").fetchone()[0]
    assert [(c[1]["section"], c[1]["page"]) for c in chunks] == [
        ("Budget Overview", 1),
        ("Hiring Plan", 2),
        ("Travel Policy", 3),
    ]
    assert chunks[2][0].startswith("Travel Policy\nEmployees travelling to the Porto conference")
    assert summary and meta["pages"] == 3
    assert re.search(r"\[file#[0-9a-f]{8}\] 3 pages: ", message_text(container, "work-1"))

    hits = container.recall("alice", "how do we get to the Porto conference?", scope=Scope.ARTIFACTS).hits
    assert hits[0].citation.event_id == "work-1" and hits[0].citation.artifact_text == "chunk"
    assert "p. 3" in hits[0].snippet and "trains" in hits[0].snippet


def scanned_pdf(lines: list[str]) -> bytes:
    page = Image.open(io.BytesIO(text_image(lines, size=(1240, 900))))
    out = io.BytesIO()
    page.save(out, "PDF")
    return out.getvalue()


def test_a_scanned_pdf_is_read_by_ocr(driver, container, tmp_path):
    url = put(tmp_path, "lease.pdf", scanned_pdf(["Lease agreement", "Monthly rent 950 EUR", "Due on the first"]))
    driver.publish([message("home", "alice", 1, "the lease", [Attachment(url=url, kind="document")])])
    driver.advance("home")
    assert driver.run_attachments() == ["done"]
    assert scalar(container, "SELECT meta ->> 'ocr_pages' FROM artifacts") == "1"
    hit = container.recall("alice", "how much is the monthly rent?", scope=Scope.ARTIFACTS).hits[0]
    assert "950" in hit.snippet and hit.citation.event_id == "home-1"
    assert "Monthly rent 950 EUR" in scalar(container, "SELECT text FROM artifact_text WHERE kind = 'chunk'")


def test_the_same_bytes_in_two_threads_are_stored_once_and_referenced_twice(driver, container, tmp_path):
    png = text_image(["Wifi password", "sunflower42"])
    # One by file://, one by data: URI: the bytes are what counts.
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    driver.publish(
        [
            message("a", "alice", 1, "wifi", [Attachment(url=put(tmp_path, "w.png", png), kind="image")]),
            message("b", "bob", 1, "our wifi", [Attachment(url=data_url, kind="image", caption="office wifi")]),
        ]
    )
    driver.advance("a")
    driver.advance("b")
    assert driver.run_attachments() == ["done", "artifact done"]  # analysed once
    assert scalar(container, "SELECT count(*) FROM artifacts") == 1
    assert scalar(container, "SELECT count(DISTINCT sha256) FROM attachments WHERE status = 'linked'") == 1
    assert scalar(container, "SELECT count(*) FROM attachments") == 2
    assert scalar(container, "SELECT count(*) FROM artifact_text WHERE kind = 'ocr'") == 1
    blobs = [p for p in container.settings.resolved_blob_dir.rglob("*") if p.is_file()]
    assert len(blobs) == 1 and blobs[0].read_bytes() == png
    sha = scalar(container, "SELECT sha256 FROM artifacts")
    assert f"[image#{sha[:8]}]" in message_text(container, "a-1")
    assert f"[image#{sha[:8]}] office wifi — PNG image" in message_text(container, "b-1")
    for user, thread in (("alice", "a"), ("bob", "b")):
        hit = container.recall(user, "wifi password", scope=Scope.ARTIFACTS).hits[0]
        assert hit.citation.thread_id == thread and "sunflower42" in hit.snippet
    # A worker whose claim expired and that finishes late changes nothing.
    description = scalar(container, "SELECT description FROM artifacts")
    container.attachment_store.finish(sha, Analysis("stale", [DerivedText("ocr", 9, "stale")], {}), np.ones((1, 384)))
    container.attachment_store.fail_artifact(sha, "late failure")
    assert scalar(container, "SELECT status || ':' || description FROM artifacts") == f"done:{description}"
    assert scalar(container, "SELECT count(*) FROM artifact_text WHERE text = 'stale'") == 0


def test_every_bad_file_fails_with_a_reason_and_its_thread_goes_on(driver, container, tmp_path):
    pdf = text_pdf(REPORT[:1])
    png = text_image(TICKET)
    cases = [
        ("corrupt image", Attachment(url=put(tmp_path, "c.png", png[: len(png) // 2])), "corrupt image"),
        ("not an image", Attachment(url=put(tmp_path, "n.png", png[:16] + bytes(range(256)) * 8)), "not an image"),
        ("encrypted PDF", Attachment(url=put(tmp_path, "e.pdf", encrypted(pdf))), "encrypted"),
        ("broken PDF", Attachment(url=put(tmp_path, "b.pdf", pdf[:400])), "broken PDF"),
        ("decompression bomb", Attachment(url=put(tmp_path, "bomb.png", bomb())), "100,000,000 pixels"),
        (
            "wrong declared type",
            Attachment(url=put(tmp_path, "x.png", pdf), kind="image", mime_type="image/png"),
            "declared as image/png but the bytes are application/pdf",
        ),
        ("unreachable URL", Attachment(url="https://files.invalid/a.png"), "gave up after retries: cannot resolve"),
        ("private address", Attachment(url="https://127.0.0.1/a.png"), "private address"),
        ("missing file", Attachment(url=(tmp_path / "nope.png").as_uri()), "file not found"),
        ("unknown binary", Attachment(url=put(tmp_path, "r.bin", bytes(range(256)) * 4)), "unknown type"),
    ]
    events = [message("bad", "alice", n, name, [att]) for n, (name, att, _) in enumerate(cases, start=1)]
    events.append(message("bad", "alice", len(cases) + 1, "and a plain message after them"))
    driver.publish(events)
    driver.advance("bad")
    # Every message is in the history, none waits for its file.
    assert scalar(container, "SELECT count(*) FROM messages WHERE thread_id = 'bad'") == len(cases) + 1
    queued = list(driver.attachments)
    # Only the transient failure is retried: the first attempt raises it, the others fail at once.
    job = container.attachment_job()
    transient = []
    for event_id, position in queued:
        try:
            assert job(event_id, position) == "failed"
        except TransientError:
            transient.append((event_id, position))
    assert transient == [(f"bad-{[c[0] for c in cases].index('unreachable URL') + 1}", 0)]
    assert job(*transient[0], last_attempt=True) == "failed"
    with container.pool.connection() as conn:
        rows = conn.execute(
            """SELECT a.event_id, coalesce(a.reason, ar.reason) FROM attachments a
               LEFT JOIN artifacts ar ON ar.sha256 = a.sha256 ORDER BY a.created_at, a.event_id"""
        ).fetchall()
    reasons = dict(rows)
    for n, (name, _, expected) in enumerate(cases, start=1):
        assert expected in (reasons.get(f"bad-{n}") or ""), (name, reasons.get(f"bad-{n}"))
        assert message_text(container, f"bad-{n}").endswith("(not readable)"), name
    assert message_text(container, f"bad-{len(cases) + 1}") == "and a plain message after them"


def test_attachments_are_isolated_between_users_and_reach_the_context(driver, container, tmp_path):
    url = put(tmp_path, "ticket.png", text_image(TICKET))
    driver.publish(
        [
            message("trip", "alice", 1, "my boarding pass", [Attachment(url=url, kind="image")]),
            message("laptops", "bob", 1, "which laptop should I buy?"),
        ]
    )
    for thread in ("trip", "laptops"):
        driver.advance(thread)
    driver.run_attachments()
    assert container.recall("alice", "Lisbon flight gate", scope=Scope.ARTIFACTS).hits
    assert container.recall("bob", "Lisbon flight gate", scope=Scope.ARTIFACTS).hits == []
    assert all(h.citation.thread_id == "laptops" for h in container.recall("bob", "Lisbon flight gate B17").hits)

    about = container.build_context("trip", "alice", "what gate was on the boarding pass photo?")
    section = next(s for s in about.sections if s.name == "artifacts")
    assert section.items and "B17" in section.items[0].text
    assert section.items[0].citation.artifact_id
    other = container.build_context("trip", "alice", "what time is it in Lisbon?")
    assert not next(s for s in other.sections if s.name == "artifacts").items
    bob = container.build_context("laptops", "bob", "what was on the boarding pass photo?")
    assert not next(s for s in bob.sections if s.name == "artifacts").items


def test_a_replay_keeps_the_surrogates_without_analysing_again(driver, container, tmp_path):

    url = put(tmp_path, "ticket.png", text_image(TICKET))
    driver.publish([message("trip", "alice", 1, "ticket", [Attachment(url=url, kind="image")])])
    driver.advance("trip")
    driver.run_attachments()
    before = message_text(container, "trip-1")
    assert "[image#" in before
    container.replay("trip", container.llm("maintenance"), "replay")
    with container.pool.connection() as conn:
        rows = conn.execute("SELECT generation, text FROM messages WHERE event_id = 'trip-1' ORDER BY 1").fetchall()
    assert [g for g, _ in rows] == [1, 2] and {t for _, t in rows} == {before}
    assert scalar(container, "SELECT attempts FROM artifacts") == 1  # claimed and analysed once
    assert container.recall("alice", "Lisbon gate", scope=Scope.ARTIFACTS).hits[0].citation.event_id == "trip-1"


def test_an_edit_keeps_the_attachment_line_and_a_late_surrogate_keeps_the_edit(driver, container, tmp_path):
    from chatmem.schemas.events import MessageEditedEvent

    url = put(tmp_path, "ticket.png", text_image(TICKET))
    driver.publish([message("trip", "alice", 1, "ticket", [Attachment(url=url, kind="image", caption="pass")])])
    driver.advance("trip")

    def edit(n, text):
        return MessageEditedEvent(
            event_id=f"edit-{n}", thread_id="trip", user_id="alice", platform_message_id="trip-m1", text=text
        )

    driver.publish([edit(1, "my ticket, corrected")])
    driver.advance("trip")
    assert message_text(container, "trip-1") == "my ticket, corrected\n[image] pass"
    driver.run_attachments()
    text = message_text(container, "trip-1")
    assert text.startswith("my ticket, corrected\n[image#") and "Lisbon" in text
    driver.publish([edit(2, "my ticket (final)")])
    driver.advance("trip")
    assert message_text(container, "trip-1") == text.replace("my ticket, corrected", "my ticket (final)")


def test_failed_attachments_are_listed_with_their_reason_and_can_be_retried(driver, container, tmp_path):
    late = tmp_path / "late.png"
    driver.publish([message("t", "alice", 1, "photo", [Attachment(url=late.as_uri(), kind="image")])])
    driver.advance("t")
    queued = list(driver.attachments)
    assert driver.run_attachments() == ["failed"]
    store = container.attachment_store
    [row] = store.listing(status="failed")
    assert (row["event_id"], row["thread_id"], row["status"]) == ("t-1", "t", "failed")
    assert row["reason"].startswith("file not found")
    assert store.listing(status="done") == []

    late.write_bytes(text_image(TICKET))  # the file turns up
    assert store.reset_failed(thread_id="other") == []
    assert store.reset_failed() == queued
    assert message_text(container, "t-1") == "photo\n[image]"  # the placeholder again until done
    driver.attachments = queued
    assert driver.run_attachments() == ["done"]
    assert [r["status"] for r in store.listing()] == ["done"]
    assert "Lisbon" in message_text(container, "t-1")


def test_a_document_of_one_character_is_read_not_failed(driver, container, tmp_path):
    # The offline summary took the first sentence of the first part, and a part of one
    # character ("1", a page number alone) has none: the job failed for good with IndexError.
    att = Attachment(url=put(tmp_path, "page.txt", b"1"), kind="document", mime_type="text/plain")
    driver.publish([message("one", "alice", 1, "the page", [att])])
    driver.advance("one")
    assert driver.run_attachments() == ["done"]
    summary = scalar(container, "SELECT text FROM artifact_text WHERE kind = 'file_summary'")
    assert summary.startswith("1:")  # the part stands for its own title


def test_text_files_as_windows_saves_them_are_read(driver, container, tmp_path):
    # Notepad's "Unicode" and PowerShell's `>` write UTF-16 with a byte order mark, older programs
    # a code page (Windows-1251 here): both were refused as binary files.
    notes = "Locker code for the allotment shed: 4512.\r\nBring the green watering can.\r\n"
    russian = "Встреча с арендодателем в пятницу в десять утра. Ключи от гаража у соседа."
    files = [
        Attachment(url=put(tmp_path, "notes.txt", notes.encode("utf-16")), kind="document", mime_type="text/plain"),
        Attachment(url=put(tmp_path, "заметки.txt", russian.encode("cp1251")), kind="document"),
    ]
    driver.publish([message("win", "alice", 1, "my notes", files)])
    driver.advance("win")
    assert driver.run_attachments() == ["done", "done"]
    with container.pool.connection() as conn:
        chunks = [r[0] for r in conn.execute("SELECT text FROM artifact_text WHERE kind = 'chunk' ORDER BY text")]
    assert chunks == [notes.strip(), russian], chunks
    hits = container.recall("alice", "what is the locker code", scope=Scope.ARTIFACTS).hits
    assert hits and "4512" in hits[0].snippet


def phone_photo(shown: Image.Image, orientation: int) -> bytes:
    """A JPEG as a phone writes it: the pixels as the sensor saw them, and in EXIF how to turn
    them to show the photo (`shown`)."""
    undo = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    exif[272] = "Pixel 9"  # Model
    out = io.BytesIO()
    shown.transpose(undo[orientation]).save(out, "JPEG", exif=exif.tobytes(), quality=92)
    return out.getvalue()


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_a_photo_is_read_turned_as_it_is_shown(orientation):
    shown = Image.new("RGB", (300, 200), "white")
    ImageDraw.Draw(shown).rectangle((0, 0, 60, 40), fill="black")  # the shown photo's top left
    data = phone_photo(shown, orientation)
    reader = PillowImageReader(max_pixels=10_000_000)
    info = reader.inspect(data)
    assert (info.format, info.width, info.height, info.meta) == ("JPEG", 300, 200, {"camera_model": "Pixel 9"})
    pixels = reader.rgb(data)
    assert pixels.shape == (200, 300, 3) and pixels[20, 30].max() < 60 and pixels[180, 270].min() > 200


def test_a_phone_photo_of_a_ticket_is_read_by_ocr(driver, container, tmp_path):
    # Taken with the phone upright, stored sideways: read as stored, OCR made "Rece e eboa" of
    # "Receipt: Cafe Lisboa" and nothing of most lines.
    photo = phone_photo(Image.open(io.BytesIO(text_image(TICKET))).convert("RGB"), 6)
    driver.publish([message("snap", "alice", 1, "my ticket", [Attachment(url=put(tmp_path, "IMG_0042.jpg", photo))])])
    driver.advance("snap")
    assert driver.run_attachments() == ["done"]
    ocr = scalar(container, "SELECT string_agg(text, ' ') FROM artifact_text WHERE kind = 'ocr'")
    assert "Lisbon" in ocr and "B17" in ocr and "14C" in ocr, ocr
    assert "JPEG image, 900×420" in message_text(container, "snap-1")


def test_a_sixteen_bit_grey_scan_is_read_by_ocr():
    # Pillow turns 16-bit grey into 8 bits by clipping at 255: every grey went white, and OCR
    # read nothing.
    # Ink on a scan is dark grey, not black: 3,000 to 60,000 of 65,535.
    light = np.asarray(Image.open(io.BytesIO(text_image(TICKET))).convert("L"), dtype=np.float64) / 255
    grey = (3000 + light * 57000).astype(np.uint16)
    reader = PillowImageReader(max_pixels=10_000_000)
    for fmt in ("PNG", "TIFF"):
        out = io.BytesIO()
        Image.fromarray(grey).save(out, fmt)
        assert Image.open(io.BytesIO(out.getvalue())).mode == "I;16"
        lines = RapidOcr(reader, max_side=960).read(out.getvalue())
        assert any("Lisbon" in text for text, _ in lines), lines


def rotated_scan(shown: Image.Image, rotate: int) -> bytes:
    """A PDF page as a scanner app writes it: the image turned away, and the page's /Rotate
    (degrees clockwise) turning it back for viewers."""
    out = io.BytesIO()
    shown.rotate(rotate, expand=True).save(out, "PDF")  # Pillow turns counter-clockwise
    writer = PdfWriter(clone_from=io.BytesIO(out.getvalue()))
    writer.pages[0].rotate(rotate)
    turned = io.BytesIO()
    writer.write(turned)
    return turned.getvalue()


@pytest.mark.parametrize("rotate", [90, 180, 270])
def test_a_scans_page_image_is_turned_as_the_page_is_shown(rotate):
    shown = Image.new("L", (300, 200), 255)
    ImageDraw.Draw(shown).rectangle((0, 0, 60, 40), fill=0)  # the shown page's top left
    ((page, image),) = DocumentReader(max_pages=5, max_chars=10_000).page_images(rotated_scan(shown, rotate), 5)
    pixels = np.asarray(Image.open(io.BytesIO(image)).convert("L"))
    assert page == 1 and pixels.shape == (200, 300) and pixels[20, 30] < 60 and pixels[180, 270] > 200


def test_a_scan_stored_sideways_is_read_by_ocr(driver, container, tmp_path):
    # Read as stored, OCR made "Leae aent" of "Lease agreement".
    lease = Image.open(io.BytesIO(text_image(["Lease agreement", "Monthly rent 950 EUR"], size=(1240, 900))))
    url = put(tmp_path, "scan.pdf", rotated_scan(lease.convert("RGB"), 90))
    driver.publish([message("scan", "alice", 1, "the lease", [Attachment(url=url, kind="document")])])
    driver.advance("scan")
    assert driver.run_attachments() == ["done"]
    assert "Monthly rent 950 EUR" in scalar(container, "SELECT text FROM artifact_text WHERE kind = 'chunk'")


def word_document() -> bytes:
    doc = docx.Document()
    doc.core_properties.title = "Office plan"
    doc.add_heading("Office plan", 0)
    doc.add_heading("Budget", 1)
    doc.add_paragraph("The office budget for next year was approved by the board.")
    table = doc.add_table(rows=2, cols=3)
    table.cell(0, 0).text, table.cell(0, 1).text, table.cell(0, 2).text = "Item", "Supplier", "Cost"
    table.cell(1, 0).merge(table.cell(1, 1)).text = "Standing desks"
    table.cell(1, 2).text = "4,200 EUR"
    doc.add_heading("Hiring", 2)
    doc.add_paragraph("Two engineers in spring, one designer in autumn.")
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def test_a_word_document_is_read_in_order_with_headings_and_table_rows():
    blocks, meta = DocumentReader(max_pages=5, max_chars=10_000).read(word_document(), DOCX_MIME)
    assert meta == {"doc_title": "Office plan"}
    assert [(b.text, b.level) for b in blocks] == [
        ("Office plan", 1),
        ("Budget", 1),
        ("The office budget for next year was approved by the board.", 0),
        ("Item | Supplier | Cost", 0),
        ("Standing desks | 4,200 EUR", 0),  # a merged cell once
        ("Hiring", 2),
        ("Two engineers in spring, one designer in autumn.", 0),
    ]


def test_a_word_document_that_unpacks_too_far_or_is_broken_fails_with_a_reason():
    reader = DocumentReader(max_pages=5, max_chars=10_000, max_decoded_bytes=5_000_000)
    whole = word_document()
    bomb = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(whole)) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as target:
        for name in source.namelist():
            target.writestr(name, source.read(name))
        target.writestr("word/media/image1.bin", bytes(10_000_000))  # 10 KB packed
    assert len(bomb.getvalue()) < 100_000
    with pytest.raises(BadFile, match=r"unpacks to 10,\d{3},\d{3} bytes, above the limit of 5,000,000"):
        reader.read(bomb.getvalue(), DOCX_MIME)
    with pytest.raises(BadFile, match="broken Word document"):
        reader.read(whole[: len(whole) // 2], DOCX_MIME)


def test_an_avif_photo_is_read_by_ocr(driver, container, tmp_path):
    # Newer Android phones and browsers save AVIF; it was refused as a type not understood.
    out = io.BytesIO()
    Image.open(io.BytesIO(text_image(TICKET))).convert("RGB").save(out, "AVIF", quality=90)
    driver.publish([message("avif", "alice", 1, "ticket", [Attachment(url=put(tmp_path, "t.avif", out.getvalue()))])])
    driver.advance("avif")
    assert driver.run_attachments() == ["done"]
    assert "Lisbon" in scalar(container, "SELECT string_agg(text, ' ') FROM artifact_text WHERE kind = 'ocr'")
    assert "AVIF image, 900×420" in message_text(container, "avif-1")


IMAGES = Path(__file__).parents[1] / "fixtures" / "images"


@pytest.mark.parametrize("name", ["ticket.heic", "ticket_turned.heic"])
def test_an_iphone_photo_in_heic_is_read_by_ocr(driver, container, tmp_path, name):
    # An iPhone saves HEIC, and sends it so when the photo goes as a file; it was refused as a type
    # not understood. The turned one is stored as the sensor saw it, turned by the file's own
    # transform (and EXIF orientation 6): read upright, and not turned twice.
    data = (IMAGES / name).read_bytes()
    driver.publish([message("heic", "alice", 1, "ticket", [Attachment(url=put(tmp_path, name, data))])])
    driver.advance("heic")
    assert driver.run_attachments() == ["done"]
    assert "Flight LH 1234 to Lisbon" in scalar(
        container, "SELECT string_agg(text, ' ') FROM artifact_text WHERE kind = 'ocr'"
    )
    assert "HEIF image, 900×420" in message_text(container, "heic-1")
    assert scalar(container, "SELECT mime_type FROM artifacts") == "image/heic"


def test_a_broken_heic_photo_fails_with_its_reason(tmp_path):
    whole = (IMAGES / "ticket.heic").read_bytes()
    reader = PillowImageReader(max_pixels=10_000_000)
    for broken in (whole[: len(whole) // 2], whole[:200]):
        with pytest.raises(BadFile, match="not an image Pillow can read"):
            reader.inspect(broken)
    with pytest.raises(BadFile, match="above the limit of 100,000"):
        PillowImageReader(max_pixels=100_000).inspect(whole)  # 900×420, told by the header


PIXEL_DIGESTS = """
import hashlib, sys
from pathlib import Path
from chatmem.adapters.images import PillowImageReader
for path in sys.argv[1:]:
    print(Path(path).name, hashlib.sha256(PillowImageReader(10_000_000).rgb(Path(path).read_bytes())).hexdigest())
"""


@pytest.mark.emulated
@pytest.mark.parametrize("cpu", [emulator.HASWELL, emulator.NEHALEM])
def test_photos_decode_to_the_same_pixels_on_cpus_without_avx512_or_avx2(tmp_path, cpu):
    # libde265 (HEIC), dav1d (AVIF), libjpeg-turbo and libwebp pick their AVX-512, AVX2 or SSE code
    # with cpuid at run time; under an emulated Haswell (AVX2, no AVX-512) and Nehalem (neither)
    # the same pixels come out.
    photos = [IMAGES / "ticket.heic", IMAGES / "ticket_turned.heic"]
    ticket = Image.open(io.BytesIO(text_image(TICKET))).convert("RGB")
    for kind, options in (("AVIF", {"quality": 90}), ("JPEG", {"quality": 85}), ("WEBP", {"quality": 80})):
        photos.append(tmp_path / f"ticket.{kind.lower()}")
        ticket.save(photos[-1], kind, **options)
    command = [sys.executable, "-c", PIXEL_DIGESTS, *map(str, photos)]
    native = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    command, env = emulator.emulated(cpu, command)
    emulated = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, env=env).stdout
    assert len(native.splitlines()) == len(photos) and emulated == native


def spreadsheet() -> bytes:
    book = openpyxl.Workbook()
    costs = book.active
    costs.title = "Office costs"
    costs.append(["Item", "Supplier", "Cost (EUR)"])
    costs.append(["Standing desks", "Deskworks", 4200])
    costs.append([None, None, None])  # an empty row is skipped
    costs.append(["Chairs", None, 950.5])
    book.create_sheet("Hiring").append(["Engineers", "spring", 2])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_a_spreadsheet_is_read_sheet_by_sheet_row_by_row():
    blocks, meta = DocumentReader(max_pages=5, max_chars=10_000).read(spreadsheet(), XLSX_MIME)
    assert meta == {"sheets": 2}
    assert [(b.text, b.heading) for b in blocks] == [
        ("Office costs", True),
        ("Item | Supplier | Cost (EUR)", False),
        ("Standing desks | Deskworks | 4200", False),
        ("Chairs | 950.5", False),
        ("Hiring", True),
        ("Engineers | spring | 2", False),
    ]
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    with pytest.raises(BadFile, match="broken spreadsheet"):
        reader.read(spreadsheet()[:3000], XLSX_MIME)


def old_spreadsheet() -> bytes:
    """The same workbook as an Excel 97-2003 file, with a date and a boolean."""
    book = xlwt.Workbook()
    costs = book.add_sheet("Office costs")
    rows = [["Item", "Supplier", "Cost (EUR)"], ["Standing desks", "Deskworks", 4200], [], ["Chairs", None, 950.5]]
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            if value is not None:
                costs.write(r, c, value)
    hiring = book.add_sheet("Hiring")
    hiring.write(0, 0, "Engineers")
    hiring.write(0, 1, date(2027, 3, 14), xlwt.easyxf(num_format_str="YYYY-MM-DD"))
    hiring.write(0, 2, True)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_an_excel_97_spreadsheet_is_read_as_an_xlsx_is():
    # It was refused as a type not understood.
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    blocks, meta = reader.read(old_spreadsheet(), XLS_MIME)
    assert meta == {"sheets": 2}
    assert [(b.text, b.heading) for b in blocks] == [
        ("Office costs", True),
        ("Item | Supplier | Cost (EUR)", False),
        ("Standing desks | Deskworks | 4200", False),  # stored as 4200.0
        ("Chairs | 950.5", False),
        ("Hiring", True),
        ("Engineers | 2027-03-14 | True", False),  # a date, as shown
    ]
    whole = old_spreadsheet()
    for broken in (whole[:600], whole[:512] + bytes(len(whole) - 512)):
        with pytest.raises(BadFile, match="broken spreadsheet"):
            reader.read(broken, XLS_MIME)


def test_a_date_in_a_spreadsheet_reads_as_shown():
    book = openpyxl.Workbook()
    book.active.append(["Launch", datetime(2027, 3, 14), datetime(2027, 3, 14, 9, 30)])
    out = io.BytesIO()
    book.save(out)
    blocks, _ = DocumentReader(max_pages=5, max_chars=10_000).read(out.getvalue(), XLSX_MIME)
    assert blocks[1].text == "Launch | 2027-03-14 | 2027-03-14 09:30:00"


def presentation() -> bytes:
    deck = pptx.Presentation()
    deck.core_properties.title = "Q3 review"
    budget = deck.slides.add_slide(deck.slide_layouts[1])  # a title and a body
    budget.shapes.title.text = "Budget for the Porto office"
    body = budget.placeholders[1].text_frame
    body.text = "The standing desks from Deskworks cost 4,200 EUR"
    body.add_paragraph().text = "Chairs: 950 EUR"
    budget.notes_slide.notes_text_frame.text = "Ask Maria about the lease before Friday."
    plan = deck.slides.add_slide(deck.slide_layouts[6])  # blank: no title
    group = plan.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1)).text_frame.text = "Launch date: 14 March"
    table = plan.shapes.add_table(2, 2, Inches(1), Inches(3), Inches(4), Inches(1)).table
    for r, row in enumerate([["Role", "When"], ["Two engineers", "spring"]]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    deck.slides.add_slide(deck.slide_layouts[0]).shapes.title.text = "Questions?"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


# --- OpenDocument: the same files as LibreOffice saves them ---------------------------------------
ODT, ODS, ODP = (f"application/vnd.oasis.opendocument.{kind}" for kind in ("text", "spreadsheet", "presentation"))


def odf(kind: str, title: str, *parts: str | odfdo.Element) -> bytes:
    """An OpenDocument file of `kind` whose body is `parts` (elements, or XML in ODF's prefixes)."""
    document = odfdo.Document(kind)
    document.body.clear()
    for part in parts:
        document.body.append(odfdo.Element.from_tag(part) if isinstance(part, str) else part)
    document.meta.set_title(title)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def open_text() -> bytes:
    table = odfdo.Table("Plan", width=3, height=2)
    cells = {"A1": "Item", "B1": "Supplier", "C1": "Cost", "A2": "Standing desks", "C2": "4,200 EUR"}
    for cell, value in cells.items():
        table.set_value(cell, value)
    return odf(
        "text",
        "Office plan",
        "<text:table-of-content><text:index-body><text:p>Budget ..... 1</text:p></text:index-body>"
        "</text:table-of-content>",  # an index repeats the headings: left out
        odfdo.Header(1, "Budget"),
        odfdo.Paragraph("The office budget for next year was approved by the board."),
        table,
        odfdo.List(["Desks first", "Chairs next"]),
        '<text:section text:name="Later"><text:h text:outline-level="2">Hiring</text:h>'
        "<text:p>Two engineers in spring, one designer in autumn.</text:p></text:section>",
    )


def open_spreadsheet() -> bytes:
    costs = odfdo.Table("Office costs")
    for r, row in enumerate([["Item", "Supplier", "Cost (EUR)"], ["Standing desks", "Deskworks", 4200]]):
        for c, value in enumerate(row):
            costs.set_value((c, r), value)
    costs.set_cell("A4", odfdo.Cell("Chairs"))
    costs.set_cell("C4", odfdo.Cell(950.5, text="950,50 €", cell_type="currency", currency="EUR"))
    # Two equal rows are written once, twice over; LibreOffice closes a sheet with an empty row
    # repeated to its millionth.
    lamps = odfdo.Row()
    lamps.set_value(0, "Lamp")
    lamps.repeated = 2
    costs.append(lamps)
    costs.append(odfdo.Row(repeated=1_048_000))
    hiring = odfdo.Table("Hiring")
    hiring.set_cell("A1", odfdo.Cell("Engineers"))
    hiring.set_cell("B1", odfdo.Cell(date(2027, 3, 14), text="14/03/27"))
    hiring.set_cell("C1", odfdo.Cell(2, repeated=2))  # one value over two columns
    return odf("spreadsheet", "Costs", costs, hiring)


def open_presentation() -> bytes:
    def frame(kind: str, *paragraphs: str) -> str:
        texts = "".join(f"<text:p>{p}</text:p>" for p in paragraphs)
        return f'<draw:frame presentation:class="{kind}"><draw:text-box>{texts}</draw:text-box></draw:frame>'

    table = (
        "<draw:frame><table:table>"
        + "".join(
            f"<table:table-row><table:table-cell><text:p>{a}</text:p></table:table-cell>"
            f"<table:table-cell><text:p>{b}</text:p></table:table-cell></table:table-row>"
            for a, b in [("Role", "When"), ("Two engineers", "spring")]
        )
        + "</table:table></draw:frame>"
    )
    return odf(
        "presentation",
        "Q3 review",
        '<draw:page draw:name="page1">'
        + frame("outline", "The standing desks from Deskworks cost 4,200 EUR", "Chairs: 950 EUR")
        + frame("title", "Budget for the Porto office")  # after the body in the file: still the title
        + "<presentation:notes>"
        + frame("notes", "Ask Maria about the lease before Friday.")
        + "</presentation:notes></draw:page>",
        '<draw:page draw:name="page2"><draw:g><draw:custom-shape><text:p>Launch date: 14 March</text:p>'
        "</draw:custom-shape></draw:g>" + table + "</draw:page>",
        '<draw:page draw:name="page3">' + frame("title", "Questions?") + "</draw:page>",
    )


def test_an_opendocument_text_is_read_as_a_word_document_is():
    # OpenDocument files were refused as a type not understood.
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    assert sniff(open_text(), "plan.odt", guess_binary) == Sniffed(ODT, "document")
    blocks, meta = reader.read(open_text(), ODT)
    assert meta == {"doc_title": "Office plan"}
    assert [(b.text, b.level) for b in blocks] == [
        ("Budget", 1),
        ("The office budget for next year was approved by the board.", 0),
        ("Item | Supplier | Cost", 0),
        ("Standing desks | 4,200 EUR", 0),
        ("Desks first", 0),
        ("Chairs next", 0),
        ("Hiring", 2),  # inside a section
        ("Two engineers in spring, one designer in autumn.", 0),
    ]
    with pytest.raises(BadFile, match="broken OpenDocument file"):
        reader.read(open_text()[:3000], ODT)


def test_an_opendocument_spreadsheet_is_read_sheet_by_sheet_its_repeats_bounded():
    blocks, meta = DocumentReader(max_pages=5, max_chars=10_000).read(open_spreadsheet(), ODS)
    assert meta == {"sheets": 2, "doc_title": "Costs"}
    assert [(b.text, b.heading) for b in blocks] == [
        ("Office costs", True),
        ("Item | Supplier | Cost (EUR)", False),
        ("Standing desks | Deskworks | 4200", False),
        ("Chairs | 950,50 €", False),  # as the cell shows it
        ("Lamp", False),
        ("Lamp", False),  # a row written once, repeated twice
        ("Hiring", True),
        ("Engineers | 2027-03-14 | 2 | 2", False),  # a date as in an .xlsx; a value over two columns
    ]


@pytest.mark.parametrize(
    ("make", "mime", "broken"),
    [(presentation, PPTX_MIME, "broken presentation"), (open_presentation, ODP, "broken OpenDocument file")],
    ids=["pptx", "odp"],
)
def test_a_presentation_is_read_slide_by_slide_with_its_notes(make, mime, broken):
    blocks, meta = DocumentReader(max_pages=5, max_chars=10_000).read(make(), mime)
    assert meta == {"slides": 3, "doc_title": "Q3 review"}
    assert [(b.text, b.heading, b.page) for b in blocks] == [
        ("Budget for the Porto office", True, 1),
        ("The standing desks from Deskworks cost 4,200 EUR", False, 1),
        ("Chairs: 950 EUR", False, 1),
        ("Ask Maria about the lease before Friday.", False, 1),  # the speaker notes
        ("Slide 2", True, 2),  # no title of its own
        ("Launch date: 14 March", False, 2),  # in a group
        ("Role | When", False, 2),
        ("Two engineers | spring", False, 2),
        ("Questions?", True, 3),
    ]
    blocks, meta = DocumentReader(max_pages=1, max_chars=10_000).read(make(), mime)
    assert meta["slides_read"] == 1 and {b.page for b in blocks} == {1}
    with pytest.raises(BadFile, match=broken):
        DocumentReader(max_pages=5, max_chars=10_000).read(make()[:5000], mime)


def test_a_slides_native_chart_is_read_as_the_numbers_it_draws():
    from pptx.chart.data import CategoryChartData, XyChartData
    from pptx.enum.chart import XL_CHART_TYPE

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])  # a title only
    slide.shapes.title.text = "Sales"
    columns = CategoryChartData()
    columns.categories = ["North", "South"]
    columns.add_series("2025", (12, 9.25))
    columns.add_series("2026", (15.5, None))  # a value not given is left out
    chart = slide.shapes.add_chart(XL_CHART_TYPE.COLUMN_CLUSTERED, 0, 0, Inches(6), Inches(4), columns).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Revenue by region (M EUR)"
    scatter = XyChartData()
    latency = scatter.add_series("Latency ms")
    latency.add_data_point(1.5, 20)
    latency.add_data_point(4, 35)
    group = slide.shapes.add_group_shape()  # a chart in a group is read too
    group.shapes.add_chart(XL_CHART_TYPE.XY_SCATTER, 0, 0, Inches(4), Inches(2), scatter)
    out = io.BytesIO()
    deck.save(out)
    blocks, _ = DocumentReader(max_pages=5, max_chars=10_000).read(out.getvalue(), PPTX_MIME)
    assert [b.text for b in blocks] == [
        "Sales",
        "Chart: Revenue by region (M EUR)",
        "North | 2025: 12 | 2026: 15.5",
        "South | 2025: 9.25",
        "Chart",
        "1.5 | Latency ms: 20",  # each point's x, which python-pptx does not expose
        "4 | Latency ms: 35",
    ]


def word_document_with_a_chart() -> bytes:
    """A Word document with a chart, as Word saves one: a DrawingML chart part (made here by
    python-pptx, since python-docx writes none) that an inline drawing names."""
    from docx.opc.constants import RELATIONSHIP_TYPE
    from docx.opc.packuri import PackURI
    from docx.opc.part import Part
    from docx.oxml import parse_xml
    from pptx.chart.data import CategoryChartData
    from pptx.enum.chart import XL_CHART_TYPE

    data = CategoryChartData()
    data.categories = ["Desks", "Chairs"]
    data.add_series("Cost EUR", (4200, 950.5))
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])
    chart = slide.shapes.add_chart(XL_CHART_TYPE.PIE, 0, 0, Inches(4), Inches(3), data).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Office costs"
    doc = docx.Document()
    doc.add_paragraph("The budget, by item:")
    part = Part(
        PackURI("/word/charts/chart1.xml"),
        "application/vnd.openxmlformats-officedocument.drawingml.chart+xml",
        chart.part.blob,
        doc.part.package,
    )
    rid = doc.part.relate_to(part, RELATIONSHIP_TYPE.CHART)
    drawing = (
        '<w:drawing xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
        ' xmlns:wp="http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing"'
        ' xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
        ' xmlns:c="http://schemas.openxmlformats.org/drawingml/2006/chart"'
        ' xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
        '<wp:inline><wp:extent cx="3657600" cy="2743200"/><wp:docPr id="1" name="Chart 1"/><a:graphic>'
        '<a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/chart">'
        f'<c:chart r:id="{rid}"/></a:graphicData></a:graphic></wp:inline></w:drawing>'
    )
    doc.add_paragraph().add_run()._r.append(parse_xml(drawing))
    doc.add_paragraph("Approved on Friday.")
    return saved(doc)


def test_a_chart_in_a_word_document_is_read_in_its_place():
    blocks, _ = DocumentReader(max_pages=5, max_chars=10_000).read(word_document_with_a_chart(), DOCX_MIME)
    assert [b.text for b in blocks] == [
        "The budget, by item:",
        "Chart: Office costs",
        "Desks | Cost EUR: 4200",
        "Chairs | Cost EUR: 950.5",
        "Approved on Friday.",
    ]


ODF_CHART = "\n".join(
    [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0"',
        ' xmlns:chart="urn:oasis:names:tc:opendocument:xmlns:chart:1.0"',
        ' xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"',
        ' xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.3">',
        '<office:body><office:chart><chart:chart chart:class="chart:bar">',
        "<chart:title><text:p>Revenue by region</text:p></chart:title>",
        '<chart:plot-area><chart:series chart:values-cell-range-address="local-table.B2:B3"/></chart:plot-area>',
        '<table:table table:name="local-table">',
        "<table:table-header-columns><table:table-column/></table:table-header-columns>",
        '<table:table-columns><table:table-column table:number-columns-repeated="2"/></table:table-columns>',
        "<table:table-header-rows><table:table-row><table:table-cell><text:p/></table:table-cell>",
        '<table:table-cell office:value-type="string"><text:p>2025</text:p></table:table-cell>',
        '<table:table-cell office:value-type="string"><text:p>2026</text:p></table:table-cell>',
        "</table:table-row></table:table-header-rows>",
        "<table:table-rows><table:table-row>",
        '<table:table-cell office:value-type="string"><text:p>North</text:p></table:table-cell>',
        '<table:table-cell office:value-type="float" office:value="12"><text:p>12</text:p></table:table-cell>',
        '<table:table-cell office:value-type="float" office:value="15.5"><text:p>15,5</text:p></table:table-cell>',
        "</table:table-row><table:table-row>",
        '<table:table-cell office:value-type="string"><text:p>South</text:p></table:table-cell>',
        '<table:table-cell office:value-type="float" office:value="9.25"><text:p>9,25</text:p></table:table-cell>',
        "<table:table-cell/></table:table-row></table:table-rows></table:table>",
        "</chart:chart></office:chart></office:body></office:document-content>",
    ]
)


def open_document_with_a_chart(kind: str) -> bytes:
    """A LibreOffice presentation or text with a chart: an embedded object (its own content.xml,
    keeping the chart's data in a table of its own) that a frame names."""
    document = odfdo.Document(kind)
    document.body.clear()
    document.set_part("Object 1/content.xml", ODF_CHART.encode())
    document.manifest.add_full_path("Object 1/", "application/vnd.oasis.opendocument.chart")
    document.manifest.add_full_path("Object 1/content.xml", "text/xml")
    frame = '<draw:frame><draw:object xlink:href="./Object 1"/></draw:frame>'
    if kind == "presentation":
        title = (
            '<draw:frame presentation:class="title"><draw:text-box><text:p>Sales</text:p></draw:text-box></draw:frame>'
        )
        page = f'<draw:page draw:name="page1">{title}{frame}</draw:page>'
        document.body.append(odfdo.Element.from_tag(page))
    else:
        document.body.append(odfdo.Paragraph("Sales by region:"))
        document.body.append(odfdo.Element.from_tag(f"<text:p>{frame}</text:p>"))
        document.body.append(odfdo.Paragraph("Approved."))
    return saved(document)


@pytest.mark.parametrize(
    ("kind", "mime", "around"), [("presentation", ODP, ["Sales"]), ("text", ODT, ["Sales by region:", "Approved."])]
)
def test_a_chart_in_an_open_document_is_read_in_its_place(kind, mime, around):
    blocks, _ = DocumentReader(max_pages=5, max_chars=10_000).read(open_document_with_a_chart(kind), mime)
    chart = ["Chart: Revenue by region", "North | 2025: 12 | 2026: 15.5", "South | 2025: 9.25"]
    assert [b.text for b in blocks] == [around[0], *chart, *around[1:]]


def flat(document: bytes) -> bytes:
    """An OpenDocument file saved as one XML file, as LibreOffice's "Flat XML" formats save it."""
    out = io.BytesIO()
    odfdo.Document(io.BytesIO(document)).save(out, packaging="xml")
    return out.getvalue()


@pytest.mark.parametrize(
    ("make", "mime"),
    [(open_text, ODT), (open_spreadsheet, ODS), (open_presentation, ODP)],
    ids=["fodt", "fods", "fodp"],
)
def test_a_flat_open_document_is_read_as_the_packaged_one(make, mime):
    # Until 2026-12-01 a flat file was read as plain text: its XML, styles and all, became memory.
    packaged, one_file = make(), flat(make())
    assert sniff(one_file, None, guess_binary) == Sniffed(f"{mime}-flat-xml", "document")
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    assert reader.read(one_file, f"{mime}-flat-xml") == reader.read(packaged, mime)


def test_a_flat_open_document_keeps_its_pictures_and_charts_inside_and_no_dtd():
    document = odfdo.Document("text")
    document.body.clear()
    href = document.add_file(io.BytesIO(ICON))
    document.body.append(
        odfdo.Element.from_tag(f'<text:p><draw:frame><draw:image xlink:href="{href}"/></draw:frame></text:p>')
    )
    one_file = flat(saved(document))
    assert b"office:binary-data" in one_file  # the picture, in base64
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    assert reader.pictures(one_file, f"{ODT}-flat-xml", 20) == [(None, ICON)]
    # A chart is an embedded document inside its frame.
    chart = ODF_CHART.split("?>", 1)[1].replace("office:document-content", "office:document")
    chart = chart.replace(
        "<office:document ", '<office:document office:mimetype="application/vnd.oasis.opendocument.chart" ', 1
    )
    text = flat(saved(odfdo.Document("text"))).decode()
    with_chart = text.replace(
        "<office:text>",
        f"<office:text><text:p>Sales</text:p><text:p><draw:frame><draw:object>{chart}</draw:object></draw:frame></text:p>",
        1,
    )
    blocks, _ = reader.read(with_chart.encode(), f"{ODT}-flat-xml")
    assert [b.text for b in blocks][:3] == ["Sales", "Chart: Revenue by region", "North | 2025: 12 | 2026: 15.5"]
    bomb = '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa">]>' + text.split("?>", 1)[1]
    with pytest.raises(BadFile, match="declares a DTD"):
        reader.read(bomb.encode(), f"{ODT}-flat-xml")


def animation(fmt: str) -> bytes:
    """A short animation, as a chat's GIFs and stickers are: two cards, then the second with one
    pixel changed (a writer merges pictures that are the same), then the first again."""
    sale, today = (
        Image.open(io.BytesIO(text_image([words], size=(600, 160)))).convert("RGB")
        for words in ("SALE 50 PERCENT", "TODAY ONLY")
    )
    speck = today.copy()
    speck.putpixel((599, 159), (0, 0, 0))
    out = io.BytesIO()
    sale.save(out, fmt, save_all=True, append_images=[today, speck, sale.copy()], duration=500, loop=0)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG", "TIFF"])  # TIFF: a scanner's pages
def test_each_picture_of_an_animation_is_read_once(fmt):
    # Until 2026-12-01 only the first picture was read: a GIF's punchline came later.
    images = PillowImageReader(max_pixels=10_000_000)
    data = animation(fmt)
    info = images.inspect(data)
    assert info.meta["frames"] == "4"
    assert len(images.frames(data, 7)) == 1  # the third is the second, the fourth the first
    reader = Reader(images, RapidOcr(images, max_side=960), DocumentReader(max_pages=5, max_chars=10_000))
    found = reader(data, sniff(data, None, guess_binary))
    assert [line.upper() for line in found.lines] == ["SALE 50 PERCENT", "TODAY ONLY"]
    assert images.frames(text_image(["a still"]), 7) == []


def test_a_cameras_jpeg_with_its_preview_inside_is_one_picture():
    # An MPO (a JPEG that carries a smaller copy of itself) is not an animation: no second OCR.
    photo = Image.open(io.BytesIO(text_image(["RECEIPT 12.50"]))).convert("RGB")
    out = io.BytesIO()
    photo.save(out, "MPO", save_all=True, append_images=[photo.resize((450, 210))])
    images = PillowImageReader(max_pixels=10_000_000)
    assert "frames" not in images.inspect(out.getvalue()).meta and images.frames(out.getvalue(), 7) == []


def old_word_document() -> bytes:
    """A Word 97-2003 document (tests/office97.py writes it to the format's specification)."""
    return office97.word_document(
        [
            ("Office plan\rThe office budget for next year was approved by the board.\r", True),
            ("Item\x07Supplier\x07Cost\x07" + office97.ROW_END + "Standing desks\x07Deskworks\x074,200 EUR\x07", False),
            (office97.ROW_END, False),
        ]
    )


def old_presentation() -> bytes:
    """A PowerPoint 97-2003 presentation (tests/office97.py writes it to the format's specification)."""
    return office97.powerpoint_document(
        [("Budget for the Porto office", ["The standing desks from Deskworks cost 4,200 EUR"], "Ask Maria.")]
    )


ICON = text_image([], size=(48, 48))  # a logo on every slide: too small to OCR


def deck_with_a_picture(kind: str) -> bytes:
    """Two slides: a title with a logo, then a slide that is only a screenshot with words in it."""
    shot = text_image(["Launch date 14 March", "Venue Porto office"])
    if kind == "pptx":
        deck = pptx.Presentation()
        first = deck.slides.add_slide(deck.slide_layouts[0])
        first.shapes.title.text = "Q3 review"
        first.shapes.add_picture(io.BytesIO(ICON), Inches(8), Inches(6))
        second = deck.slides.add_slide(deck.slide_layouts[6])  # blank
        second.shapes.add_picture(io.BytesIO(ICON), Inches(8), Inches(6))
        group = second.shapes.add_group_shape()
        group.shapes.add_picture(io.BytesIO(shot), Inches(1), Inches(1))
        out = io.BytesIO()
        deck.save(out)
        return out.getvalue()
    if kind == "ppt":  # the store: the logo, the screenshot (a DIB, as PowerPoint 97 keeps a BMP), a chart's EMF
        bmp = io.BytesIO()
        Image.open(io.BytesIO(shot)).save(bmp, "BMP")
        store = [("png", ICON), ("dib", bmp.getvalue()[14:]), ("emf", b"EMF data"), ("png", b"a master's logo")]
        slides = [("Q3 review", [], None), ("", [], None)]
        return office97.powerpoint_document(slides, pictures=store, shown={0: [1], 1: [1, 2, 3]})
    document = odfdo.Document("presentation")
    document.body.clear()
    icon, picture = (document.add_file(io.BytesIO(data)) for data in (ICON, shot))

    def framed(href: str) -> str:
        return f'<draw:frame><draw:image xlink:href="{href}"/></draw:frame>'

    title = (
        '<draw:frame presentation:class="title"><draw:text-box><text:p>Q3 review</text:p></draw:text-box></draw:frame>'
    )
    # Slide 2 also names a picture missing from the file and one on the web: neither is read.
    pages = [
        title + framed(icon),
        framed(icon) + framed(picture) + framed("Pictures/gone.png") + framed("https://x.org/a.png"),
    ]
    for n, inside in enumerate(pages, start=1):
        document.body.append(odfdo.Element.from_tag(f'<draw:page draw:name="page{n}">{inside}</draw:page>'))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.mark.parametrize(("kind", "mime"), [("pptx", PPTX_MIME), ("odp", ODP), ("ppt", PPT_MIME)])
def test_a_slide_that_is_a_picture_is_read_by_ocr(driver, container, tmp_path, kind, mime):
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    found = reader.pictures(deck_with_a_picture(kind), mime, 20)
    assert [(slide, data == ICON) for slide, data in found] == [(1, True), (2, True), (2, False)]
    url = put(tmp_path, f"review.{kind}", deck_with_a_picture(kind))
    driver.publish([message("office", "alice", 1, "the deck", [Attachment(url=url, kind="document")])])
    driver.advance("office")
    assert driver.run_attachments() == ["done"]
    assert scalar(container, "SELECT meta ->> 'ocr_pictures' FROM artifacts") == "1"  # the logo is skipped
    hit = container.recall("alice", "when is the launch date?", scope=Scope.ARTIFACTS).hits[0]
    assert "14 March" in hit.snippet and hit.citation.event_id == "office-1"


def pasted_scan(kind: str) -> bytes:
    """A Word or OpenDocument text that is only a scan pasted in, with a logo above it."""
    scan = text_image(["Lease agreement", "Monthly rent 950 EUR"], size=(1240, 500))
    if kind == "doc":  # Word 97-2003 keeps inline pictures in its Data stream
        return office97.word_document([("\r", True)], pictures=[("png", ICON), ("jpeg", jpeg_of(scan))])
    if kind == "docx":
        doc = docx.Document()
        doc.add_picture(io.BytesIO(ICON))
        doc.add_picture(io.BytesIO(scan))
        out = io.BytesIO()
        doc.save(out)
        return out.getvalue()
    document = odfdo.Document("text")
    document.body.clear()
    for data in (ICON, scan):
        href = document.add_file(io.BytesIO(data))
        document.body.append(
            odfdo.Element.from_tag(f'<text:p><draw:frame><draw:image xlink:href="{href}"/></draw:frame></text:p>')
        )
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def jpeg_of(png: bytes) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.mark.parametrize(("kind", "mime"), [("docx", DOCX_MIME), ("odt", ODT), ("doc", DOC_MIME)])
def test_a_document_that_is_a_pasted_scan_is_read_by_ocr(driver, container, tmp_path, kind, mime):
    # It failed as "the document has no text".
    found = DocumentReader(max_pages=5, max_chars=10_000).pictures(pasted_scan(kind), mime, 20)
    assert [(page, data == ICON) for page, data in found] == [(None, True), (None, False)]
    url = put(tmp_path, f"lease.{kind}", pasted_scan(kind))
    driver.publish([message("home", "alice", 1, "the lease", [Attachment(url=url, kind="document")])])
    driver.advance("home")
    assert driver.run_attachments() == ["done"]
    hit = container.recall("alice", "how much is the monthly rent?", scope=Scope.ARTIFACTS).hits[0]
    assert "950" in hit.snippet and hit.citation.event_id == "home-1"


def with_content(document: bytes, content: bytes) -> bytes:
    """The OpenDocument file with its content.xml replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(document)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(info, content if info.filename == "content.xml" else source.read(info))
    return out.getvalue()


def test_an_opendocument_file_that_expands_or_reaches_out_is_refused():
    namespaces = (
        'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"'
    )
    laughs = '<!ENTITY a "ha">' + "".join(f'<!ENTITY {chr(98 + i)} "{f"&{chr(97 + i)};" * 10}">' for i in range(9))
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    for declarations, said, refused in [
        (laughs, "&j;", "amplification"),  # a billion laughs
        ('<!ENTITY host SYSTEM "file:///etc/hostname">', "&host;", "not defined"),  # a file of this machine
    ]:
        content = (
            f"<?xml version='1.0'?><!DOCTYPE office:document-content [{declarations}]>"
            f"<office:document-content {namespaces}><office:body><office:text><text:p>{said}</text:p>"
            "</office:text></office:body></office:document-content>"
        )
        with pytest.raises(BadFile, match=f"broken OpenDocument file: .*{refused}"):
            reader.read(with_content(open_text(), content.encode()), ODT)
    bomb = with_content(open_text(), b"<?xml version='1.0'?>" + b" " * 5_000_000)
    with pytest.raises(BadFile, match="compression ratio"):
        reader.read(bomb, ODT)


@pytest.mark.parametrize(
    ("name", "make", "mime", "cost"),
    [
        ("plan.docx", word_document, DOCX_MIME, "4,200 EUR"),
        ("costs.xlsx", spreadsheet, XLSX_MIME, "4200"),
        ("review.pptx", presentation, PPTX_MIME, "4,200 EUR"),
        ("costs.xls", old_spreadsheet, XLS_MIME, "4200"),
        ("plan.odt", open_text, ODT, "4,200 EUR"),
        ("plan.doc", old_word_document, DOC_MIME, "4,200 EUR"),
        ("review.ppt", old_presentation, PPT_MIME, "4,200 EUR"),
        ("costs.ods", open_spreadsheet, ODS, "4200"),
        ("review.odp", open_presentation, ODP, "4,200 EUR"),
    ],
)
def test_an_office_file_is_chunked_summarised_and_found(driver, container, tmp_path, name, make, mime, cost):
    office = Attachment(url=put(tmp_path, name, make()), mime_type=mime)
    driver.publish([message("office", "alice", 1, "see", [office])])
    driver.advance("office")
    assert driver.run_attachments() == ["done"]
    hit = container.recall("alice", "how much do the standing desks cost?", scope=Scope.ARTIFACTS).hits[0]
    assert cost in hit.snippet and hit.citation.event_id == "office-1"
    assert "[file#" in message_text(container, "office-1")
