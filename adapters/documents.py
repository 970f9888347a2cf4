"""Documents to structure blocks: PDF (pypdf), Word (python-docx), Excel (openpyxl), PowerPoint
(python-pptx), their 97-2003 formats (adapters/ole.py for Word and PowerPoint, xlrd for Excel),
OpenDocument text, spreadsheets and presentations (odfdo), HTML (BeautifulSoup), Markdown
(markdown-it) and plain text. Headings become heading blocks, so chunks follow the document's
sections."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

from chatmem.adapters.blocks import chart_lines, chart_number, sheet_blocks, until
from chatmem.adapters.opendocument import odf_blocks, odf_errors, odf_part, odf_picture, odf_rows, odp_blocks
from chatmem.memory.attachments import BadFile, Block
from chatmem.memory.attachments.filetypes import (
    DOC_MIME,
    DOCX_MIME,
    FLAT_ODF_MIMES,
    HEAD_BYTES,
    ODF_MIMES,
    ODP_MIME,
    ODT_MIME,
    PPT_MIME,
    PPTX_MIME,
    XLS_MIME,
    XLSX_MIME,
    decode_text,
)

if TYPE_CHECKING:  # pypdf, python-docx and python-pptx load on first use
    from docx.document import Document as WordDocument
    from pptx.shapes.base import BaseShape
    from pptx.slide import Slides
    from pypdf import PdfReader

_BLANK = re.compile(r"\n\s*\n")
_DTD = re.compile(r"<!(?:DOCTYPE|ENTITY)", re.I)
_HEADING_LIKE = re.compile(r"^[A-ZА-ЯЁ0-9][^.!?,;:]{0,78}$")


class DocumentReader:
    """`max_pages` pages of a PDF are read; one with more than `max_pdf_pages` is refused before
    its page tree is walked, and no stream may decompress to more than `max_decoded_bytes`."""

    def __init__(
        self, max_pages: int, max_chars: int, *, max_pdf_pages: int = 10_000, max_decoded_bytes: int = 100_000_000
    ):
        self.max_pages = max_pages
        self.max_chars = max_chars
        self.max_pdf_pages = max_pdf_pages
        self.max_decoded_bytes = max_decoded_bytes

    def read(self, data: bytes, mime: str) -> tuple[list[Block], dict]:
        if mime == "application/pdf":
            return self._pdf(data)
        if mime == DOCX_MIME:
            return self._docx(data)
        if mime == XLSX_MIME:
            return self._xlsx(data)
        if mime == PPTX_MIME:
            return self._pptx(data)
        if mime == XLS_MIME:
            return self._xls(data)
        if mime == DOC_MIME:
            return self._doc(data)
        if mime == PPT_MIME:
            return self._ppt(data)
        if mime in ODF_MIMES:
            return self._odf(data)
        if mime in FLAT_ODF_MIMES:
            return self._odf(data, flat=True)
        text = decode_text(data)[: self.max_chars]
        if mime == "text/html":
            return self._html(text)
        if mime == "text/markdown":
            return _markdown(text), {}
        return [Block(p) for p in _BLANK.split(text)], {}

    def _pdf(self, data: bytes) -> tuple[list[Block], dict]:
        with self._pdf_reader(data) as reader:
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

    def _docx(self, data: bytes) -> tuple[list[Block], dict]:
        """A Word document's paragraphs and tables in order, headings by their style."""
        from docx import Document
        from docx.opc.exceptions import PackageNotFoundError

        with self._office_file(data, "Word document", PackageNotFoundError):
            document = Document(io.BytesIO(data))
            blocks = _docx_blocks(document, self.max_chars)
            title = document.core_properties.title
        return blocks, ({"doc_title": title.strip()[:200]} if title and title.strip() else {})

    def _xlsx(self, data: bytes) -> tuple[list[Block], dict]:
        """A spreadsheet's sheets in order: each sheet's name as a heading, then its rows, a row
        as one text with its cells joined by " | " (the values Excel last computed, not formulas)."""
        from openpyxl import load_workbook
        from openpyxl.utils.exceptions import InvalidFileException

        with self._office_file(data, "spreadsheet", InvalidFileException):
            book = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
            try:
                named = ((str(sheet.title), sheet.iter_rows(values_only=True)) for sheet in book.worksheets)
                blocks = sheet_blocks(named, self.max_chars)
                sheets = len(book.worksheets)
            finally:
                book.close()
        return blocks, {"sheets": sheets}

    def _xls(self, data: bytes) -> tuple[list[Block], dict]:
        """An Excel 97-2003 workbook, read as an .xlsx is: sheet by sheet, row by row."""
        import struct

        import xlrd
        from xlrd.compdoc import CompDocError
        from xlrd.formula import FormulaError

        # What xlrd raises on a file it cannot read: its own errors, and those of the records it
        # walks (a code page Python does not know: LookupError; a loop of sectors: RecursionError;
        # a formula it cannot parse; found by a mutation fuzz).
        broken = (xlrd.XLRDError, CompDocError, FormulaError, struct.error, EOFError, IndexError, KeyError, ValueError,
                  TypeError, AssertionError, ZeroDivisionError, OverflowError, AttributeError, LookupError,
                  RecursionError)  # fmt: skip
        try:
            # xlrd writes what it finds odd to stdout unless given a log of its own.
            book = xlrd.open_workbook(file_contents=data, on_demand=True, logfile=_Discard())
            try:
                sheets = book.nsheets
                named = ((book.sheet_by_index(i).name, _xls_rows(book, i)) for i in range(sheets))
                blocks = sheet_blocks(named, self.max_chars)
            finally:
                book.release_resources()
        except broken as error:
            if "encrypted" in str(error):  # xlrd's "Workbook is encrypted"
                raise BadFile("the spreadsheet is encrypted (password protected)") from None
            raise BadFile(f"broken spreadsheet: {error}") from None
        return blocks, {"sheets": sheets}

    def _doc(self, data: bytes) -> tuple[list[Block], dict]:
        """A Word 97-2003 document's main text, paragraph by paragraph, a table row as one text
        (adapters/ole.py: the format has no library to read it)."""
        from chatmem.adapters.ole import word_paragraphs

        paragraphs = word_paragraphs(data, self.max_chars)
        blocks = (Block(text, heading=bool(level), level=level) for text, level in paragraphs)
        return until(blocks, self.max_chars), {}

    def _ppt(self, data: bytes) -> tuple[list[Block], dict]:
        """A PowerPoint 97-2003 presentation read as a .pptx is: its first `max_pages` slides, each
        its title (or "Slide N") as a heading, then its text, then its notes (adapters/ole.py)."""
        from chatmem.adapters.ole import powerpoint_slides

        slides, total = powerpoint_slides(data, self.max_pages, self.max_chars)
        blocks: list[Block] = []
        for number, slide in enumerate(slides, start=1):
            blocks.append(Block(slide.title or f"Slide {number}", heading=True, level=1, page=number))
            blocks += [Block(text, page=number) for text in (*slide.texts, *slide.notes)]
        meta: dict = {"slides": total}
        if total > self.max_pages:
            meta["slides_read"] = self.max_pages
        return blocks, meta

    def _pptx(self, data: bytes) -> tuple[list[Block], dict]:
        """A presentation's first `max_pages` slides in order: each slide's title as a heading,
        then the text of its shapes and its speaker notes."""
        from pptx import Presentation
        from pptx.exc import InvalidXmlError, PackageNotFoundError

        with self._office_file(data, "presentation", PackageNotFoundError, InvalidXmlError):
            deck = Presentation(io.BytesIO(data))
            total = len(deck.slides)
            blocks = _slide_blocks(deck.slides, self.max_pages, self.max_chars)
            title = deck.core_properties.title
        meta: dict = {"slides": total}
        if total > self.max_pages:
            meta["slides_read"] = self.max_pages
        if title and title.strip():
            meta["doc_title"] = title.strip()[:200]
        return blocks, meta

    def _odf(self, data: bytes, *, flat: bool = False) -> tuple[list[Block], dict]:
        """An OpenDocument file, read as its Office kin is: a text's paragraphs, headings (by
        outline level), lists and table rows in order; a spreadsheet sheet by sheet; a
        presentation's first `max_pages` slides. `flat`: saved as one XML file."""
        from odfdo import Document

        with self._odf_file(data, flat):
            document = Document(io.BytesIO(data))  # bytes as a str would name a file or a template
            kind, body = document.get_type(), document.body
            meta: dict = {}
            if kind == "spreadsheet":
                tables = body.get_tables()
                named = ((str(t.name or f"Sheet {n}"), odf_rows(t)) for n, t in enumerate(tables, start=1))
                blocks = sheet_blocks(named, self.max_chars)
                meta["sheets"] = len(tables)
            elif kind == "presentation":
                pages = body.get_draw_pages()
                blocks = odp_blocks(pages, self.max_pages, self.max_chars, partial(odf_part, document))
                meta["slides"] = len(pages)
                if len(pages) > self.max_pages:
                    meta["slides_read"] = self.max_pages
            else:
                blocks = until(odf_blocks(body, parts=partial(odf_part, document)), self.max_chars)
            title = document.meta.get_title()
        if title and title.strip():
            meta["doc_title"] = title.strip()[:200]
        return blocks, meta

    @contextmanager
    def _office_file(self, data: bytes, what: str, *library_errors: type[Exception]) -> Iterator[None]:
        """What an Office file (a ZIP of XML parts) passes before its library unpacks it, and
        that library's failures as `broken <what>`."""
        import zipfile

        with self._library_errors(what, *library_errors):
            # The libraries unpack every part into memory: the sizes the ZIP declares bound that
            # (a part is never read past its declared size).
            with zipfile.ZipFile(io.BytesIO(data)) as package:
                unpacked = sum(part.file_size for part in package.infolist())
            if unpacked > self.max_decoded_bytes:
                raise BadFile(
                    f"the {what} unpacks to {unpacked:,} bytes, above the limit of "
                    f"{self.max_decoded_bytes:,} (a decompression bomb?)"
                )
            yield

    @contextmanager
    def _library_errors(self, what: str, *library_errors: type[Exception]) -> Iterator[None]:
        """A library's failures on a file it cannot read, as `broken <what>`."""
        import zipfile
        import zlib

        # The ZIP's errors (a compression method it does not know: NotImplementedError; a part
        # marked encrypted: RuntimeError), then what the libraries meet in parts they cannot
        # read (found by a mutation fuzz).
        broken: tuple[type[Exception], ...] = (
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            NotImplementedError,
            RuntimeError,
            *library_errors,
            KeyError,
            ValueError,
            SyntaxError,
            OSError,
            AttributeError,
            TypeError,
        )
        try:
            yield
        except BadFile:
            raise
        except broken as error:
            raise BadFile(f"broken {what}: {error}") from None

    def pictures(self, data: bytes, mime: str, limit: int) -> list[tuple[int | None, bytes]]:
        """The pictures stored in a file, in order, at most `limit`, each with its slide's number
        (a .pptx's, .ppt's or .odp's first `max_pages` slides) or None (a .docx, .doc or .odt,
        whose pages are not known); none for other files. A picture linked from outside the file is not
        fetched."""
        if mime == PPT_MIME:  # a compound file: its Pictures stream says whether it has any
            from chatmem.adapters.ole import powerpoint_pictures

            return [(slide, image) for slide, image in powerpoint_pictures(data, self.max_pages, limit)]
        if mime == DOC_MIME:  # and its Data stream
            from chatmem.adapters.ole import word_pictures

            return [(None, image) for image in word_pictures(data, limit)]
        if mime in (f"{ODP_MIME}-flat-xml", f"{ODT_MIME}-flat-xml"):  # pictures inline, in base64
            return list(islice(self._odf_pictures(data, slides=mime.startswith(ODP_MIME), flat=True), limit))
        if mime not in (PPTX_MIME, DOCX_MIME, ODP_MIME, ODT_MIME) or not _stores_pictures(data):
            return []  # most files have none: not parsed a second time for nothing
        if mime == PPTX_MIME:
            found = self._pptx_pictures(data)
        elif mime == DOCX_MIME:
            found = self._docx_pictures(data)
        else:
            found = self._odf_pictures(data, slides=mime == ODP_MIME)
        return list(islice(found, limit))

    def _pptx_pictures(self, data: bytes) -> Iterator[tuple[int | None, bytes]]:
        from pptx import Presentation
        from pptx.exc import InvalidXmlError, PackageNotFoundError

        with self._office_file(data, "presentation", PackageNotFoundError, InvalidXmlError):
            slides = Presentation(io.BytesIO(data)).slides
            for number, slide in enumerate(slides, start=1):
                if number > self.max_pages:
                    break
                yield from ((number, blob) for blob in _picture_blobs(slide.shapes))

    def _docx_pictures(self, data: bytes) -> Iterator[tuple[int | None, bytes]]:
        from docx import Document
        from docx.opc.exceptions import PackageNotFoundError

        with self._office_file(data, "Word document", PackageNotFoundError):
            document = Document(io.BytesIO(data))
            parts = document.part.related_parts
            for ref in document.element.body.xpath(".//a:blip/@r:embed"):  # in document order
                blob = getattr(parts.get(str(ref)), "blob", None)
                if isinstance(blob, bytes) and blob:
                    yield None, blob

    def _odf_pictures(self, data: bytes, *, slides: bool, flat: bool = False) -> Iterator[tuple[int | None, bytes]]:
        from odfdo import Document

        with self._odf_file(data, flat):
            document = Document(io.BytesIO(data))
            pages = document.body.get_draw_pages()[: self.max_pages] if slides else [document.body]
            for number, place in enumerate(pages, start=1):
                for image in place.get_elements("descendant::draw:image"):
                    if isinstance(blob := odf_picture(document, image), bytes):
                        yield (number if slides else None), blob

    def _odf_file(self, data: bytes, flat: bool) -> AbstractContextManager[None]:
        """A packaged OpenDocument file passes the checks of any Office file; a flat one is
        XML whose size is its whole cost, and which may declare no DTD: a flat file saved by
        LibreOffice has none, and one holds the entities of an XML bomb."""
        if not flat:
            return self._office_file(data, "OpenDocument file", *odf_errors())
        if len(data) > self.max_decoded_bytes:
            raise BadFile(
                f"the OpenDocument file is {len(data):,} bytes of XML, above the limit of {self.max_decoded_bytes:,}"
            )
        if _DTD.search(decode_text(data[:HEAD_BYTES])):
            raise BadFile("the OpenDocument file declares a DTD (entities): refused")
        return self._library_errors("OpenDocument file", *odf_errors())

    def page_images(self, data: bytes, limit: int) -> list[tuple[int, bytes]]:
        """The images on the pages of a PDF (page number, encoded bytes), for OCR of scans."""
        found: list[tuple[int, bytes]] = []
        with self._pdf_reader(data) as reader:
            for number, page in enumerate(reader.pages[: self.max_pages], start=1):
                for image in page.images:
                    found.append((number, _turned(image.data, page.rotation, self.max_decoded_bytes)))
                    if len(found) >= limit:
                        return found
        return found

    @contextmanager
    def _pdf_reader(self, data: bytes) -> Iterator[PdfReader]:
        """An open, decrypted PdfReader whose page count is within the limit, with pypdf's
        limits set from ours for as long as it is used; every failure is a BadFile."""
        from pypdf import PdfReader, apply_configuration, get_configuration
        from pypdf.errors import DependencyError, LimitReachedError, PdfReadError, PyPdfError

        # pypdf reads lazily: these hold for everything done inside the block. A page-tree entry
        # is a page or an intermediate node; twice the page limit leaves room for the nodes.
        decoded = self.max_decoded_bytes
        limits = {
            "zlib_maximum_output_length": decoded,
            "lzw_maximum_output_length": decoded,
            "run_length_maximum_output_length": decoded,
            "brotli_maximum_output_length": decoded,
            "jbig2_maximum_output_length": decoded,
            "array_based_stream_maximum_output_length": decoded,
            "image_maximum_buffer_size": decoded,
            "page_tree_maximum_entries": 2 * self.max_pdf_pages + 100,
        }
        try:
            with apply_configuration(get_configuration().with_overwrites(**limits)):
                reader = PdfReader(io.BytesIO(data))
                if reader.is_encrypted:
                    try:
                        opened = bool(reader.decrypt(""))  # some PDFs are encrypted with an empty password
                    except (DependencyError, NotImplementedError, PdfReadError):
                        opened = False
                    if not opened:
                        raise BadFile("the PDF is encrypted (password protected)")
                # The declared count first: refusing it costs nothing, walking the tree may.
                tree = reader.root_object.get("/Pages")
                declared = tree.get_object().get("/Count") if tree is not None else None
                if isinstance(declared, int) and declared > self.max_pdf_pages:
                    raise BadFile(f"the PDF has {declared:,} pages, above the limit of {self.max_pdf_pages:,}")
                total = len(reader.pages)  # walks the tree, within page_tree_maximum_entries
                if total > self.max_pdf_pages:  # the /Count lied
                    raise BadFile(f"the PDF has {total:,} pages, above the limit of {self.max_pdf_pages:,}")
                yield reader
        except BadFile:
            raise
        except LimitReachedError as error:
            raise self._limit_reached(str(error)) from None
        except RecursionError:
            raise BadFile("the PDF nests its objects too deeply to be read") from None
        except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, OSError) as error:
            if _from_recursion(error):  # pypdf re-raises a RecursionError as a PdfReadError
                raise BadFile("the PDF nests its objects too deeply to be read") from None
            raise BadFile(f"broken PDF: {error}") from None

    def _limit_reached(self, message: str) -> BadFile:
        """pypdf's LimitReachedError in words (its message says which limit)."""
        lowered = message.lower()
        if "page tree entry" in lowered:
            return BadFile(f"the PDF has more than {self.max_pdf_pages:,} pages (its page tree is larger than allowed)")
        if "depth" in lowered:
            return BadFile(f"the PDF nests its objects too deeply to be read ({message})")
        inflating = ("decompress", "buffer size", "array-based stream has at least", "decoding exceeded")
        if any(words in lowered for words in inflating):
            return BadFile(
                f"the PDF has a stream that decompresses to more than {self.max_decoded_bytes:,} bytes"
                " (a decompression bomb?)"
            )
        return BadFile(f"the PDF is over a safety limit: {message}")

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


