"""The ports of attachment processing and the records that cross them: readers and models for
the bytes (ImageReader, VideoReader, OcrEngine, VisionModel, Transcriber, DocumentReader), and
where references, artifacts and bytes live or come from (AttachmentStore, BlobStore, Fetcher).
Adapters raise BadFile for a permanent problem with the file and TransientError when a later try
may succeed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from chatmem.memory.attachments.chunks import Block, DerivedText
from chatmem.memory.attachments.filetypes import Sniffed
from chatmem.memory.prompts import ImageDescription

# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageInfo:
    format: str  # PNG, JPEG, ...
    width: int
    height: int
    meta: dict = field(default_factory=dict)  # camera, taken_at, ... when the file says


@dataclass(frozen=True)
class VideoInfo:
    width: int  # as shown (a phone's display matrix applied)
    height: int
    seconds: float | None  # None when neither the header nor the reading tells
    codec: str  # h264, hevc, VP90, ...


@dataclass(frozen=True)
class VideoFrames:
    """What a video shows: its distinct pictures at evenly spaced moments, and a sheet of some of
    them tiled for a vision model."""

    info: VideoInfo
    pictures: list[tuple[float, bytes]]  # (seconds into the video, PNG), in order
    sheet: bytes | None  # JPEG


@dataclass(frozen=True)
class Heard:
    """What an analysis heard of a video: its words, by which model, or why nothing was heard
    (its `meta.speech`)."""

    words: str
    model: str | None
    reason: str | None


@dataclass(frozen=True)
class Analysis:
    """What the bytes of an artifact yield: a short description and the texts to embed."""

    description: str
    texts: list[DerivedText]
    meta: dict

    def digest(self) -> str:
        """Recorded with the artifact (`meta.texts_sha256`), so `replay --check` can tell that the
        stored texts are still what the analysis produced."""
        return texts_digest(self.description, [(t.kind, t.ord, t.text) for t in self.texts])


TEXTS_DIGEST = "texts_sha256"  # the key of Analysis.digest() in an artifact's meta


def texts_digest(description: str | None, texts: Iterable[tuple[str, int, str]]) -> str:
    data = [description or "", sorted(texts)]
    return hashlib.sha256(json.dumps(data, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class Reference:
    event_id: str
    position: int
    thread_id: str
    user_id: str
    status: str  # pending | linked | failed
    attachment: dict  # as published: url, kind, mime_type, filename, caption
    sha256: str | None = None
    artifact_status: str | None = None  # pending | processing | done | failed, once linked
    mime: str | None = None
    kind: str | None = None
    reason: str | None = None


# --- reading the bytes -----------------------------------------------------------------------


class ImageReader(Protocol):
    def inspect(self, data: bytes) -> ImageInfo:
        """Header and metadata (`frames`: an animation's count), within the pixel limit; BadFile
        if the image cannot be decoded."""
        ...

    def frames(self, data: bytes, limit: int) -> list[bytes]:
        """An animation's other distinct pictures, evenly spaced, at most `limit`; none for a
        still image."""
        ...


class VideoReader(Protocol):
    def frames(self, data: bytes, limit: int) -> VideoFrames:
        """Up to `limit` distinct pictures, turned as shown, within the pixel limit; BadFile if the
        video cannot be decoded."""
        ...


class OcrEngine(Protocol):
    def read(self, data: bytes) -> list[tuple[str, float]]:
        """(text line, confidence) in reading order."""
        ...


class VisionModel(Protocol):
    model: str

    def describe(self, data: bytes, mime: str, ocr_text: str, *, of_video: bool = False) -> ImageDescription:
        """`of_video`: the image is a sheet of a video's pictures."""
        ...


class Transcriber(Protocol):
    """Speech to text. A recording is read only by a remote model: none ships in a package."""

    model: str

    def transcribe(self, data: bytes, mime: str) -> str:
        """The words spoken in a recording. TransientError while the endpoint is down; BadFile
        when it refuses the recording itself (a format it cannot decode, too long)."""
        ...


class DocumentReader(Protocol):
    def read(self, data: bytes, mime: str) -> tuple[list[Block], dict]:
        """Structure blocks and metadata (pages, title); BadFile if unreadable."""
        ...

    def page_images(self, data: bytes, limit: int) -> list[tuple[int, bytes]]:
        """(page number, image bytes) of a PDF's embedded images: a scan's pages."""
        ...

    def pictures(self, data: bytes, mime: str, limit: int) -> list[tuple[int | None, bytes]]:
        """(slide number, image bytes) of the pictures on the slides `read` reads of a
        presentation, and (None, image bytes) of those in a Word or OpenDocument text, in order;
        none for another kind of file."""
        ...


@dataclass(frozen=True)
class Extraction:
    """What reading the bytes yields before any model sees them: an image's header and OCR lines,
    a video's header, the OCR lines of its pictures and a sheet of them, or a document's structure
    blocks and metadata (a Reader makes one; it crosses processes)."""

    info: ImageInfo | None = None  # images
    lines: list[str] = field(default_factory=list)  # images and videos: OCR lines kept
    video: VideoInfo | None = None  # videos
    sheet: bytes | None = None  # videos: what a vision model is shown (JPEG)
    blocks: list[Block] = field(default_factory=list)  # documents
    meta: dict = field(default_factory=dict)  # documents: pages, title, ocr_pages; videos: pictures_read


Read = Callable[[bytes, Sniffed], Extraction]
"""The CPU-heavy part of an analysis: decoding, OCR, PDF text (a Reader is one; an adapter may
run it in another process, within a time limit). BadFile for a file that cannot be read."""

Analyze = Callable[[bytes, Sniffed, "str | None"], Analysis]
"""Content only, from the bytes, their sniffed type and the file name (an Analyzer is one)."""


# --- where things live -----------------------------------------------------------------------


class AttachmentStore(Protocol):
    def reference(self, event_id: str, position: int) -> Reference | None: ...

    def fail_reference(self, event_id: str, position: int, reason: str) -> None:
        """Mark the reference failed and refresh its message's surrogate."""
        ...

    def link(self, ref: Reference, sha256: str, sniffed: Sniffed, size: int) -> str:
        """Create the artifact if new and point the reference at it; return the artifact's
        status. When that status is final, the message's surrogate is refreshed here."""
        ...

    def save_caption(self, ref: Reference, text: str, vector: np.ndarray, model: str | None = None) -> None: ...

    def claim(self, sha256: str, claim_s: int) -> bool:
        """Take the artifact for processing (pending, or a claim that has expired)."""
        ...

    def release(self, sha256: str) -> None:
        """Give a claim back after a transient failure."""
        ...

    def finish(self, sha256: str, analysis: Analysis, vectors: np.ndarray, model: str | None = None) -> None:
        """Save the texts, mark done, refresh the surrogates of every message that sent it."""
        ...

    def fail_artifact(self, sha256: str, reason: str) -> None: ...

    def analysed(self) -> list[tuple[str, str, str, str | None]]:
        """Every analysed artifact: (sha256, mime type, kind, a file name it was sent under)."""
        ...

    def replace_analysis(self, sha256: str, analysis: Analysis, vectors: np.ndarray, model: str | None = None) -> None:
        """Swap an artifact's derived texts for a new analysis, and its surrogates, at once."""
        ...

    def heard(self, sha256: str) -> Heard:
        """What the stored analysis of a video heard (its transcript, joined in order)."""
        ...


class BlobStore(Protocol):
    def put(self, data: bytes) -> str:
        """Store once; return the sha256 (hex)."""
        ...

    def get(self, sha256: str) -> bytes: ...


class Fetcher(Protocol):
    def fetch(self, url: str) -> bytes:
        """The bytes behind a file://, https:// or data: URL. BadFile when they cannot be had
        (refused, missing, too large); TransientError when a later try may succeed."""
        ...
