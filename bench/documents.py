"""`chatmem bench documents`: what reading a document costs in each format chatmem reads, the
same content saved as Word and OpenDocument text, as Excel (.xlsx and 97-2003 .xls) and
OpenDocument spreadsheets, and as PowerPoint and OpenDocument presentations. Each file is read by
the reader the attachments helper uses (`DocumentReader.read`), the formats of one kind taken in
turn in every round, so a slower moment of the machine falls on each alike. Printed, never
asserted.

The files are generated here, by the libraries that read them (xlwt writes the .xls; without it,
from the dev extra, that row is left out)."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from chatmem.adapters.documents import DocumentReader
from chatmem.bench.host import machine
from chatmem.memory.attachments.filetypes import DOCX_MIME, PPTX_MIME, XLS_MIME, XLSX_MIME

ODT, ODS, ODP = (f"application/vnd.oasis.opendocument.{kind}" for kind in ("text", "spreadsheet", "presentation"))
Make = Callable[[int], bytes]


# --- the content, one of each kind ----------------------------------------------------------------
def _sections(n: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """n sections: a heading, five paragraphs and a 4×3 table."""
    return [
        (
            f"Section {s}: the office move",
            [f"Point {p} of section {s}: the budget for the Porto office was approved by the board." for p in range(5)],
            [[f"r{r}c{c} of {s}" for c in range(3)] for r in range(4)],
        )
        for s in range(n)
    ]


def _rows(n: int) -> list[list[Any]]:
    """A header and n rows of a text, a whole number, a fraction and a date."""
    start = date(2027, 1, 1)
    return [["Item", "Count", "Cost (EUR)", "Due"]] + [
        [f"Desk {r}", r, r * 10 + 0.25, start + timedelta(days=r % 365)] for r in range(n)
    ]


def _slides(n: int) -> list[tuple[str, list[str], list[list[str]], str]]:
    """n slides: a title, six points, a 4×3 table and speaker notes."""
    return [
        (
            f"Slide {s}: the office move",
            [f"Point {p} of slide {s}: two engineers join in spring, one designer in autumn." for p in range(6)],
            [[f"r{r}c{c}" for c in range(3)] for r in range(4)],
            f"Speaker notes for slide {s}: mention the lease.",
        )
        for s in range(n)
    ]


def _saved(document: Any) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# --- the formats ---------------------------------------------------------------------------------
def docx(n: int) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    for heading, paragraphs, table in _sections(n):
        document.add_heading(heading, 1)
        for text in paragraphs:
            document.add_paragraph(text)
        cells = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                cells.cell(r, c).text = value
    return _saved(document)


def odt(n: int) -> bytes:
    import odfdo

    document = odfdo.Document("text")
    document.body.clear()
    for heading, paragraphs, table in _sections(n):
        document.body.append(odfdo.Header(1, heading))
        for text in paragraphs:
            document.body.append(odfdo.Paragraph(text))
        document.body.append(_odf_table(table))
    return _saved(document)


def _odf_table(rows: list[list[Any]], name: str = "Table") -> Any:
    import odfdo

    table = odfdo.Table(name)
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            table.set_value((c, r), value)
    return table


def xlsx(n: int) -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    for row in _rows(n):
        book.active.append(row)
    return _saved(book)


def xls(n: int) -> bytes:
    import xlwt  # the dev extra's

    book = xlwt.Workbook()
    sheet = book.add_sheet("Sheet")
    as_date = xlwt.easyxf(num_format_str="YYYY-MM-DD")
    for r, row in enumerate(_rows(n)):
        for c, value in enumerate(row):
            if isinstance(value, date):
                sheet.write(r, c, value, as_date)
            else:
                sheet.write(r, c, value)
    return _saved(book)


def ods(n: int) -> bytes:
    import odfdo

    document = odfdo.Document("spreadsheet")
    document.body.clear()
    document.body.append(_odf_table(_rows(n), "Sheet"))
    return _saved(document)


def pptx(n: int) -> bytes:
    import pptx as python_pptx
    from pptx.util import Inches

    deck = python_pptx.Presentation()
    for title, points, table, notes in _slides(n):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        body = slide.placeholders[1].text_frame
        body.text = points[0]
        for text in points[1:]:
            body.add_paragraph().text = text
        cells = slide.shapes.add_table(len(table), len(table[0]), Inches(1), Inches(5), Inches(6), Inches(1)).table
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                cells.cell(r, c).text = value
        slide.notes_slide.notes_text_frame.text = notes
    return _saved(deck)


def odp(n: int) -> bytes:
    import odfdo

    def frame(kind: str, texts: list[str]) -> str:
        paragraphs = "".join(f"<text:p>{t}</text:p>" for t in texts)
        return f'<draw:frame presentation:class="{kind}"><draw:text-box>{paragraphs}</draw:text-box></draw:frame>'

    document = odfdo.Document("presentation")
    document.body.clear()
    for s, (title, points, table, notes) in enumerate(_slides(n)):
        page = odfdo.Element.from_tag(
            f'<draw:page draw:name="page{s}">{frame("title", [title])}{frame("outline", points)}'
            f"<presentation:notes>{frame('notes', [notes])}</presentation:notes></draw:page>"
        )
        holder = odfdo.Element.from_tag("<draw:frame/>")
        holder.append(_odf_table(table))
        page.insert(holder, position=2)  # before the notes
        document.body.append(page)
    return _saved(document)


KINDS: list[tuple[str, str, list[tuple[str, str, Make]]]] = [
    ("text", "sections", [("Word .docx", DOCX_MIME, docx), ("OpenDocument .odt", ODT, odt)]),
    (
        "spreadsheet",
        "rows",
        [("Excel .xlsx", XLSX_MIME, xlsx), ("Excel 97-2003 .xls", XLS_MIME, xls), ("OpenDocument .ods", ODS, ods)],
    ),
    ("presentation", "slides", [("PowerPoint .pptx", PPTX_MIME, pptx), ("OpenDocument .odp", ODP, odp)]),
]


def made(make: Make, n: int) -> bytes | None:
    """The file, or None when its writer is not installed (xlwt)."""
    try:
        return make(n)
    except ModuleNotFoundError:
        return None


def run(console: Console, *, sections: int = 60, rows: int = 2000, slides: int = 60, rounds: int = 7) -> dict:
    sizes = {"sections": sections, "rows": rows, "slides": slides}
    reader = DocumentReader(max_pages=10_000, max_chars=10_000_000)
    out: dict[str, dict[str, Any]] = {}
    table = Table(title=f"Reading a document, median of {rounds} (min–max)")
    for column in ("kind", "format", "KiB", "blocks", "characters", "ms", "× the first format"):
        table.add_column(column)
    for kind, unit, formats in KINDS:
        files = [(name, mime, data) for name, mime, make in formats if (data := made(make, sizes[unit])) is not None]
        times: dict[str, list[float]] = {name: [] for name, _, _ in files}
        read: dict[str, list] = {}
        for _ in range(rounds):
            for name, mime, data in files:
                t0 = time.perf_counter()
                read[name], _meta = reader.read(data, mime)
                times[name].append(time.perf_counter() - t0)
        first = statistics.median(times[files[0][0]])
        for name, _mime, data in files:
            blocks, spent = read[name], times[name]
            median = statistics.median(spent)
            chars = sum(len(b.text) for b in blocks)
            out[name] = {"blocks": [b.text for b in blocks], "seconds": spent, "bytes": len(data)}
            table.add_row(
                f"{kind} ({sizes[unit]:,} {unit})",
                name,
                f"{len(data) / 1024:,.0f}",
                f"{len(blocks):,}",
                f"{chars:,}",
                f"{median * 1000:,.0f} ({min(spent) * 1000:,.0f}–{max(spent) * 1000:,.0f})",
                f"{median / first:.2f}",
            )
    table.caption = f"{machine()} · {date.today()}"
    console.print(table)
    return out
