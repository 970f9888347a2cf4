"""Analysis of an artifact's bytes: OCR and a description for images; the same of a video's
pictures, with its speech; text, chunks and a summary for documents (a PDF without a text layer
is OCR'd page by page); the speech of a recording.

Two steps: a Reader does the CPU-heavy reading (decoding, OCR, PDF text) and returns an
Extraction; the Analyzer turns that into chunks, a summary and a description (token counting, the
LLM and vision ports). The split lets the reading run elsewhere, time-boxed, while the model
calls stay with the job and its retries."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from chatmem.memory.attachments.chunks import Block, DerivedText, chunk_blocks, ocr_texts, transcript_texts
from chatmem.memory.attachments.errors import BadFile
from chatmem.memory.attachments.filetypes import RECORDING_EXTENSIONS, Sniffed, has_sound
from chatmem.memory.attachments.ports import (
    Analysis,
    DocumentReader,
    Extraction,
    Heard,
    ImageReader,
    OcrEngine,
    Read,
    Transcriber,
    VideoReader,
    VisionModel,
)
from chatmem.memory.attachments.surrogates import SURROGATE_CHARS, clip, offline_description, video_description
from chatmem.memory.ports import LLM
from chatmem.memory.prompts import FileSummary, ImageDescription, file_summary

OCR_MIN_SCORE = 0.5
SCANNED_PAGES_MAX = 50  # page images OCR'd from a PDF without a text layer
# The pictures of a presentation or a Word document are OCR'd too: a slide is often a screenshot
# or a chart saved as an image, and a scan pasted into a document is its only text. Up to this
# many distinct ones a file, each at least this many pixels (a logo or an icon, repeated on every
# slide, is not worth a second of OCR).
PICTURES_MAX = 20
PICTURE_MIN_PIXELS = 200 * 150
ANIMATION_PICTURES_MAX = 8  # of an animated GIF, WebP or PNG, the first included
VIDEO_PICTURES_MAX = 8  # of a video: one a SECONDS_A_PICTURE (adapters/video.py), at most this many
NOT_READ = "not read: "  # how `meta.speech` begins when a video's speech could not be read
NO_TRANSCRIBER = "a recording is read by a speech-to-text model; none is set (CHATMEM_TRANSCRIPTION_MODEL)"


@dataclass
class Reader:
    """The Read port over the readers: an image's header and OCR lines, a video's header and the
    OCR lines of its pictures, a document's blocks (a PDF without a text layer is read by OCR of
    its page images; the pictures of a presentation or a Word document by OCR of each)."""

    images: ImageReader
    ocr: OcrEngine
    documents: DocumentReader
    videos: VideoReader | None = None  # None: a video is read for its speech alone

    def __call__(self, data: bytes, sniffed: Sniffed) -> Extraction:
        if sniffed.kind == "image":
            info = self.images.inspect(data)
            lines = self._lines(data)
            if "frames" in info.meta:  # an animation's other pictures may show other words
                lines = _once([lines, *(self._lines(p) for p in self.images.frames(data, ANIMATION_PICTURES_MAX - 1))])
            return Extraction(info=info, lines=lines)
        if sniffed.kind == "video":
            return self._video(data)
        blocks, meta = self.documents.read(data, sniffed.mime)
        if sniffed.mime == "application/pdf" and not any(b.text.strip() for b in blocks if not b.heading):
            blocks = self._scanned_pages(data)
            meta = {**meta, "ocr_pages": len({b.page for b in blocks})}
        elif pictures := self._pictures(self._pictures_in(data, sniffed.mime)):
            blocks = _after_their_pages(blocks, pictures)
            meta = {**meta, "ocr_pictures": len(pictures)}
        return Extraction(blocks=blocks, meta=meta)

    def _pictures_in(self, data: bytes, mime: str) -> list[tuple[int | None, bytes]]:
        try:
            return self.documents.pictures(data, mime, PICTURES_MAX)
        except BadFile:  # the text is read already; the pictures are a bonus
            return []

    def _video(self, data: bytes) -> Extraction:
        """The OCR lines of a video's pictures, each line once (a caption or a slide stays on screen
        for many pictures). A video whose pictures cannot be decoded may still be heard: the
        reason is kept for the Analyzer."""
        if self.videos is None:
            return Extraction()
        try:
            seen = self.videos.frames(data, VIDEO_PICTURES_MAX)
        except BadFile as error:
            return Extraction(meta={"pictures": f"not read: {error}"})
        lines = _once(self._lines(picture) for _, picture in seen.pictures)
        return Extraction(lines=lines, video=seen.info, sheet=seen.sheet, meta={"pictures_read": len(seen.pictures)})

    def _lines(self, image: bytes) -> list[str]:
        return [t for t, score in self.ocr.read(image) if score >= OCR_MIN_SCORE and t.strip()]

    def _pictures(self, found: list[tuple[int | None, bytes]]) -> list[list[Block]]:
        """The text OCR finds in each distinct picture large enough to hold some, as blocks of
        its slide (none in a Word document); pictures without text are left out."""
        read: list[list[Block]] = []
        seen: set[bytes] = set()
        for slide, image in found:
            digest = hashlib.sha256(image).digest()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                info = self.images.inspect(image)  # the pixel limit holds for pictures too
            except BadFile:
                continue  # a format Pillow does not read (a Windows metafile) or a broken one
            if info.width * info.height >= PICTURE_MIN_PIXELS and (lines := self._lines(image)):
                read.append([Block(t, page=slide) for t in lines])
        return read

    def _scanned_pages(self, data: bytes) -> list[Block]:
        """A PDF without a text layer is usually a scan: OCR the images on its pages."""
        blocks: list[Block] = []
        for page, image in self.documents.page_images(data, SCANNED_PAGES_MAX):
            try:
                self.images.inspect(image)  # the pixel limit holds for embedded images too
            except BadFile:
                continue
            blocks += [Block(t, page=page) for t in self._lines(image)]
        return blocks


def _once(pictures: Iterable[list[str]]) -> list[str]:
    """The OCR lines of several pictures of one thing, each line once (a caption or a slide stays
    on screen for many pictures), compared without case and spacing."""
    lines: list[str] = []
    known: set[str] = set()
    for found in pictures:
        for line in found:
            if (key := " ".join(line.split()).casefold()) not in known:
                known.add(key)
                lines.append(line)
    return lines


@dataclass
class KeptSpeech:
    """The Transcriber port answered from what an earlier analysis heard: a reanalysis reads a
    video's pictures again (a new OCR or vision model) without sending its speech again, which
    would bill every minute again for the same words."""

    heard: Heard
    model: str = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.heard.model or ""

    def transcribe(self, data: bytes, mime: str) -> str:
        reason = self.heard.reason or ""
        if not self.heard.words and reason.startswith(NOT_READ):
            raise BadFile(reason.removeprefix(NOT_READ))  # not heard then, for the same reason now
        return self.heard.words


def _after_their_pages(blocks: list[Block], pictures: list[list[Block]]) -> list[Block]:
    """Each picture's text after the rest of its slide, so chunks keep to the slide's heading; a
    Word document's pictures after its text (its pages are not known)."""
    by_slide: dict[int | None, list[Block]] = {}
    for picture in pictures:
        by_slide.setdefault(picture[0].page, []).extend(picture)
    out: list[Block] = []
    for n, block in enumerate(blocks):
        out.append(block)
        if n + 1 == len(blocks) or blocks[n + 1].page != block.page:
            out += by_slide.pop(block.page, [])
    return out + [b for rest in by_slide.values() for b in rest]


