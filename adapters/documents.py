"""Documents to structure blocks: PDF (pypdf), HTML (BeautifulSoup), Markdown (markdown-it) and
plain text. Headings become heading blocks, so chunks follow the document's sections."""

from __future__ import annotations

import io
import re

from chatmem.memory.attachments import BadFile, Block

_BLANK = re.compile(r"\n\s*\n")
_HEADING_LIKE = re.compile(r"^[A-ZА-ЯЁ0-9][^.!?,;:]{0,78}$")


class DocumentReader:
    def __init__(self, max_pages: int, max_chars: int):
        self.max_pages = max_pages
        self.max_chars = max_chars

    def read(self, data: bytes, mime: str) -> tuple[list[Block], dict]:
        if mime == "application/pdf":
            return self._pdf(data)
        text = data.decode("utf-8", errors="replace")[: self.max_chars]
        if mime == "text/html":
            return self._html(text)
        if mime == "text/markdown":
            return _markdown(text), {}
        return [Block(p) for p in _BLANK.split(text)], {}

    def _pdf(self, data: bytes) -> tuple[list[Block], dict]:
        from pypdf import PdfReader
        from pypdf.errors import DependencyError, PdfReadError, PdfStreamError

        try:
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted:
                try:
                    opened = bool(reader.decrypt(""))  # some PDFs are encrypted with an empty password
                except (DependencyError, NotImplementedError, PdfReadError):
                    opened = False
                if not opened:
                    raise BadFile("the PDF is encrypted (password protected)")
            total = len(reader.pages)
            blocks: list[Block] = []
            chars = 0
            for number, page in enumerate(reader.pages[: self.max_pages], start=1):
                text = page.extract_text() or ""
                blocks += _pdf_blocks(text, number)
                chars += len(text)
                if chars > self.max_chars:
                    break
            meta: dict = {"pages": total}
            if total > self.max_pages:
                meta["pages_read"] = self.max_pages
            title = reader.metadata.get("/Title") if reader.metadata else None
            if isinstance(title, str) and title.strip():
                meta["pdf_title"] = title.strip()[:200]
            return blocks, meta
        except BadFile:
            raise
        except (PdfReadError, PdfStreamError, ValueError, KeyError, TypeError, AttributeError, OSError) as error:
            raise BadFile(f"broken PDF: {error}") from None

    def page_images(self, data: bytes, limit: int) -> list[tuple[int, bytes]]:
        """The images on the pages of a PDF (page number, encoded bytes), for OCR of scans."""
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError, PdfStreamError

        found: list[tuple[int, bytes]] = []
        try:
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted:
                reader.decrypt("")
            for number, page in enumerate(reader.pages[: self.max_pages], start=1):
                for image in page.images:
                    found.append((number, image.data))
                    if len(found) >= limit:
                        return found
        except (PdfReadError, PdfStreamError, ValueError, KeyError, TypeError, AttributeError, OSError) as error:
            raise BadFile(f"broken PDF: {error}") from None
        return found

    def _html(self, text: str) -> tuple[list[Block], dict]:
        from bs4 import BeautifulSoup

        soup = BeautifulSoup(text, "html.parser")
        for junk in soup(["script", "style", "noscript", "template", "nav", "footer"]):
            junk.decompose()
        tags = [
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "p",
            "li",
            "pre",
            "blockquote",
            "td",
            "th",
            "figcaption",
            "dd",
            "dt",
        ]
        blocks: list[Block] = []
        for el in soup.find_all(tags):
            if el.find_parent(tags):
                continue  # its text is in its parent's block already
            text = el.get_text(" ", strip=True)
            if el.name[0] == "h" and el.name[1:].isdigit():
                blocks.append(Block(text, heading=True, level=int(el.name[1:])))
            else:
                blocks.append(Block(text))
        if not blocks and soup.body:
            blocks = [Block(p) for p in _BLANK.split(soup.body.get_text("\n"))]
        meta = (
            {"html_title": soup.title.get_text(strip=True)[:200]}
            if soup.title and soup.title.get_text(strip=True)
            else {}
        )
        return blocks, meta


def _markdown(text: str) -> list[Block]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(text)
    blocks: list[Block] = []
    level = 0
    for tok in tokens:
        if tok.type == "heading_open":
            level = int(tok.tag[1:])
        elif tok.type == "inline":
            blocks.append(Block(tok.content, heading=level > 0, level=level))
            level = 0
        elif tok.type in ("fence", "code_block"):
            blocks.append(Block(tok.content))
    return blocks


def _pdf_blocks(text: str, page: int) -> list[Block]:
    """PDF text has lines but no structure: a short line with no closing punctuation, followed by
    more text, reads as a heading; other lines join into paragraphs."""
    lines = [ln.strip() for ln in text.splitlines()]
    blocks: list[Block] = []
    para: list[str] = []
    for i, line in enumerate(lines):
        if not line:
            if para:
                blocks.append(Block(" ".join(para), page=page))
                para = []
            continue
        following = next((ln for ln in lines[i + 1 :] if ln), "")
        if _HEADING_LIKE.match(line) and len(line.split()) <= 8 and len(following) > len(line):
            if para:
                blocks.append(Block(" ".join(para), page=page))
                para = []
            blocks.append(Block(line, heading=True, level=2, page=page))
        else:
            para.append(line)
    if para:
        blocks.append(Block(" ".join(para), page=page))
    return blocks