def _from_recursion(error: BaseException) -> bool:
    """Whether `error` is, or was raised while handling, Python's recursion limit."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, RecursionError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


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


def _turned(data: bytes, rotation: int, max_bytes: int) -> bytes:
    """A scan's image turned as its page is shown. Scanner apps often store a page sideways and
    set the page's /Rotate rather than turn the pixels; OCR of the image as stored reads nothing
    of it. Bytes that do not decode, or would decode past `max_bytes`, are left as they are: the
    image reader refuses them with the reason."""
    if rotation % 360 not in (90, 180, 270):
        return data
    from PIL import Image

    # /Rotate turns clockwise; Pillow's turns are counter-clockwise.
    turn = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_90}
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height * len(img.getbands()) > max_bytes:
                return data
            upright = img.transpose(turn[rotation % 360])
            out = io.BytesIO()
            # TIFF holds every mode a scan comes in (PNG holds no CMYK, and no 32-bit grey).
            upright.save(out, "TIFF", compression="tiff_deflate")
            return out.getvalue()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return data


_WORD_HEADING = re.compile(r"(?:heading|заголовок) ([1-9])", re.IGNORECASE)


def _docx_blocks(document: WordDocument, max_chars: int) -> list[Block]:
    """Paragraphs and table rows in document order, up to about `max_chars`. A paragraph styled
    Title or Heading N is a heading; a table row is one block, its cells joined by " | " (a merged
    cell once); a chart, after its paragraph's text, as the numbers it draws."""
    from docx.table import Table

    # Style names by id, read once: `Paragraph.style` scans every style for each paragraph that
    # has none of its own (1.2 s of a 1.3 s read of 1,320 paragraphs).
    names = {style.style_id: style.name or "" for style in document.styles}
    blocks: list[Block] = []
    chars = 0
    for item in document.iter_inner_content():
        if isinstance(item, Table):
            rows = [dict.fromkeys(c.text.strip() for c in row.cells if c.text.strip()) for row in item.rows]
            found = [Block(" | ".join(cells)) for cells in rows if cells]
        else:
            text = item.text.strip()
            style = names.get(item._p.style or "", "")
            level = 1 if style.lower() == "title" else int(m[1]) if (m := _WORD_HEADING.fullmatch(style)) else 0
            found = [Block(text, heading=bool(level), level=level)] if text else []
            found += [Block(line) for rid in item._p.xpath(".//c:chart/@r:id") for line in _word_chart(document, rid)]
        blocks += found
        chars += sum(len(b.text) for b in found)
        if chars > max_chars:
            break
    return blocks


