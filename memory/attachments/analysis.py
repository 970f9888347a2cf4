"""Analysis of an artifact's bytes: OCR and a description for images; text, chunks and a summary
for documents (a PDF without a text layer is OCR'd page by page)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chatmem.memory.attachments.chunks import Block, DerivedText, chunk_blocks, ocr_texts
from chatmem.memory.attachments.errors import BadFile
from chatmem.memory.attachments.filetypes import Sniffed
from chatmem.memory.attachments.ports import Analysis, DocumentReader, ImageReader, OcrEngine, VisionModel
from chatmem.memory.attachments.surrogates import SURROGATE_CHARS, clip, offline_description
from chatmem.memory.ports import LLM
from chatmem.memory.prompts import FileSummary, ImageDescription, file_summary

OCR_MIN_SCORE = 0.5
SCANNED_PAGES_MAX = 50  # page images OCR'd from a PDF without a text layer


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
        return Analysis(clip(pages + summary.summary, SURROGATE_CHARS), texts, {**meta, "title": summary.title})

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
