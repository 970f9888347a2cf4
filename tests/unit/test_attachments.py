"""Attachment logic without I/O: sniffing, declared-type checks, structure-aware chunks,
surrogates, the question detector, and the job's rules over in-memory fakes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatmem.adapters.images import guess_binary
from chatmem.memory.attachments.analysis import Analyzer, KeptSpeech, Reader
from chatmem.memory.attachments.chunks import Block, DerivedText, chunk_blocks
from chatmem.memory.attachments.errors import BadFile
from chatmem.memory.attachments.filetypes import (
    DOCX_MIME,
    PPTX_MIME,
    XLS_MIME,
    XLSX_MIME,
    Sniffed,
    declared_mismatch,
    decode_text,
    has_sound,
    sniff,
    text_encoding,
)
from chatmem.memory.attachments.job import AttachmentJob
from chatmem.memory.attachments.ports import Analysis, Extraction, ImageInfo
from chatmem.memory.attachments.queries import about_attachment
from chatmem.memory.attachments.surrogates import clock
from chatmem.memory.episodes import message_text
from chatmem.memory.ports import TransientError
from chatmem.memory.prompts import FileSummary
from tests.fakes import (
    FakeAttachmentStore,
    FakeBlobStore,
    FakeDocumentReader,
    FakeFetcher,
    FakeImageReader,
    FakeOcr,
    FakeTranscriber,
    FakeVideoReader,
    FakeVision,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40


def magic(data: bytes) -> str | None:
    return "image/png" if data.startswith(b"\x89PNG") else "application/pdf" if data.startswith(b"%PDF") else None


def words(text: str) -> int:
    return len(text.split())


def test_the_type_comes_from_the_bytes():
    assert sniff(PNG, "notes.txt", magic) == Sniffed("image/png", "image")
    assert sniff(b"%PDF-1.7 ...", None, magic) == Sniffed("application/pdf", "document")
    assert sniff(b"<!DOCTYPE html><html><p>x</p>", "a.txt", magic).mime == "text/html"
    assert sniff(b"# Title\n\n- one\n- two\n", None, magic).mime == "text/markdown"
    assert sniff(b"just words", "readme.md", magic).mime == "text/markdown"
    assert sniff("привет, мир".encode(), None, magic).mime == "text/plain"
    for data, reason in ((b"", "empty"), (b"\x00\x01\x02binary", "unknown type"), (b"\xfa\xff\xfe" * 40, "not text")):
        with pytest.raises(BadFile, match=reason):
            sniff(data, None, magic)
    with pytest.raises(BadFile, match="application/zip"):
        sniff(b"PK\x03\x04", None, lambda _: "application/zip")


# What Windows Notepad, PowerShell's `>` and older programs save: byte order marks, UTF-16 and
# legacy code pages. Each was refused as binary or read as plain text with its tags.
@given(st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs", "Cn"]), min_size=1))
def test_text_with_a_byte_order_mark_is_read_in_its_encoding(text):
    for codec in ("utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32"):
        data = text.encode(codec)
        if codec in ("utf-16-le", "utf-16-be"):  # Python writes no mark for these; Windows does
            data = ("\ufeff" + text).encode(codec)
        assert sniff(data, None, magic).kind == "document"
        assert decode_text(data) == text


LEGACY_TEXTS = {
    "cp1252": "Mañana por la mañana vamos a España con el niño. ¿Dónde está el informe del año pasado? "
    "Ça va très bien, merci: la réunion est déplacée à quatorze heures. Coffee costs €450 a month.",
    "cp1251": "Привет! Завтра встреча в офисе в десять утра. Не забудь ноутбук и пропуск. Нужно обсудить "
    "бюджет на следующий квартал. Ещё купи, пожалуйста, молоко, хлеб и сыр по дороге домой.",
    "cp1250": "Dobrý den, jak se máte? Zítra máme schůzku v kanceláři v deset hodin. Nezapomeňte si vzít "
    "notebook a průkaz. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "koi8_r": "Привет! Завтра встреча в офисе в десять утра. Не забудь ноутбук и пропуск.",
    "cp866": "Привет! Завтра встреча в офисе в десять утра. Не забудь ноутбук и пропуск.",
    "cp1253": "Καλημέρα, η συνάντηση είναι αύριο στις δέκα το πρωί στο γραφείο. Μην ξεχάσετε το φορητό.",
    "cp932": "明日の会議は十時からです。資料を忘れないでください。予算について話し合う必要があります。",
    "gb18030": "明天的会议十点开始。请不要忘记带资料。我们需要讨论下个季度的预算和招聘计划。谢谢大家。",
}


@pytest.mark.parametrize("codec", LEGACY_TEXTS)
def test_a_paragraph_in_a_legacy_code_page_is_read(codec):
    data = LEGACY_TEXTS[codec].encode(codec)
    assert sniff(data, "notes.txt", magic) == Sniffed("text/plain", "document")
    assert decode_text(data) == LEGACY_TEXTS[codec]


def test_a_long_legacy_text_is_read_from_its_head_cut_at_a_line():
    # The head ends inside a two-byte character unless it is cut back to a line's end.
    line = LEGACY_TEXTS["cp932"] + "\n"
    data = (line * (80_000 // len(line.encode("cp932")) + 1)).encode("cp932")
    assert text_encoding(data) in ("cp932", "shift_jis") and decode_text(data).startswith(LEGACY_TEXTS["cp932"])


def test_html_and_markdown_saved_with_a_mark_keep_their_shape():
    html = "<!DOCTYPE html><html><body><h1>Plan</h1></body></html>"
    assert sniff(html.encode("utf-8-sig"), None, magic).mime == "text/html"
    assert sniff(html.encode("utf-16"), None, magic).mime == "text/html"
    assert sniff("# Plan\n\n- one\n- two\n".encode("utf-16"), None, magic).mime == "text/markdown"


def test_a_byte_order_mark_before_binary_bytes_is_still_refused():
    for data in (b"\xff\xfe\xfa" * 40, b"\xef\xbb\xbf\x00\x01\x02\x03" * 10, b"\xfe\xff\xd8\x00" * 20):
        with pytest.raises(BadFile, match="not text"):
            sniff(data, None, magic)


def test_a_word_document_is_a_document_by_its_magic_number():
    word = Sniffed(DOCX_MIME, "document")
    assert sniff(b"PK\x03\x04 ...", "plan.docx", lambda _: DOCX_MIME) == word
    assert declared_mismatch("document", DOCX_MIME, word) is None
    assert declared_mismatch("image", None, word) == f"declared as an image but the bytes are {DOCX_MIME}"
    assert sniff(b"PK\x03\x04 ...", "costs.xlsx", lambda _: XLSX_MIME) == Sniffed(XLSX_MIME, "document")
    assert sniff(b"PK\x03\x04 ...", "review.pptx", lambda _: PPTX_MIME) == Sniffed(PPTX_MIME, "document")
    assert sniff(b"\xd0\xcf\x11\xe0 ...", "costs.xls", lambda _: XLS_MIME) == Sniffed(XLS_MIME, "document")


def test_a_declared_type_may_be_generic_but_not_wrong():
    image, pdf = Sniffed("image/png", "image"), Sniffed("application/pdf", "document")
    assert declared_mismatch("image", "image/jpeg", image) is None  # same kind of file: fine
    assert declared_mismatch("other", "application/octet-stream", pdf) is None
    assert declared_mismatch("document", None, image) is None  # a photo sent "as a file"
    assert declared_mismatch("image", "image/png", pdf) == "declared as image/png but the bytes are application/pdf"
    assert "declared as an image" in declared_mismatch("image", None, pdf)
    assert "declared as text/plain" in declared_mismatch(None, "text/plain", image)


def test_chunks_follow_headings_and_carry_their_path_and_page():
    blocks = [
        Block("Guide", heading=True, level=1),
        Block("Intro text.", page=1),
        Block("Setup", heading=True, level=2),
        Block("Install it.", page=1),
        Block("Configure it.", page=2),
        Block("Usage", heading=True, level=2),
        Block("Run it.", page=3),
    ]
    chunks = chunk_blocks(blocks, 50, words)
    assert [c.text for c in chunks] == [
        "Guide\nIntro text.",
        "Guide > Setup\nInstall it.\nConfigure it.",
        "Guide > Usage\nRun it.",
    ]
    assert chunks[1].meta == {"section": "Guide > Setup", "page": 1, "last_page": 2}
    assert [c.ord for c in chunks] == [0, 1, 2]


@given(st.lists(st.text(alphabet="ab .", min_size=0, max_size=300), max_size=30), st.integers(5, 60))
def test_chunks_never_exceed_the_size_and_keep_every_word(paragraphs, size):
    chunks = chunk_blocks([Block(p) for p in paragraphs], size, words)
    assert all(words(c.text) <= size for c in chunks)
    assert " ".join(c.text for c in chunks).split() == " ".join(paragraphs).split()


def test_surrogates_replace_the_placeholder_once_known():
    payload = {"text": "look", "attachments": [{"url": "x", "kind": "image", "caption": "my cat"}, {"url": "y"}]}
    assert message_text(payload) == "look\n[image] my cat\n[file]"
    multiline = {"text": "", "attachments": [{"url": "x", "filename": "a.pdf", "caption": "two\nlines"}]}
    assert message_text(multiline) == "[file] a.pdf two lines"  # one line per attachment, always


def test_questions_about_attachments_are_recognised():
    for q in (
        "what was in the PDF I sent?",
        "the screenshot from yesterday",
        "что было на фото?",
        "show image#a1b2c3d4",
    ):
        assert about_attachment(q), q
    for q in ("what is my name?", "profile of the river", "how was the trip"):
        assert not about_attachment(q), q


class Embed:
    model, dim = "fake", 3

    def embed(self, texts):
        return np.ones((len(texts), 3)) / np.sqrt(3)


def job_with(files, analyze=None):
    store, blobs = FakeAttachmentStore(), FakeBlobStore()
    calls = []

    def default(data, sniffed, filename):
        calls.append(data)
        return Analysis("a cat", [DerivedText("ocr", 0, "CAT")], {})

    job = AttachmentJob(store, blobs, FakeFetcher(files), analyze or default, Embed(), magic)
    return job, store, blobs, calls


def test_the_same_bytes_are_analysed_once_and_every_message_gets_the_surrogate():
    job, store, blobs, calls = job_with({"file:///a": PNG, "file:///b": PNG})
    store.add_message("e1", "t1", "u1", {"text": "", "attachments": [{"url": "file:///a", "caption": "hi"}]})
    store.add_message("e2", "t2", "u2", {"text": "again", "attachments": [{"url": "file:///b"}]})
    assert job("e1", 0) == "done"
    assert job("e2", 0) == "artifact done"
    assert job("e1", 0) == "artifact done"  # a redelivered job does nothing new
    assert len(calls) == 1 and len(blobs.blobs) == 1
    sha = next(iter(blobs.blobs))
    assert store.message_text("e1") == f"[image#{sha[:8]}] hi — a cat"
    assert store.message_text("e2") == f"again\n[image#{sha[:8]}] a cat"
    assert store.captions == {("e1", 0): "hi"}


def test_bad_files_fail_at_once_and_transient_errors_are_retried_then_recorded():
    job, store, _, _ = job_with({"file:///pdf": b"%PDF-1.4", "https://x/y": TransientError("cannot reach x")})
    store.add_message("e1", "t", "u", {"text": "", "attachments": [{"url": "file:///pdf", "kind": "image"}]})
    store.add_message("e2", "t", "u", {"text": "", "attachments": [{"url": "https://x/y"}]})
    assert job("e1", 0) == "failed"
    assert "declared as an image" in store.refs[("e1", 0)].reason
    with pytest.raises(TransientError):
        job("e2", 0)
    assert store.refs[("e2", 0)].status == "pending"
    assert job("e2", 0, last_attempt=True) == "failed"
    assert store.message_text("e2") == "[file] (not readable)"


def test_a_failing_analysis_releases_its_claim_for_the_retry():
    def flaky(data, sniffed, filename):
        raise TransientError("vision model down")

    job, store, _, _ = job_with({"file:///a": PNG}, flaky)
    store.add_message("e1", "t", "u", {"text": "", "attachments": [{"url": "file:///a"}]})
    with pytest.raises(TransientError):
        job("e1", 0)
    sha = store.refs[("e1", 0)].sha256
    assert store.artifacts[sha]["status"] == "pending"  # claimable again
    job.analyze = lambda data, sniffed, filename: (_ for _ in ()).throw(BadFile("corrupt image: truncated"))
    assert job("e1", 0) == "failed"
    assert store.artifacts[sha]["reason"] == "corrupt image: truncated"
    assert store.message_text("e1").endswith("(not readable)")


class Llm:
    model = "fake"

    def complete(self, prompt, response_model):
        assert prompt.name == "file_summary"
        return FileSummary(title="A title", summary="It says things.")


def analyzer(ocr_lines=(), vision=None, docs=None):
    images = FakeImageReader(ImageInfo("PNG", 640, 160, {"camera_model": "X100"}))
    return Analyzer(images, FakeOcr(ocr_lines), docs or FakeDocumentReader(), Llm(), words, 100, vision)


def test_images_are_described_by_the_vision_model_when_there_is_one_else_by_ocr_and_metadata():
    image = Sniffed("image/png", "image")
    offline = analyzer([("TOTAL 12.50", 0.98), ("smudge", 0.2)])(PNG, image, None)
    assert offline.description == 'PNG image, 640×160 with the text "TOTAL 12.50"'
    assert [t.kind for t in offline.texts] == ["ocr"]  # low-confidence OCR lines are dropped
    bare = analyzer()(PNG, image, None)
    assert [(t.kind, t.text) for t in bare.texts] == [("vision_short", "PNG image, 640×160")]
    seen = analyzer([("TOTAL 12.50", 0.98)], FakeVision("a receipt"))(PNG, image, None)
    assert seen.description == "a receipt" and seen.meta["vision_model"] == "fake-vision"
    assert [t.kind for t in seen.texts] == ["ocr", "vision_short", "vision_detail"]
    with pytest.raises(TransientError):
        analyzer([], FakeVision(fail=TransientError("down")))(PNG, image, None)


def test_a_recording_is_read_only_by_a_transcriber_and_never_by_the_readers():
    voice = Sniffed("audio/ogg", "audio")

    def no_reading(data: bytes, sniffed: Sniffed) -> Extraction:
        raise AssertionError("a recording goes to no reader")

    def with_speech(transcriber: FakeTranscriber | None) -> Analyzer:
        readers = (FakeImageReader(), FakeOcr(), FakeDocumentReader())
        return Analyzer(*readers, Llm(), words, 8, read=no_reading, transcriber=transcriber)

    speech = FakeTranscriber("  The plumber comes on Thursday.\nThe gate code is 7731. " + "More words here. " * 3)
    heard = with_speech(speech)(b"OggS voice", voice, "voice.oga")
    assert speech.calls == [(b"OggS voice", "audio/ogg")]
    assert heard.description.startswith('recording: "The plumber comes on Thursday. The gate code is 7731.')
    assert [t.kind for t in heard.texts] == ["transcript"] * len(heard.texts) and len(heard.texts) > 1
    assert all(words(t.text) <= 8 for t in heard.texts)  # cut to the chunk size, between sentences
    assert heard.meta == {"transcription_model": "fake-whisper"}
    with pytest.raises(BadFile, match="CHATMEM_TRANSCRIPTION_MODEL"):
        with_speech(None)(b"OggS voice", voice, None)
    with pytest.raises(BadFile, match="no speech"):
        with_speech(FakeTranscriber(" \n "))(b"OggS voice", voice, None)
    with pytest.raises(TransientError):
        with_speech(FakeTranscriber(fail=TransientError("down")))(b"OggS voice", voice, None)


def test_audio_is_sniffed_from_its_magic_number_and_may_be_declared_as_audio():
    voice = sniff(b"OggS\x00\x02...", None, lambda _: "audio/ogg")
    assert voice == Sniffed("audio/ogg", "audio")
    assert declared_mismatch("audio", "audio/ogg", voice) is None
    image = Sniffed("image/png", "image")
    assert declared_mismatch("audio", None, image) == "declared as audio; the bytes are image/png"
    assert declared_mismatch("document", "audio/mpeg", Sniffed("application/pdf", "document")) is not None
    with pytest.raises(BadFile, match="audio/amr are not understood"):  # a format the endpoints do not take
        sniff(b"#!AMR\n", None, lambda _: "audio/amr")
    # A video's speech is read the same way (Telegram's round video messages are MP4).
    video = sniff(b"\x00\x00\x00\x18ftypmp42", None, lambda _: "video/mp4")
    assert video == Sniffed("video/mp4", "video")
    assert declared_mismatch("video", "video/mp4", video) is None
    assert declared_mismatch("video", None, image) == "declared as video; the bytes are image/png"
    # An iPhone's QuickTime .mov, and the other containers FFmpeg reads, are videos too.
    for mime in ("video/quicktime", "video/x-m4v", "video/x-matroska", "video/3gpp", "video/x-msvideo"):
        assert sniff(b"\x00\x00\x00\x14ftypqt  ", None, lambda _, m=mime: m) == Sniffed(mime, "video")
    with pytest.raises(BadFile, match="video/x-flv are not understood"):
        sniff(b"FLV\x01", None, lambda _: "video/x-flv")


def iso_file(brand: bytes, *compatible: bytes) -> bytes:
    """The start of an ISO media file: its `ftyp` box, then filler."""
    ftyp = b"ftyp" + brand + bytes(4) + b"".join(compatible)
    return (8 + len(ftyp) - 4).to_bytes(4, "big") + ftyp + bytes(64)


@pytest.mark.parametrize("brand", [b"heic", b"heix", b"heim", b"heis"])
def test_a_heic_photo_is_told_by_its_brand(brand):
    # `filetype` knows `heic` only; phones and cameras also write the 10-bit and layered brands.
    assert sniff(iso_file(brand, b"mif1", brand), "IMG_0001.HEIC", guess_binary) == Sniffed("image/heic", "image")


def test_other_iso_media_files_are_not_taken_for_heic():
    assert guess_binary(iso_file(b"avif", b"mif1", b"avif")) == "image/avif"
    assert guess_binary(iso_file(b"mp42", b"isom")) == "video/mp4"
    with pytest.raises(BadFile, match="not understood|unknown type"):
        sniff(iso_file(b"hevc", b"mif1"), None, guess_binary)  # an image sequence (a burst): not read


HANDLER = b"\x00\x00\x00\x21hdlr" + bytes(8)
SOUND = b"ftypmp42" + HANDLER + b"vide" + HANDLER + b"soun"  # an MP4 with a sound track
MP4 = Sniffed("video/mp4", "video")


def test_a_video_without_a_sound_track_is_not_sent_to_the_speech_model():
    assert has_sound(SOUND, "video/mp4")
    assert not has_sound(b"ftypmp42" + HANDLER + b"vide", "video/mp4")  # a GIF as Telegram sends it
    assert has_sound(b"ftypqt  " + HANDLER + b"soun", "video/quicktime")  # QuickTime: mhlr, then soun
    assert has_sound(b"\x1aE\xdf\xa3 webm A_OPUS", "video/webm") and not has_sound(b"V_VP9", "video/webm")
    assert has_sound(b"OggS", "audio/ogg")  # audio is sound
    speech = FakeTranscriber("never asked")
    seen = video_analyzer(FakeOcr([("HAPPY BIRTHDAY", 0.9)]), speech)(b"ftypmp42" + HANDLER + b"vide", MP4, None)
    assert speech.calls == [] and seen.meta["speech"] == "no sound track"
    assert seen.description == 'video 0:42, 1280×720 with the text "HAPPY BIRTHDAY"'


def video_analyzer(ocr=None, transcriber=None, videos=None, vision=None) -> Analyzer:
    readers = (FakeImageReader(), ocr or FakeOcr(), FakeDocumentReader())
    videos = videos or FakeVideoReader()
    return Analyzer(*readers, Llm(), words, 8, vision=vision, transcriber=transcriber, videos=videos)


def test_a_video_is_read_for_the_text_in_its_pictures_each_line_once_and_for_its_speech():
    ocr = FakeOcr(
        by_image={
            b"p0": [("GATE B12", 0.95), ("BOARDING 18:40", 0.9)],
            b"p1": [("Gate  b12", 0.9), ("blur", 0.1)],  # the same line again, and one OCR is unsure of
            b"p2": [("SEAT 14C", 0.9)],
        }
    )
    speech = FakeTranscriber("  We land at nine.\n")
    videos = FakeVideoReader([b"p0", b"p1", b"p2"])
    seen = video_analyzer(ocr, speech, videos)(SOUND, MP4, "clip.mp4")
    assert videos.limits == [8] and ocr.calls == 3
    assert [(t.kind, t.text) for t in seen.texts] == [
        ("ocr", "GATE B12\nBOARDING 18:40\nSEAT 14C"),
        ("transcript", "We land at nine."),
    ]
    assert speech.calls == [(SOUND, "video/mp4")]
    assert seen.description == 'video 0:42, 1280×720: "We land at nine."'  # what is said says most
    assert seen.meta == {
        "pictures_read": 3,
        "width": 1280,
        "height": 720,
        "codec": "h264",
        "seconds": 42.0,
        "transcription_model": "fake-whisper",
    }


def test_a_vision_model_is_shown_a_sheet_of_the_pictures_once():
    vision = FakeVision("a boarding gate at an airport")
    seen = video_analyzer(FakeOcr([("GATE B12", 0.9)]), vision=vision)(SOUND, MP4, None)
    assert vision.calls == [("image/jpeg", True)]
    assert seen.description == "a boarding gate at an airport" and seen.meta["vision_model"] == "fake-vision"
    assert [t.kind for t in seen.texts] == ["ocr", "vision_short", "vision_detail"]
    with pytest.raises(TransientError):  # an outage is retried, as for an image
        video_analyzer(vision=FakeVision(fail=TransientError("down")))(SOUND, MP4, None)


def test_why_a_videos_speech_was_not_heard_is_kept_and_its_pictures_stay_read():
    lines = FakeOcr([("ROOM 305", 0.9)])
    unheard = video_analyzer(lines)(SOUND, MP4, None)  # no speech-to-text model is set
    assert "CHATMEM_TRANSCRIPTION_MODEL" in unheard.meta["speech"] and [t.kind for t in unheard.texts] == ["ocr"]
    refused = FakeTranscriber(fail=BadFile("the speech-to-text endpoint refused the recording: HTTP 400"))
    assert video_analyzer(lines, refused)(SOUND, MP4, None).meta["speech"].endswith("HTTP 400")
    silent = video_analyzer(lines, FakeTranscriber(" "))(SOUND, MP4, None)
    assert silent.meta["speech"] == "none heard" and silent.meta["transcription_model"] == "fake-whisper"
    with pytest.raises(TransientError):  # an outage is retried
        video_analyzer(lines, FakeTranscriber(fail=TransientError("down")))(SOUND, MP4, None)
    # A container the endpoints do not take costs no call.
    speech = FakeTranscriber("never asked")
    mkv = video_analyzer(lines, speech)(b"\x1aE\xdf\xa3 matroska", Sniffed("video/x-matroska", "video"), None)
    assert (
        speech.calls == [] and mkv.meta["speech"] == "not read: speech-to-text endpoints do not take video/x-matroska"
    )


def test_a_video_fails_only_when_neither_its_pictures_nor_its_speech_can_be_read():
    broken = FakeVideoReader(fail="not a video FFmpeg can read")
    heard = video_analyzer(transcriber=FakeTranscriber("Hello from the beach."), videos=broken)(SOUND, MP4, None)
    assert heard.description == 'video: "Hello from the beach."' and [t.kind for t in heard.texts] == ["transcript"]
    assert heard.meta["pictures"] == "not read: not a video FFmpeg can read"
    with pytest.raises(BadFile) as refused:
        video_analyzer(videos=broken)(SOUND, MP4, None)
    assert str(refused.value) == (
        "pictures not read: not a video FFmpeg can read; speech not read: a recording is read by a "
        "speech-to-text model; none is set (CHATMEM_TRANSCRIPTION_MODEL)"
    )
    # Pictures without text and no speech: the video is still known by its length and size.
    bare = video_analyzer(FakeOcr())(b"ftypmp42" + HANDLER + b"vide", MP4, None)
    assert [(t.kind, t.text) for t in bare.texts] == [("vision_short", "video 0:42, 1280×720")]


def test_a_reanalysis_keeps_what_a_video_was_heard_to_say_or_why_it_was_not():
    analyze = video_analyzer(FakeOcr([("GATE B12", 0.9)]), FakeTranscriber("We land at nine."))
    first = analyze(SOUND, MP4, None)
    store = FakeAttachmentStore()
    store.artifacts["v"] = {}
    store.finish("v", first, np.zeros((len(first.texts), 4)))
    again = video_analyzer(FakeOcr([("GATE B12", 0.9)]), KeptSpeech(store.heard("v")))(SOUND, MP4, None)
    assert again == first
    unheard = video_analyzer(FakeOcr([("GATE B12", 0.9)]))(SOUND, MP4, None)  # no model then
    store.finish("v", unheard, np.zeros((1, 4)))
    kept = KeptSpeech(store.heard("v"))
    assert video_analyzer(transcriber=kept)(SOUND, MP4, None).meta["speech"] == unheard.meta["speech"]
    silent = video_analyzer(transcriber=FakeTranscriber(""))(SOUND, MP4, None)
    store.finish("v", silent, np.zeros((len(silent.texts), 4)))
    assert video_analyzer(transcriber=KeptSpeech(store.heard("v")))(SOUND, MP4, None).meta == silent.meta


@pytest.mark.parametrize(
    ("seconds", "expected"), [(0.5, "0:00"), (7.4, "0:07"), (59.6, "1:00"), (750, "12:30"), (3725, "1:02:05")]
)
def test_a_videos_length_reads_as_a_player_shows_it(seconds, expected):
    assert clock(seconds) == expected


def test_documents_get_chunks_and_a_summary():
    result = analyzer()(b"%PDF", Sniffed("application/pdf", "document"), "notes.pdf")
    assert [(t.kind, t.text) for t in result.texts] == [
        ("chunk", "Title\nBody text here."),
        ("file_summary", "A title: It says things."),
    ]
    assert result.description == "1 page: It says things."


def test_a_pdf_without_a_text_layer_is_read_by_ocr_of_its_page_images():
    pdf = Sniffed("application/pdf", "document")
    scan = FakeDocumentReader(blocks=[], images=[(1, PNG), (2, PNG)])
    result = analyzer([("Rent 950 EUR", 0.97)], docs=scan)(b"%PDF", pdf, "scan.pdf")
    assert result.meta["ocr_pages"] == 2
    assert result.texts[0].text == "Rent 950 EUR\nRent 950 EUR" and result.texts[0].meta["page"] == 1
    with pytest.raises(BadFile, match="no text"):
        analyzer([], docs=FakeDocumentReader(blocks=[], images=[]))(b"%PDF", pdf, "blank.pdf")
    with pytest.raises(BadFile, match="no text"):  # a text file with nothing in it has no pages to OCR
        one_page = FakeDocumentReader(blocks=[], images=[(1, PNG)])
        analyzer([("x", 0.9)], docs=one_page)(b"", Sniffed("text/plain", "document"), None)


def test_a_presentations_pictures_are_read_by_ocr_after_their_slides_text():
    deck = [Block("Budget", heading=True, level=1, page=1), Block("Desks.", page=1), Block("Slide 2", True, 1, 2)]
    icon, broken = b"icon", b"not an image"
    pictures = [(1, PNG), (2, PNG), (2, icon), (2, broken), (2, PNG + b"2")]  # the same picture twice
    images = FakeImageReader(corrupt=[broken], others={icon: ImageInfo("PNG", 32, 32, {})})
    ocr = FakeOcr([("LAUNCH 14 MARCH", 0.96)])
    read = Reader(images, ocr, FakeDocumentReader(blocks=deck, images=pictures))(b"PK", Sniffed(PPTX_MIME, "document"))
    assert [(b.text, b.page) for b in read.blocks] == [
        ("Budget", 1),
        ("Desks.", 1),
        ("LAUNCH 14 MARCH", 1),  # after its slide's text
        ("Slide 2", 2),
        ("LAUNCH 14 MARCH", 2),  # the other picture: the repeated one, the icon and the broken one are not read
    ]
    assert read.meta["ocr_pictures"] == 2 and ocr.calls == 2
    # A Word document's pages are not known: its pictures' text follows all of its own.
    doc = [Block("Lease", heading=True, level=1), Block("See the scan.")]
    word = Reader(images, ocr, FakeDocumentReader(blocks=doc, images=[(None, PNG)]))(
        b"PK", Sniffed(DOCX_MIME, "document")
    )
    assert [b.text for b in word.blocks] == ["Lease", "See the scan.", "LAUNCH 14 MARCH"]
    # Without pictures, or for another kind of file, nothing changes.
    plain = Reader(images, ocr, FakeDocumentReader(blocks=deck))(b"PK", Sniffed(PPTX_MIME, "document"))
    assert plain.blocks == deck and "ocr_pictures" not in plain.meta


def test_the_reading_runs_behind_the_read_port_and_the_models_stay_with_the_job():
    ocr = FakeOcr([("TOTAL 12.50", 0.98), ("smudge", 0.2)])
    images = FakeImageReader(ImageInfo("PNG", 640, 160, {}))
    image = Sniffed("image/png", "image")
    # The Reader is the CPU-heavy half: header and OCR lines, low-confidence lines dropped.
    assert Reader(images, ocr, FakeDocumentReader())(PNG, image) == Extraction(
        info=ImageInfo("PNG", 640, 160, {}), lines=["TOTAL 12.50"]
    )
    # Another Read (a helper process, say) replaces it; chunks, summary and vision stay here.
    elsewhere = Extraction(blocks=[Block("Read elsewhere.", page=1)], meta={"pages": 1})
    ocr.calls = 0
    plugged = Analyzer(images, ocr, FakeDocumentReader(), Llm(), words, 100, read=lambda data, sniffed: elsewhere)
    result = plugged(b"%PDF", Sniffed("application/pdf", "document"), "x.pdf")
    assert [t.text for t in result.texts] == ["Read elsewhere.", "A title: It says things."]
    assert result.description == "1 page: It says things."
    deck = Extraction(
        blocks=[Block("Budget", heading=True, level=1, page=1), Block("Desks.", page=1)], meta={"slides": 12}
    )
    slides = Analyzer(images, ocr, FakeDocumentReader(), Llm(), words, 100, read=lambda data, sniffed: deck)
    assert slides(b"PK", Sniffed(PPTX_MIME, "document"), "q3.pptx").description == "12 slides: It says things."
    seen = Analyzer(
        images,
        ocr,
        FakeDocumentReader(),
        Llm(),
        words,
        100,
        FakeVision("a receipt"),
        read=lambda d, s: Extraction(info=ImageInfo("JPEG", 10, 10, {}), lines=["TOTAL 3"]),
    )(PNG, image, None)
    assert seen.description == "a receipt" and seen.meta["format"] == "JPEG"
    assert ocr.calls == 0  # the in-process readers were not used


def test_a_read_that_fails_or_times_out_fails_the_artifact_and_the_next_job_runs():
    def read(data, sniffed):
        if data == b"%PDF slow":
            raise BadFile("analysis took longer than 120 s; it was stopped")
        return Extraction(blocks=[Block("Fine text.")], meta={"pages": 1})

    analyze = Analyzer(FakeImageReader(), FakeOcr(), FakeDocumentReader(), Llm(), words, 100, read=read)
    job, store, _, _ = job_with({"file:///slow": b"%PDF slow", "file:///ok": b"%PDF ok"}, analyze)
    store.add_message("e1", "t", "u", {"text": "", "attachments": [{"url": "file:///slow"}]})
    store.add_message("e2", "t", "u", {"text": "", "attachments": [{"url": "file:///ok"}]})
    assert job("e1", 0) == "failed"
    sha = store.refs[("e1", 0)].sha256
    assert store.artifacts[sha]["reason"] == "analysis took longer than 120 s; it was stopped"
    assert store.message_text("e1").endswith("(not readable)")
    assert job("e2", 0) == "done"


def test_a_flat_open_document_is_told_by_the_type_its_root_names():
    root = '<office:document xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" office:version="1.3"'
    for kind in ("text", "spreadsheet", "presentation"):
        for quote in "\"'":
            named = f"office:mimetype={quote}application/vnd.oasis.opendocument.{kind}{quote}"
            data = f'<?xml version="1.0" encoding="UTF-8"?>\n{root} {named}>'
            mime = f"application/vnd.oasis.opendocument.{kind}-flat-xml"
            assert sniff(data.encode(), None, lambda _: None) == Sniffed(mime, "document")
    drawing = f'{root} office:mimetype="application/vnd.oasis.opendocument.graphics">'.encode()
    assert sniff(drawing, None, lambda _: None) == Sniffed("text/plain", "document")  # not read as one
    flat = Sniffed("application/vnd.oasis.opendocument.text-flat-xml", "document")
    for declared in ("application/vnd.oasis.opendocument.text-flat-xml", "application/xml", "text/xml", None):
        assert declared_mismatch("document", declared, flat) is None