def _slide_blocks(slides: Slides, max_slides: int, max_chars: int) -> list[Block]:
    """Per slide (its number as the page): its title, or "Slide N" when it has none, as a heading;
    then each paragraph of its text boxes and placeholders and each table row (cells joined by
    " | "), in the slide's own order, grouped shapes included; then its speaker notes."""
    blocks: list[Block] = []
    chars = 0
    for number, slide in enumerate(slides, start=1):
        if number > max_slides:
            break
        title_shape = slide.shapes.title
        title = title_shape.text_frame.text.strip() if title_shape is not None else ""
        found = [Block(" ".join(title.split()) or f"Slide {number}", heading=True, level=1, page=number)]
        skip = {title_shape.shape_id} if title_shape is not None else set()
        found += [Block(text, page=number) for text in _shape_texts(slide.shapes, skip)]
        # Reading `notes_slide` makes one when the slide has none: ask first.
        if slide.has_notes_slide and (frame := slide.notes_slide.notes_text_frame) is not None:
            found += [Block(p.text.strip(), page=number) for p in frame.paragraphs if p.text.strip()]
        blocks += found
        chars += sum(len(b.text) for b in found)
        if chars > max_chars:
            break
    return blocks


def _shape_texts(shapes: Iterable[BaseShape], skip: set[int]) -> Iterator[str]:
    from pptx.shapes.autoshape import Shape
    from pptx.shapes.graphfrm import GraphicFrame
    from pptx.shapes.group import GroupShape

    for shape in shapes:
        if shape.shape_id in skip:
            continue
        if isinstance(shape, GroupShape):
            yield from _shape_texts(shape.shapes, skip)
        elif isinstance(shape, Shape) and shape.has_text_frame:  # text boxes and placeholders
            yield from (p.text.strip() for p in shape.text_frame.paragraphs if p.text.strip())
        elif isinstance(shape, GraphicFrame) and shape.has_table:
            for row in shape.table.rows:
                cells = dict.fromkeys(c.text.strip() for c in row.cells if c.text.strip())
                if cells:
                    yield " | ".join(cells)
        elif isinstance(shape, GraphicFrame) and shape.has_chart:
            yield from _chart_lines(shape.chart)


