"""Speech to text against a local OpenAI-compatible endpoint (no model is reachable from here):
a voice note is uploaded under a name that says its format, its words become `transcript` texts
and its surrogate, and recall finds it; a video's words join the text of its pictures; an
endpoint that is down is retried, then the file fails saying so; one that refuses the recording
fails it at once; with no model set, recordings fail with the setting to set."""

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.memory.ports import TransientError
from chatmem.schemas.events import Attachment
from chatmem.schemas.read import Scope
from tests.conftest import scalar
from tests.fake_openai import FakeOpenAI, serving
from tests.integration.test_attachments import message, message_text, put
from tests.integration.test_episodes import Driver
from tests.integration.test_video import video

pytestmark = pytest.mark.integration

# What `filetype` reads as OGG (Telegram's and Discord's voice notes are OGG/Opus); the endpoint
# here does not decode it.
VOICE = b"OggS\x00\x02" + bytes(22) + b"\x01\x13OpusHead" + bytes(200)
WORDS = "Remind me that the plumber comes on Thursday at nine. The code for the gate is 7731."


@pytest.fixture
def endpoint():
    with serving() as url:
        FakeOpenAI.body = {"text": WORDS}
        yield url


def voice_container(settings_factory, endpoint, **kw):
    s = settings_factory(
        transcription_model="test-whisper", transcription_base_url=endpoint, transcription_api_key="k", **kw
    )
    return Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))


@pytest.fixture
def container_with_speech(settings_factory, endpoint):
    c = voice_container(settings_factory, endpoint)
    yield c
    c.close()


def send_voice_note(c: Container, tmp_path) -> Driver:
    driver = Driver(c)
    note = Attachment(url=put(tmp_path, "voice.oga", VOICE), kind="audio", mime_type="audio/ogg")
    driver.publish([message("home", "alice", 1, "", [note])])
    driver.advance("home")
    return driver


def test_a_voice_note_is_transcribed_and_found(container_with_speech, tmp_path):
    c = container_with_speech
    assert send_voice_note(c, tmp_path).run_attachments() == ["done"]
    [request] = FakeOpenAI.requests
    assert request["path"] == "/v1/audio/transcriptions"
    form = request["form"]
    assert b'filename="recording.ogg"' in form and b"test-whisper" in form and VOICE in form
    assert scalar(c, "SELECT text FROM artifact_text WHERE kind = 'transcript'") == WORDS
    assert scalar(c, "SELECT kind FROM artifacts") == "audio"
    assert scalar(c, "SELECT meta ->> 'transcription_model' FROM artifacts") == "test-whisper"
    assert message_text(c, "home-1").startswith("[file#") and 'recording: "Remind me that the plumber' in message_text(
        c, "home-1"
    )
    hits = c.recall("alice", "what is the gate code?", scope=Scope.ARTIFACTS).hits
    assert hits and "7731" in hits[0].snippet and hits[0].citation.event_id == "home-1"


def test_a_videos_speech_and_pictures_are_read_and_a_silent_animation_costs_no_call(container_with_speech, tmp_path):
    # Telegram's round video messages are MP4 with sound, its GIFs MP4 without a sound track; an
    # iPhone's video is a QuickTime .mov, which the endpoint is sent as the MP4 it is named.
    c = container_with_speech
    driver = Driver(c)
    files = [
        Attachment(url=put(tmp_path, "video_note.mp4", video("phone.mp4")), kind="video", mime_type="video/mp4"),
        Attachment(url=put(tmp_path, "animation.mp4", video("animation.mp4")), kind="video", mime_type="video/mp4"),
        Attachment(url=put(tmp_path, "IMG_0042.MOV", video("turned.mov")), kind="video", mime_type="video/quicktime"),
    ]
    driver.publish([message("home", "alice", 1, "", files)])
    driver.advance("home")
    assert driver.run_attachments() == ["done"] * 3
    forms = sorted((r["form"] for r in FakeOpenAI.requests), key=len)
    assert len(forms) == 2  # the animation has no sound track: no call
    assert all(b'filename="recording.mp4"' in f and b"Content-Type: video/mp4" in f for f in forms)
    assert video("turned.mov") in forms[0] and video("phone.mp4") in forms[1]
    with c.pool.connection() as conn:
        rows = conn.execute(
            "SELECT a.mime_type, a.meta ->> 'speech', string_agg(t.text, ' | ' ORDER BY t.kind, t.ord)"
            " FROM artifacts a JOIN artifact_text t USING (sha256) GROUP BY a.mime_type, a.meta ORDER BY a.mime_type, 2"
        ).fetchall()
    assert [(mime, speech, text.upper()) for mime, speech, text in rows] == [
        ("video/mp4", "no sound track", "HAPPY BIRTHDAY\nMARTA"),
        ("video/mp4", None, f"GATE B12\nBOARDING 18:40\nSEAT 14C\nLISBON | {WORDS.upper()}"),
        ("video/quicktime", None, f"ROOM 305\nCHECKOUT 11 | {WORDS.upper()}"),
    ]
    assert "[file#" in message_text(c, "home-1") and "video 0:02, 480×270 with the text" in message_text(c, "home-1")
    hits = c.recall("alice", "which gate do we board at?", scope=Scope.ARTIFACTS).hits
    assert hits and "B12" in hits[0].snippet.upper() and hits[0].citation.event_id == "home-1"


