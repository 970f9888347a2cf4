"""Attachments: from a reference in a message to searchable text.

One job per attachment of a message (event_id, position), on the `attachments` queue:
fetch the bytes, store them by sha256, link the reference to the artifact, and (only the first
time those bytes are seen) analyse them: OCR and a description for images; text, chunks and a
summary for documents. Every derived text is embedded. When an artifact is done or has failed,
the messages that sent it get their text surrogate (`[image#a1b2c3d4] short description`).

The type comes from the bytes, never from the event. A bad file is a permanent failure with a
reason in words (the message itself was projected long before, with a placeholder); only
transient failures (an unreachable URL, a model endpoint down) are retried.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from chatmem.memory.ports import LLM, Embedder, TransientError
from chatmem.memory.prompts import FileSummary, ImageDescription, file_summary

log = logging.getLogger(__name__)

SHORT_ID_CHARS = 8
SURROGATE_CHARS = 160
OCR_MIN_SCORE = 0.5
SCANNED_PAGES_MAX = 50  # page images OCR'd from a PDF without a text layer
IMAGE_MIMES = {
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/bmp",
    "image/tiff",
}
DOCUMENT_MIMES = {"application/pdf", "text/plain", "text/markdown", "text/html"}
TEXT_KINDS = ("user_caption", "vision_short", "vision_detail", "ocr", "file_summary", "chunk")


class BadFile(Exception):
    """A permanent problem with the file itself; `reason` says what, for people."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --- what the bytes are -------------------------------------------------------------------


@dataclass(frozen=True)
class Sniffed:
    mime: str
    kind: str  # image | document


_HTML = re.compile(rb"^\s*(<!--.*?-->\s*)*(<!doctype\s+html|<html|<head|<body)", re.I | re.S)
_MARKDOWN_NAME = re.compile(r"\.(md|markdown|mdown)$", re.I)
_MARKDOWN_SHAPE = re.compile(r"^(#{1,6} \S|[-*] \S|\d+\. \S|```)", re.M)


def sniff(data: bytes, filename: str | None, guess_binary: Callable[[bytes], str | None]) -> Sniffed:
    """The type of `data`, from its bytes (`guess_binary` reads magic numbers). Text is told
    apart by shape: HTML by its opening tags, Markdown by its name or its headings and lists."""
    if not data:
        raise BadFile("the file is empty")
    mime = guess_binary(data)
    if mime in IMAGE_MIMES:
        return Sniffed(mime, "image")
    if mime == "application/pdf":
        return Sniffed(mime, "document")
    if mime is not None:
        raise BadFile(f"files of type {mime} are not understood")
    head = data[:65536]
    if b"\x00" in head:
        raise BadFile("binary file of an unknown type")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # a cut multi-byte character at the end is fine
            raise BadFile("binary file of an unknown type (not UTF-8 text)") from None
    if _HTML.match(head):
        return Sniffed("text/html", "document")
    if (filename and _MARKDOWN_NAME.search(filename)) or len(
        _MARKDOWN_SHAPE.findall(head.decode("utf-8", "ignore"))
    ) >= 2:
        return Sniffed("text/markdown", "document")
    return Sniffed("text/plain", "document")


_GENERIC_MIMES = {"application/octet-stream", "binary/octet-stream", "application/unknown", ""}


def declared_mismatch(declared_kind: str | None, declared_mime: str | None, sniffed: Sniffed) -> str | None:
    """Why the event's declared type contradicts the bytes, or None. A generic or absent
    declaration never contradicts; a specific one must name the same kind of file."""
    mime = (declared_mime or "").split(";")[0].strip().lower()
    if mime and mime not in _GENERIC_MIMES:
        declared_family = (
            "image"
            if mime.startswith("image/")
            else "document"
            if mime in DOCUMENT_MIMES or mime.startswith("text/")
            else mime
        )
        if declared_family != sniffed.kind:
            return f"declared as {mime} but the bytes are {sniffed.mime}"
    if declared_kind == "image" and sniffed.kind != "image":
        return f"declared as an image but the bytes are {sniffed.mime}"
    if declared_kind in ("audio", "video"):
        return f"declared as {declared_kind}; the bytes are {sniffed.mime}"
    return None


# --- derived text ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DerivedText:
    kind: str  # one of TEXT_KINDS
    ord: int
    text: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Block:
    """A unit of document structure: a heading or a paragraph, with where it sits."""

    text: str
    heading: bool = False
    level: int = 0  # heading level (1 = top)
    page: int | None = None


