"""The vision adapter against a local OpenAI-compatible endpoint (no vision model is reachable
from here): the image goes inline as a data URL, the structured answer becomes vision_short /
vision_detail and the surrogate's description; an endpoint that is down is retried, and the
last attempt falls back to the offline description."""

import base64
import io
import json
import time

import pytest
from PIL import Image

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.memory.ports import TransientError
from chatmem.schemas.events import Attachment
from tests.conftest import scalar
from tests.fake_openai import FakeOpenAI, completion, serving
from tests.integration.test_attachments import IMAGES, TICKET, message, message_text, put, text_image
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration


@pytest.fixture
def endpoint():
    with serving() as url:
        FakeOpenAI.body = completion(
            {"short": "a boarding pass for a flight to Lisbon", "detail": "A printed boarding pass, gate B17."},
            model="test-vision",
        )
        yield url


@pytest.fixture
def vision_container(settings_factory, endpoint):
    s = settings_factory(vision_model="test-vision", vision_base_url=endpoint, vision_api_key="k")
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    yield c
    c.close()


def test_a_configured_vision_model_describes_the_image(vision_container, tmp_path):
    c = vision_container
    driver = Driver(c)
    driver.publish([message("trip", "alice", 1, "pass", [Attachment(url=put(tmp_path, "t.png", text_image(TICKET)))])])
    driver.advance("trip")
    assert driver.run_attachments() == ["done"]
    [request] = FakeOpenAI.requests
    assert request["model"] == "test-vision"
    parts = request["messages"][1]["content"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "Lisbon" in json.loads(parts[0]["text"])["ocr_text"]  # OCR helps the model read
    assert (
        scalar(c, "SELECT text FROM artifact_text WHERE kind = 'vision_detail'") == "A printed boarding pass, gate B17."
    )
    assert message_text(c, "trip-1").endswith("] a boarding pass for a flight to Lisbon")
    assert scalar(c, "SELECT meta ->> 'vision_model' FROM artifacts") == "test-vision"


@pytest.mark.parametrize("fmt", ["TIFF", "BMP", "AVIF"])
def test_an_image_in_a_format_the_endpoint_refuses_goes_as_png(vision_container, tmp_path, fmt):
    # Vision endpoints take PNG, JPEG, WebP and GIF: a TIFF, BMP or AVIF sent as it was got
    # HTTP 400, which failed the file's task.
    c = vision_container
    out = io.BytesIO()
    Image.open(io.BytesIO(text_image(TICKET))).convert("RGB").save(out, fmt)
    driver = Driver(c)
    driver.publish([message("trip", "alice", 1, "pass", [Attachment(url=put(tmp_path, "t.img", out.getvalue()))])])
    driver.advance("trip")
    assert driver.run_attachments() == ["done"]
    [request] = FakeOpenAI.requests
    url = request["messages"][1]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert (sent.format, sent.size) == ("PNG", (900, 420))
    assert scalar(c, "SELECT mime_type FROM artifacts") == f"image/{fmt.lower()}"


def test_a_heic_photo_goes_as_png(vision_container, tmp_path):
    c = vision_container
    heic = (IMAGES / "ticket_turned.heic").read_bytes()
    driver = Driver(c)
    driver.publish([message("trip", "alice", 1, "pass", [Attachment(url=put(tmp_path, "t.heic", heic))])])
    driver.advance("trip")
    assert driver.run_attachments() == ["done"]
    [request] = FakeOpenAI.requests
    url = request["messages"][1]["content"][1]["image_url"]["url"]
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert (sent.format, sent.size) == ("PNG", (900, 420))  # as shown, not as the sensor saw it
    assert message_text(c, "trip-1").endswith("] a boarding pass for a flight to Lisbon")


def test_a_vision_endpoint_that_is_down_is_retried_then_the_offline_description_is_used(vision_container, tmp_path):
    c = vision_container
    FakeOpenAI.status, FakeOpenAI.body = 503, {"error": {"message": "down"}}
    driver = Driver(c)
    driver.publish([message("trip", "alice", 1, "pass", [Attachment(url=put(tmp_path, "t.png", text_image(TICKET)))])])
    driver.advance("trip")
    queued = list(driver.attachments)
    with pytest.raises(TransientError):
        driver.run_attachments()
    assert scalar(c, "SELECT status FROM artifacts") == "pending"  # the claim was given back
    driver.attachments = queued
    assert driver.run_attachments(last_attempt=True) == ["done"]
    assert "with the text" in message_text(c, "trip-1")  # the offline description
    assert scalar(c, "SELECT count(*) FROM artifact_text WHERE kind LIKE 'vision%%'") == 0


def test_a_vision_endpoint_that_stalls_times_out_and_falls_back_to_the_offline_description(
    settings_factory, endpoint, tmp_path
):
    # 0.3 s per try (vision gets 1.5x llm_timeout_s), three tries with the client's backoff; the
    # endpoint would answer each after 30 s.
    s = settings_factory(vision_model="test-vision", vision_base_url=endpoint, vision_api_key="k", llm_timeout_s=0.2)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    FakeOpenAI.delay_s = 30.0
    try:
        driver = Driver(c)
        url = put(tmp_path, "t.png", text_image(TICKET))
        driver.publish([message("trip", "alice", 1, "pass", [Attachment(url=url)])])
        driver.advance("trip")
        queued = list(driver.attachments)
        started = time.monotonic()
        with pytest.raises(TransientError, match="timed out|unavailable"):
            driver.run_attachments()
        assert time.monotonic() - started < 25.0  # the timeout ended it, not the endpoint
        assert scalar(c, "SELECT status FROM artifacts") == "pending"  # the claim was given back
        driver.attachments = queued
        assert driver.run_attachments(last_attempt=True) == ["done"]
        assert "with the text" in message_text(c, "trip-1")  # the offline description
    finally:
        FakeOpenAI.delay_s = 0.0
        c.close()


def test_after_a_vision_model_change_reanalysis_swaps_the_description_in(settings_factory, endpoint, tmp_path):
    offline = settings_factory()
    c = Container(offline, ServiceUrls(offline.database_url, offline.redis_url, False, False))
    try:
        driver = Driver(c)
        url = put(tmp_path, "t.png", text_image(TICKET))
        driver.publish([message("trip", "alice", 1, "pass", [Attachment(url=url)])])
        driver.advance("trip")
        assert driver.run_attachments() == ["done"]
        before = message_text(c, "trip-1")
        assert "a boarding pass for a flight to Lisbon" not in before  # OCR and image metadata only
    finally:
        c.close()
    # The same database, now with a vision model configured.
    s = offline.model_copy(update={"vision_model": "test-vision", "vision_base_url": endpoint, "vision_api_key": "k"})
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        assert c.reanalyse_attachments() == {"files": 1, "failed": 0}
        assert message_text(c, "trip-1").endswith("] a boarding pass for a flight to Lisbon")
        assert scalar(c, "SELECT meta ->> 'vision_model' FROM artifacts") == "test-vision"
        with c.pool.connection() as conn:
            kinds = {r[0] for r in conn.execute("SELECT kind FROM artifact_text")}
        assert {"ocr", "vision_short", "vision_detail"} <= kinds
        hit = c.recall("alice", "boarding pass for a flight to Lisbon", scope="artifacts").hits[0]
        assert hit.citation.event_id == "trip-1"
    finally:
        c.close()