def _word_chart(document: WordDocument, rid: str) -> Iterator[str]:
    """A chart in a Word document, read as a slide's is: python-docx knows no charts, but the part
    holds the same DrawingML chart as a .pptx's, which python-pptx reads."""
    from pptx.chart.chart import Chart
    from pptx.oxml import parse_xml

    part = document.part.related_parts.get(rid)
    blob = getattr(part, "blob", None)
    if not isinstance(blob, bytes):
        return
    try:
        chart = Chart(parse_xml(blob), None)
    except (SyntaxError, ValueError):  # lxml's XMLSyntaxError is a SyntaxError: the text stays read
        return
    yield from _chart_lines(chart)


def _chart_lines(chart) -> Iterator[str]:  # noqa: ANN001 - a python-pptx Chart
    """A native chart as the numbers it draws (`chart_lines`), as the data sheet behind it holds
    them; a combined chart's plots share its categories. A chart whose XML python-pptx cannot
    read keeps the rest of the slide."""
    try:
        title = chart.chart_title.text_frame.text if chart.has_title else ""
        categories: list[str] = []
        series: list[tuple[str, Sequence[Any]]] = []
        for plot in chart.plots:
            found = list(plot.series)
            if not categories:  # an XY or bubble chart has none: each point's x
                categories = [str(c).strip() for c in plot.categories] or (_x_values(found[0]) if found else [])
            # Each `values` is read from the XML anew: once a series (45 ms a chart otherwise).
            series += [(s.name, s.values) for s in found]
        lines = chart_lines(title, categories, series)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, SyntaxError):
        return
    yield from lines


