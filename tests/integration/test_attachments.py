"""Attachments on the real stack: real OCR (rapidocr), real PDF parsing, Postgres + pgvector,
the real embedder. Files are made here (Pillow, fpdf2) and sent as file:// or data: URLs."""

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFont

from schemas.events import Attachment, MessageEvent
from schemas.read import Scope
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
    kinds = {r[0] for r in container.pool.connection().__enter__().execute("SELECT kind FROM artifact_text")}
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