def test_an_endpoint_that_is_down_is_retried_then_the_recording_fails_saying_so(container_with_speech, tmp_path):
    c = container_with_speech
    FakeOpenAI.status, FakeOpenAI.body = 503, {"error": {"message": "down"}}
    driver = send_voice_note(c, tmp_path)
    queued = list(driver.attachments)
    with pytest.raises(TransientError):
        driver.run_attachments()
    assert scalar(c, "SELECT status FROM artifacts") == "pending"  # the claim was given back
    driver.attachments = queued
    assert driver.run_attachments(last_attempt=True) == ["failed"]  # no offline stand-in for speech
    assert scalar(c, "SELECT reason FROM artifacts").startswith("gave up after retries: speech-to-text unavailable")
    assert message_text(c, "home-1").endswith("(not readable)")


def test_a_recording_the_endpoint_refuses_fails_at_once(container_with_speech, tmp_path):
    c = container_with_speech
    FakeOpenAI.status, FakeOpenAI.body = 400, {"error": {"message": "Invalid file format."}}
    assert send_voice_note(c, tmp_path).run_attachments() == ["failed"]
    assert len(FakeOpenAI.requests) == 1
    assert scalar(c, "SELECT reason FROM artifacts") == "the speech-to-text endpoint refused the recording: HTTP 400"


def test_without_a_model_a_recording_fails_saying_so_and_a_retry_reads_it_once_one_is_set(
    settings_factory, endpoint, tmp_path
):
    offline = settings_factory()
    c = Container(offline, ServiceUrls(offline.database_url, offline.redis_url, False, False))
    try:
        assert send_voice_note(c, tmp_path).run_attachments() == ["failed"]
        assert "CHATMEM_TRANSCRIPTION_MODEL" in scalar(c, "SELECT reason FROM artifacts")
        assert FakeOpenAI.requests == []
    finally:
        c.close()
    # The same database, now with a model set: `chatmem attachments retry` queues the file again.
    s = offline.model_copy(
        update={"transcription_model": "test-whisper", "transcription_base_url": endpoint, "transcription_api_key": "k"}
    )
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        driver = Driver(c)
        driver.attachments = c.attachment_store.reset_failed()
        assert driver.run_attachments() == ["done"]
        assert 'recording: "Remind me' in message_text(c, "home-1")
    finally:
        c.close()


def test_a_reanalysis_sends_recordings_again_only_when_asked(container_with_speech, tmp_path):
    # Their words depend on the speech model alone; after a change of OCR or vision settings,
    # sending them again would bill every minute again for the same words. A video's pictures are
    # read again, with the words it was heard to say.
    c = container_with_speech
    driver = send_voice_note(c, tmp_path)
    clip = Attachment(url=put(tmp_path, "clip.mp4", video("phone.mp4")), kind="video", mime_type="video/mp4")
    driver.publish([message("home", "alice", 2, "", [clip])])
    driver.advance("home")
    assert driver.run_attachments() == ["done", "done"]
    assert len(FakeOpenAI.requests) == 2

    def texts() -> list[tuple[str, str, str]]:
        with c.pool.connection() as conn:
            return conn.execute(
                "SELECT a.kind, t.kind, t.text FROM artifact_text t JOIN artifacts a USING (sha256)"
                " ORDER BY a.kind, t.kind, t.ord"
            ).fetchall()

    before = texts()
    with c.pool.connection() as conn:  # as if an older OCR had read less of the video
        conn.execute("UPDATE artifact_text SET text = 'GATE' WHERE kind = 'ocr'")
    assert c.reanalyse_attachments() == {"files": 1, "failed": 0}  # the video; the voice note is left
    assert len(FakeOpenAI.requests) == 2 and texts() == before
    assert scalar(c, "SELECT meta ->> 'transcription_model' FROM artifacts WHERE kind = 'video'") == "test-whisper"
    FakeOpenAI.body = {"text": "The gate code changed to 8842."}
    assert c.reanalyse_attachments(recordings=True) == {"files": 2, "failed": 0}
    assert len(FakeOpenAI.requests) == 4
    with c.pool.connection() as conn:
        heard = conn.execute("SELECT text FROM artifact_text WHERE kind = 'transcript'").fetchall()
    assert heard == [("The gate code changed to 8842.",)] * 2
    assert 'recording: "The gate code changed to 8842."' in message_text(c, "home-1")