def _x_values(series) -> list[str]:  # noqa: ANN001 - a python-pptx XySeries
    """An XY series' x values, which python-pptx does not expose, from the series' XML."""
    points = {int(pt.get("idx")): pt.xpath("./c:v") for pt in series._element.xpath("./c:xVal//c:pt")}
    top = max(points, default=-1)
    return [chart_number(points[i][0].text) if points.get(i) else "" for i in range(top + 1)]


# Where Office and OpenDocument packages keep their pictures (word/media/image1.png, Pictures/…,
# which some writers name without an extension), or how they name them elsewhere: the ZIP's
# directory says whether a file has any without parsing it. The preview every editor saves is no
# picture of the document's.
_PICTURE_FOLDERS = ("pictures/", "word/media/", "ppt/media/")
_PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".jpe", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".emf", ".wmf", ".svg")
_PREVIEWS = ("docprops/thumbnail.", "thumbnails/")


def _stores_pictures(data: bytes) -> bool:
    """Whether a package holds a part named as a picture; True when its directory cannot be read
    (the reader then says why)."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            names = [name.lower() for name in package.namelist()]
        pictures = (n for n in names if n.startswith(_PICTURE_FOLDERS) or n.endswith(_PICTURE_SUFFIXES))
        return any(not name.startswith(_PREVIEWS) for name in pictures)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return True


def _picture_blobs(shapes: Iterable[BaseShape]) -> Iterator[bytes]:
    """The embedded pictures among shapes, grouped ones too."""
    from pptx.shapes.group import GroupShape
    from pptx.shapes.picture import Picture

    for shape in shapes:
        if isinstance(shape, GroupShape):
            yield from _picture_blobs(shape.shapes)
        elif isinstance(shape, Picture):
            try:
                yield shape.image.blob
            except (KeyError, ValueError, AttributeError):  # linked, not embedded
                continue


class _Discard:
    def write(self, text: str) -> int:
        return len(text)


def _xls_rows(book: Any, index: int) -> Iterator[list[Any]]:
    """A sheet's rows as openpyxl gives an .xlsx's values: whole numbers as int, dates as
    datetime, TRUE and FALSE as bool; cells in error are left out."""
    import xlrd

    sheet = book.sheet_by_index(index)
    for r in range(sheet.nrows):
        row: list[Any] = []
        for cell in sheet.row(r):
            if cell.ctype == xlrd.XL_CELL_NUMBER:
                row.append(int(cell.value) if float(cell.value).is_integer() else cell.value)
            elif cell.ctype == xlrd.XL_CELL_DATE:
                try:
                    row.append(xlrd.xldate_as_datetime(cell.value, book.datemode))
                except (xlrd.XLDateError, ValueError, OverflowError):
                    row.append(cell.value)  # a number formatted as a date it cannot be
            elif cell.ctype == xlrd.XL_CELL_BOOLEAN:
                row.append(bool(cell.value))
            elif cell.ctype == xlrd.XL_CELL_TEXT:
                row.append(cell.value)
        yield row