@dataclass
class Analyzer:
    images: ImageReader
    ocr: OcrEngine
    documents: DocumentReader
    llm: LLM
    count: Callable[[str], int]
    chunk_tokens: int
    vision: VisionModel | None = None
    read: Read | None = None  # None: a Reader over images, ocr, documents and videos, in this process
    transcriber: Transcriber | None = None  # None: recordings fail, with the setting to set
    videos: VideoReader | None = None  # for the Reader built here

    def __post_init__(self) -> None:
        if self.read is None:
            self.read = Reader(self.images, self.ocr, self.documents, self.videos)

    def __call__(self, data: bytes, sniffed: Sniffed, filename: str | None) -> Analysis:
        """Content only: a caption belongs to the message that sent the bytes, not to them."""
        assert self.read is not None
        if sniffed.kind == "audio":  # nothing to read here: the words come from the endpoint
            return self.recording(data, sniffed)
        extraction = self.read(data, sniffed)
        if sniffed.kind == "video":
            return self.video(data, sniffed, extraction)
        if sniffed.kind == "image":
            return self.image(data, sniffed, extraction)
        return self.document(sniffed, filename, extraction)

    def image(self, data: bytes, sniffed: Sniffed, extraction: Extraction) -> Analysis:
        info, lines = extraction.info, extraction.lines
        assert info is not None, "an image's extraction carries its header"
        ocr_text = " ".join(lines)
        texts = ocr_texts(lines, self.chunk_tokens, self.count)
        meta = {"format": info.format, "width": info.width, "height": info.height, **info.meta}
        desc: ImageDescription | None = None
        if self.vision is not None:
            desc = self.vision.describe(data, sniffed.mime, ocr_text)  # TransientError: retried
            meta["vision_model"] = self.vision.model
            texts += [DerivedText("vision_short", 0, desc.short), DerivedText("vision_detail", 0, desc.detail)]
        else:
            desc = offline_description(lines, info)
            if not lines:
                texts.append(DerivedText("vision_short", 0, desc.short, {"source": "metadata"}))
        return Analysis(desc.short, texts, meta)

    def recording(self, data: bytes, sniffed: Sniffed) -> Analysis:
        """The words spoken in a recording."""
        if self.transcriber is None:
            raise BadFile(NO_TRANSCRIBER)
        words = " ".join(self.transcriber.transcribe(data, sniffed.mime).split())  # TransientError: retried
        if not words:
            raise BadFile("no speech was heard in the recording")
        texts = transcript_texts(words, self.chunk_tokens, self.count)
        description = clip(f'recording: "{words}"', SURROGATE_CHARS)
        return Analysis(description, texts, {"transcription_model": self.transcriber.model})

    def video(self, data: bytes, sniffed: Sniffed, extraction: Extraction) -> Analysis:
        """What a video shows (the text in its pictures, a description of them) and what is said
        in it. Either may be missing: a GIF sent as a video has no sound, a clip may show no text,
        no speech-to-text model may be set; `meta.speech` says why nothing was heard. A video
        fails only when neither its pictures nor its speech could be read."""
        meta: dict = dict(extraction.meta)
        if (info := extraction.video) is not None:
            meta.update(width=info.width, height=info.height, codec=info.codec)
            if info.seconds is not None:
                meta["seconds"] = round(info.seconds, 1)
        words = self._speech(data, sniffed, meta)
        texts = ocr_texts(extraction.lines, self.chunk_tokens, self.count)
        texts += transcript_texts(words, self.chunk_tokens, self.count) if words else []
        if info is None and not words:  # both reasons: a sound track alone may want a model set
            raise BadFile(
                f"pictures {meta.get('pictures', NOT_READ.strip())}; speech {meta.get('speech', 'none heard')}"
            )
        ocr_text = " ".join(extraction.lines)
        if self.vision is not None and extraction.sheet is not None:
            desc = self.vision.describe(
                extraction.sheet, "image/jpeg", ocr_text, of_video=True
            )  # TransientError: retried
            meta["vision_model"] = self.vision.model
            texts += [DerivedText("vision_short", 0, desc.short), DerivedText("vision_detail", 0, desc.detail)]
            return Analysis(clip(desc.short, SURROGATE_CHARS), texts, meta)
        description = video_description(info, extraction.lines, words)
        if not texts:
            texts.append(DerivedText("vision_short", 0, description, {"source": "metadata"}))
        return Analysis(description, texts, meta)

    def _speech(self, data: bytes, sniffed: Sniffed, meta: dict) -> str:
        """A video's words, or "" with the reason in `meta["speech"]`. A GIF sent as a video
        (Telegram's animations) has no sound track and costs no call. An outage is retried; a
        refusal leaves the pictures read."""
        if not has_sound(data, sniffed.mime):
            meta["speech"] = "no sound track"
        elif sniffed.mime not in RECORDING_EXTENSIONS:
            meta["speech"] = f"{NOT_READ}speech-to-text endpoints do not take {sniffed.mime}"
        elif self.transcriber is None:
            meta["speech"] = f"{NOT_READ}{NO_TRANSCRIBER}"
        else:
            try:
                words = " ".join(self.transcriber.transcribe(data, sniffed.mime).split())  # TransientError: retried
            except BadFile as error:
                meta["speech"] = f"{NOT_READ}{error}"
                return ""
            meta["transcription_model"] = self.transcriber.model
            if words:
                return words
            meta["speech"] = "none heard"
        return ""

    def document(self, sniffed: Sniffed, filename: str | None, extraction: Extraction) -> Analysis:
        meta = dict(extraction.meta)
        chunks = chunk_blocks(extraction.blocks, self.chunk_tokens, self.count)
        if not chunks:
            raise BadFile("the document has no text (neither a text layer nor readable page images)")
        summary: FileSummary = self.llm.complete(file_summary(filename, [c.text for c in chunks[:12]]), FileSummary)
        texts = [*chunks, DerivedText("file_summary", 0, f"{summary.title}: {summary.summary}")]
        lead = ""
        for key, unit in (("pages", "page"), ("slides", "slide")):
            if n := meta.get(key):
                lead = f"{n} {unit}{'s' if n != 1 else ''}: "
        return Analysis(clip(lead + summary.summary, SURROGATE_CHARS), texts, {**meta, "title": summary.title})