def chunk_blocks(blocks: Sequence[Block], max_tokens: int, count: Callable[[str], int]) -> list[DerivedText]:
    """Structure-aware chunks: a heading starts a new chunk and every chunk carries the path of
    headings above it; paragraphs are kept whole unless one alone is too long (then split at
    sentences, then at words)."""
    chunks: list[DerivedText] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []
    pages: list[int] = []
    used = 0

    def flush() -> None:
        nonlocal body, pages, used
        if body:
            trail = " > ".join(h for _, h in path)
            text = "\n".join(body)
            meta: dict = {}
            if trail:
                meta["section"] = trail
                text = f"{trail}\n{text}"
            if pages:
                meta["page"] = pages[0]
                if pages[-1] != pages[0]:
                    meta["last_page"] = pages[-1]
            chunks.append(DerivedText("chunk", len(chunks), text, meta))
        body, pages, used = [], [], 0

    for block in blocks:
        text = block.text.strip()
        if not text:
            continue
        if block.heading:
            flush()
            path = [(lvl, h) for lvl, h in path if lvl < block.level] + [(block.level, text[:120])]
            continue
        for piece in _pieces(text, max_tokens, count):
            size = count(piece)
            if body and used + size > max_tokens:
                flush()
            body.append(piece)
            used += size
            if block.page is not None and block.page not in pages:
                pages.append(block.page)
    flush()
    return chunks


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _pieces(text: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    if count(text) <= max_tokens:
        return [text]
    out: list[str] = []
    current = ""
    for unit in _SENTENCE_END.split(text):
        units = [unit] if count(unit) <= max_tokens else _word_runs(unit, max_tokens, count)
        for u in units:
            candidate = f"{current} {u}".strip()
            if current and count(candidate) > max_tokens:
                out.append(current)
                current = u
            else:
                current = candidate
    if current:
        out.append(current)
    return out


def _word_runs(text: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    runs: list[str] = []
    words: list[str] = []
    for word in text.split():
        if words and count(" ".join([*words, word])) > max_tokens:
            runs.append(" ".join(words))
            words = []
        words.append(word)
    if words:
        runs.append(" ".join(words))
    return runs


def ocr_texts(lines: Sequence[str], max_tokens: int, count: Callable[[str], int]) -> list[DerivedText]:
    """OCR lines as `ocr` texts, one per screenful of `max_tokens`."""
    chunks = chunk_blocks([Block(line) for line in lines], max_tokens, count)
    return [DerivedText("ocr", c.ord, c.text, c.meta) for c in chunks]


# --- descriptions and surrogates --------------------------------------------------------------


@dataclass(frozen=True)
class ImageInfo:
    format: str  # PNG, JPEG, ...
    width: int
    height: int
    meta: dict = field(default_factory=dict)  # camera, taken_at, ... when the file says


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def offline_description(ocr_lines: Sequence[str], info: ImageInfo) -> ImageDescription:
    """What can be said of an image without a vision model: its text and its metadata."""
    shape = f"{info.format} image, {info.width}×{info.height}"
    facts = [f"{k.replace('_', ' ')} {v}" for k, v in sorted(info.meta.items())]
    text = " ".join(ocr_lines)
    short = f'{shape} with the text "{_clip(text, 100)}"' if text else shape
    detail = (
        shape
        + (f" ({', '.join(facts)})" if facts else "")
        + (f'. Text in the image: "{text}"' if text else ". No text in it")
    )
    return ImageDescription(short=_clip(short, SURROGATE_CHARS), detail=detail)


def short_id(sha256: str) -> str:
    return sha256[:SHORT_ID_CHARS]


def label(kind: str | None) -> str:
    return "image" if kind == "image" else "file"


@dataclass(frozen=True)
class RefState:
    """What a message's surrogate is made from: the reference's state and its artifact's."""

    position: int
    status: str  # pending | done | failed
    kind: str | None = None  # image | document, once the bytes are known
    sha256: str | None = None
    description: str | None = None
    reason: str | None = None


def attachment_line(attachment: dict, state: RefState | None) -> str:
    """The line a message's history text gets for one attachment."""
    kind = state.kind if state and state.kind else attachment.get("kind")
    tag = label(kind) + (f"#{short_id(state.sha256)}" if state and state.sha256 else "")
    # One line per attachment, always: a message's text ends with exactly that many lines.
    name = " ".join(" ".join(x for x in (attachment.get("filename"), attachment.get("caption")) if x).split())
    if state is not None and state.status == "done" and state.description:
        return f"[{tag}] " + " — ".join(x for x in (name, _clip(state.description, SURROGATE_CHARS)) if x)
    if state is not None and state.status == "failed":
        # The reason stays on the attachment (`chatmem status`, the artifacts tables): in the
        # history it would only add noise to summaries and search.
        return f"[{tag}] {name} (not readable)".replace("]  (", "] (")
    return f"[{tag}] {name}".rstrip()


def attachment_lines(payload: dict, states: dict[int, RefState] | None = None) -> list[str]:
    states = states or {}
    return [attachment_line(a, states.get(i)) for i, a in enumerate(payload.get("attachments") or [])]


_ABOUT = re.compile(
    r"\b(image|images|picture|pictures|pic|photo|photos|screenshot|screenshots|scan|scanned|attachment|attachments|"
    r"attached|file|files|document|documents|doc|pdf|pdfs|slide|slides|receipt|invoice|diagram|chart|sent you|"
    r"shared|upload|uploaded|картинк\w*|фото\w*|изображени\w*|скриншот\w*|файл\w*|документ\w*|вложени\w*)\b|"
    r"\[?(image|file)#[0-9a-f]{4,}",
    re.I,
)


def about_attachment(query: str) -> bool:
    """Whether a question is about something shared in the chat (so context adds artifact text)."""
    return bool(_ABOUT.search(query))


# --- analysis ------------------------------------------------------------------------------


class ImageReader(Protocol):
    def inspect(self, data: bytes) -> ImageInfo:
        """Header and metadata, within the pixel limit; BadFile if the image cannot be decoded."""
        ...


class OcrEngine(Protocol):
    def read(self, data: bytes) -> list[tuple[str, float]]:
        """(text line, confidence) in reading order."""
        ...


class VisionModel(Protocol):
    model: str

    def describe(self, data: bytes, mime: str, ocr_text: str) -> ImageDescription: ...


class DocumentReader(Protocol):
    def read(self, data: bytes, mime: str) -> tuple[list[Block], dict]:
        """Structure blocks and metadata (pages, title); BadFile if unreadable."""
        ...

    def page_images(self, data: bytes, limit: int) -> list[tuple[int, bytes]]:
        """(page number, image bytes) of a PDF's embedded images: a scan's pages."""
        ...


@dataclass(frozen=True)
class Analysis:
    description: str
    texts: list[DerivedText]
    meta: dict


@dataclass
class Analyzer:
    images: ImageReader
    ocr: OcrEngine
    documents: DocumentReader
    llm: LLM
    count: Callable[[str], int]
    chunk_tokens: int
    vision: VisionModel | None = None

    def __call__(self, data: bytes, sniffed: Sniffed, filename: str | None) -> Analysis:
        """Content only: a caption belongs to the message that sent the bytes, not to them."""
        if sniffed.kind == "image":
            return self.image(data, sniffed)
        return self.document(data, sniffed, filename)

    def image(self, data: bytes, sniffed: Sniffed) -> Analysis:
        info = self.images.inspect(data)
        lines = [t for t, score in self.ocr.read(data) if score >= OCR_MIN_SCORE and t.strip()]
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

    def document(self, data: bytes, sniffed: Sniffed, filename: str | None) -> Analysis:
        blocks, meta = self.documents.read(data, sniffed.mime)
        chunks = chunk_blocks(blocks, self.chunk_tokens, self.count)
        if not chunks and sniffed.mime == "application/pdf":
            blocks = self._scanned_pages(data)
            chunks = chunk_blocks(blocks, self.chunk_tokens, self.count)
            meta["ocr_pages"] = len({b.page for b in blocks})
        if not chunks:
            raise BadFile("the document has no text (neither a text layer nor readable page images)")
        summary: FileSummary = self.llm.complete(file_summary(filename, [c.text for c in chunks[:12]]), FileSummary)
        texts = [*chunks, DerivedText("file_summary", 0, f"{summary.title}: {summary.summary}")]
        n = meta.get("pages")
        pages = f"{n} page{'s' if n != 1 else ''}: " if n else ""
        return Analysis(_clip(pages + summary.summary, SURROGATE_CHARS), texts, {**meta, "title": summary.title})

    def _scanned_pages(self, data: bytes) -> list[Block]:
        """A PDF without a text layer is usually a scan: OCR the images on its pages."""
        blocks: list[Block] = []
        for page, image in self.documents.page_images(data, SCANNED_PAGES_MAX):
            try:
                self.images.inspect(image)  # the pixel limit holds for embedded images too
            except BadFile:
                continue
            blocks += [Block(t, page=page) for t, score in self.ocr.read(image) if score >= OCR_MIN_SCORE and t.strip()]
        return blocks


# --- the job --------------------------------------------------------------------------------


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


class AttachmentStore(Protocol):
    def reference(self, event_id: str, position: int) -> Reference | None: ...

    def fail_reference(self, event_id: str, position: int, reason: str) -> None:
        """Mark the reference failed and refresh its message's surrogate."""
        ...

    def link(self, ref: Reference, sha256: str, sniffed: Sniffed, size: int) -> str:
        """Create the artifact if new and point the reference at it; return the artifact's
        status. When that status is final, the message's surrogate is refreshed here."""
        ...

    def save_caption(self, ref: Reference, text: str, vector: np.ndarray) -> None: ...

    def claim(self, sha256: str, claim_s: int) -> bool:
        """Take the artifact for processing (pending, or a claim that has expired)."""
        ...

    def release(self, sha256: str) -> None:
        """Give a claim back after a transient failure."""
        ...

    def finish(self, sha256: str, analysis: Analysis, vectors: np.ndarray) -> None:
        """Save the texts, mark done, refresh the surrogates of every message that sent it."""
        ...

    def fail_artifact(self, sha256: str, reason: str) -> None: ...


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


Analyze = Callable[[bytes, Sniffed, "str | None"], Analysis]


@dataclass
class AttachmentJob:
    store: AttachmentStore
    blobs: BlobStore
    fetcher: Fetcher
    analyze: Analyze
    embedder: Embedder
    guess_binary: Callable[[bytes], str | None]
    claim_s: int = 900

    def __call__(self, event_id: str, position: int, *, last_attempt: bool = False) -> str:
        """Process one attachment and return the outcome in a word. A TransientError propagates
        to be retried, except on the last attempt, which records the failure instead."""
        ref = self.store.reference(event_id, position)
        if ref is None:
            raise ValueError(f"no attachment {position} of event {event_id!r}")
        if ref.status == "failed":
            return "failed"
        try:
            if ref.status == "pending":
                ref = self._link(ref)
            if ref.artifact_status in ("done", "failed"):
                return f"artifact {ref.artifact_status}"  # analysed once, for every message that sends it
            return self._process(ref)
        except BadFile as error:
            self.store.fail_reference(event_id, position, error.reason)
            return "failed"
        except TransientError as error:
            if not last_attempt:
                raise
            if ref.status == "linked" and ref.sha256:
                self.store.fail_artifact(ref.sha256, f"gave up after retries: {error}")
            else:
                self.store.fail_reference(event_id, position, f"gave up after retries: {error}")
            return "failed"

    def _link(self, ref: Reference) -> Reference:
        att = ref.attachment
        data = self.fetcher.fetch(att["url"])
        sniffed = sniff(data, att.get("filename"), self.guess_binary)
        mismatch = declared_mismatch(att.get("kind"), att.get("mime_type"), sniffed)
        if mismatch:
            raise BadFile(mismatch)
        sha = self.blobs.put(data)
        if att.get("caption"):
            self.store.save_caption(ref, att["caption"], self.embedder.embed([att["caption"]])[0])
        status = self.store.link(ref, sha, sniffed, len(data))
        return Reference(
            ref.event_id,
            ref.position,
            ref.thread_id,
            ref.user_id,
            "linked",
            att,
            sha,
            status,
            sniffed.mime,
            sniffed.kind,
        )

    def _process(self, ref: Reference) -> str:
        sha = ref.sha256
        assert sha is not None and ref.mime and ref.kind
        if not self.store.claim(sha, self.claim_s):
            return "claimed elsewhere"  # the claimant refreshes every message that sent it
        try:
            analysis = self.analyze(self.blobs.get(sha), Sniffed(ref.mime, ref.kind), ref.attachment.get("filename"))
            vectors = self.embedder.embed([t.text for t in analysis.texts]) if analysis.texts else None
        except BadFile as error:
            self.store.fail_artifact(sha, error.reason)
            return "failed"
        except BaseException:
            self.store.release(sha)
            raise
        self.store.finish(sha, analysis, vectors if vectors is not None else np.zeros((0, self.embedder.dim)))
        return "done"
