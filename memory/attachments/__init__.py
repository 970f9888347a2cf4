"""Attachments: from a reference in a message to searchable text.

One job per attachment of a message (event_id, position), on the `attachments` queue:
fetch the bytes, store them by sha256, link the reference to the artifact, and (only the first
time those bytes are seen) analyse them: OCR and a description for images; text, chunks and a
summary for documents. Every derived text is embedded. When an artifact is done or has failed,
the messages that sent it get their text surrogate (`[image#a1b2c3d4] short description`).

The type comes from the bytes, never from the event. A bad file is a permanent failure with a
reason in words (the message itself was projected long before, with a placeholder); only
transient failures (an unreachable URL, a model endpoint down) are retried.

Modules, from the bottom: `errors` (BadFile), `filetypes` (what the bytes are), `chunks`
(derived texts, structure-aware chunking), `ports` (the Protocols and the records crossing
them), `surrogates` (a message's attachment lines), `queries` (is a question about a shared
file?), `analysis` (the Reader and the Analyzer) and `job` (the AttachmentJob). This package
re-exports their public names for callers outside memory/.
"""

from chatmem.memory.attachments.analysis import OCR_MIN_SCORE, SCANNED_PAGES_MAX, Analyzer, KeptSpeech, Reader
from chatmem.memory.attachments.chunks import TEXT_KINDS, Block, DerivedText, chunk_blocks, ocr_texts
from chatmem.memory.attachments.errors import BadFile
from chatmem.memory.attachments.filetypes import DOCUMENT_MIMES, IMAGE_MIMES, Sniffed, declared_mismatch, sniff
from chatmem.memory.attachments.job import AttachmentJob
from chatmem.memory.attachments.ports import (
    TEXTS_DIGEST,
    Analysis,
    Analyze,
    AttachmentStore,
    BlobStore,
    DocumentReader,
    Extraction,
    Fetcher,
    Heard,
    ImageInfo,
    ImageReader,
    OcrEngine,
    Read,
    Reference,
    Transcriber,
    VideoFrames,
    VideoInfo,
    VideoReader,
    VisionModel,
    texts_digest,
)
from chatmem.memory.attachments.queries import about_attachment
from chatmem.memory.attachments.surrogates import (
    SHORT_ID_CHARS,
    SURROGATE_CHARS,
    RefState,
    attachment_line,
    attachment_lines,
    label,
    offline_description,
    short_id,
)

__all__ = [
    "DOCUMENT_MIMES",
    "IMAGE_MIMES",
    "OCR_MIN_SCORE",
    "SCANNED_PAGES_MAX",
    "SHORT_ID_CHARS",
    "SURROGATE_CHARS",
    "TEXTS_DIGEST",
    "TEXT_KINDS",
    "Analysis",
    "Analyze",
    "Analyzer",
    "AttachmentJob",
    "AttachmentStore",
    "BadFile",
    "BlobStore",
    "Block",
    "DerivedText",
    "DocumentReader",
    "Extraction",
    "Fetcher",
    "Heard",
    "ImageInfo",
    "ImageReader",
    "KeptSpeech",
    "OcrEngine",
    "Read",
    "Reader",
    "RefState",
    "Reference",
    "Sniffed",
    "Transcriber",
    "VideoFrames",
    "VideoInfo",
    "VideoReader",
    "VisionModel",
    "about_attachment",
    "attachment_line",
    "attachment_lines",
    "chunk_blocks",
    "declared_mismatch",
    "label",
    "ocr_texts",
    "offline_description",
    "short_id",
    "sniff",
    "texts_digest",
]
