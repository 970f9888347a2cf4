"""OpenDocument text, spreadsheets and presentations (odfdo's elements) to text blocks, as their
Office kin are read (adapters/documents.py opens the file within the checks every Office file
passes). No odfdo import at module level: it loads on first use."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from chatmem.adapters.blocks import cell_text, chart_lines, whole
from chatmem.memory.attachments import Block

if TYPE_CHECKING:
    from odfdo import Element as OdfElement


# What an OpenDocument text holds besides its running text: indexes repeat its headings, the
# other parts are not the document's words.
_SKIPPED = {
    "text:table-of-content",
    "text:alphabetical-index",
    "text:illustration-index",
    "text:table-index",
    "text:object-index",
    "text:user-index",
    "text:bibliography",
    "text:tracked-changes",
    "office:forms",
    "office:annotation",
    "presentation:notes",
}
# A repeated row or cell is written once with its count: LibreOffice closes a sheet with an empty
# row repeated to the millionth. Empty ones are skipped; one with a value is repeated up to this.
_REPEAT_CAP = 1_000


Parts = Callable[[str], "bytes | None"]  # a part of the file by its path (None: not in the file)


def odf_blocks(element: OdfElement, *, skip_title: bool = False, parts: Parts | None = None) -> Iterator[Block]:
    """Paragraphs and headings (a heading's level is its outline level) and table rows, in
    document order. A paragraph is read whole, its footnotes and frames with it. With `parts`, a
    chart (an embedded object) in its place, as the numbers it draws."""
    for child in element.children:
        tag = child.tag
        if tag in _SKIPPED or (skip_title and child.get_attribute("presentation:class") == "title"):
            continue
        if tag == "draw:object" and parts is not None:
            yield from odf_blocks_of_object(child, parts)
            continue
        if tag in ("text:p", "text:h"):
            text = " ".join(child.text_recursive.split())
            level = max(1, min(9, whole(child.get_attribute("text:outline-level"), 1))) if tag == "text:h" else 0
            if text:
                yield Block(text, heading=bool(level), level=level)
            if parts is not None:  # a chart anchored in the paragraph follows its text
                for chart in child.get_elements("descendant::draw:object"):
                    yield from odf_blocks_of_object(chart, parts)
        elif tag == "table:table":
            for row in odf_rows(child):
                if cells := [text for value in row if (text := cell_text(value))]:
                    yield Block(" | ".join(dict.fromkeys(cells)))
        else:
            yield from odf_blocks(child, skip_title=skip_title, parts=parts)


def odf_rows(table: OdfElement) -> Iterator[list[Any]]:
    """A table's rows in order (header rows and row groups included), each a list of its cells'
    values: a date as a date, anything else as the cell shows it."""
    for child in table.children:
        if child.tag != "table:table-row":
            if child.tag in ("table:table-header-rows", "table:table-row-group", "table:table-rows"):
                yield from odf_rows(child)
            continue
        row: list[Any] = []
        for cell in child.children:
            if cell.tag != "table:table-cell":
                continue  # a covered cell is the merged cell before it
            value = _cell_value(cell)
            if value not in (None, ""):
                row += [value] * min(whole(cell.get_attribute("table:number-columns-repeated"), 1), _REPEAT_CAP)
        if row:
            yield from [row] * min(whole(child.get_attribute("table:number-rows-repeated"), 1), _REPEAT_CAP)


def _cell_value(cell: Any) -> Any:
    if cell.type == "date" and cell.value is not None:
        return cell.value
    return " ".join(str(cell.text_content or "").split()) or cell.value


def odp_blocks(pages: Sequence[OdfElement], max_slides: int, max_chars: int, parts: Parts | None = None) -> list[Block]:
    """Per slide (its number as the page): its title frame's text, or "Slide N", as a heading;
    then its other text (its charts too, with `parts`) in order; then its speaker notes."""
    blocks: list[Block] = []
    chars = 0
    for number, page in enumerate(pages[:max_slides], start=1):
        title = next(
            (
                " ".join(frame.text_recursive.split())
                for frame in page.get_elements("descendant::draw:frame")
                if frame.get_attribute("presentation:class") == "title"
            ),
            "",
        )
        found = [Block(title or f"Slide {number}", heading=True, level=1, page=number)]
        notes = page.get_elements("presentation:notes")
        for part in (odf_blocks(page, skip_title=True, parts=parts), *(odf_blocks(n) for n in notes)):
            found += [Block(b.text, page=number) for b in part]
        blocks += found
        chars += sum(len(b.text) for b in found)
        if chars > max_chars:
            break
    return blocks


def odf_blocks_of_object(frame_object: OdfElement, parts: Parts) -> Iterator[Block]:
    """An embedded object (`draw:object`), read when it is a chart."""
    href = str(frame_object.get_attribute("xlink:href") or "").removeprefix("./").rstrip("/")
    if href:
        content = parts(f"{href}/content.xml")
    elif (inline := frame_object.get_element("office:document")) is not None:  # a flat file's
        content = inline.serialize().encode()
    else:
        content = None
    yield from (Block(line) for line in odf_chart_lines(content or b""))


_ODF = {
    "chart": "urn:oasis:names:tc:opendocument:xmlns:chart:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
}
_NUMBERS = {"float", "percentage", "currency"}


def odf_chart_lines(content: bytes) -> Iterator[str]:
    """An embedded chart as the numbers it draws, as a slide's chart in a .pptx is read: `Chart:
    <title>`, then a row per category with each series' value named, from the table the chart
    keeps of its data (the first row names the series, the first column the categories). Another
    kind of object (a formula, a drawing), or one that cannot be parsed, gives nothing."""
    from lxml import etree

    if not content:
        return
    try:
        parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
        root = etree.fromstring(content, parser)
    except etree.XMLSyntaxError:
        return
    chart = root.find(".//chart:chart", _ODF)
    if chart is None:
        return
    title = " ".join(chart.xpath("./chart:title//text()", namespaces=_ODF))
    rows = [
        [_chart_cell(c) for c in row.iterfind("table:table-cell", _ODF)]
        for row in chart.iterfind(".//table:table-row", _ODF)
    ]
    names, body = (rows[0][1:], rows[1:]) if rows else ([], [])
    categories = [row[0] if row else "" for row in body]
    series = [(name, [row[k + 1] if k + 1 < len(row) else None for row in body]) for k, name in enumerate(names)]
    yield from chart_lines(title, categories, series)


def _chart_cell(cell: Any) -> str:
    """A number as the chart stores it (`office:value`), else the words the cell shows."""
    if cell.get(f"{{{_ODF['office']}}}value-type") in _NUMBERS and (value := cell.get(f"{{{_ODF['office']}}}value")):
        return value.strip()
    return " ".join(" ".join(cell.xpath(".//text:p//text()", namespaces=_ODF)).split())


def odf_errors() -> tuple[type[Exception], ...]:
    """What odfdo raises on a file it cannot read, besides what any Office file meets: its own
    zip-bomb checks, and a number or date the document writes wrongly (decimal's
    InvalidOperation is an ArithmeticError)."""
    from odfdo.security import SecurityError

    return (SecurityError, ArithmeticError, IndexError, RecursionError)


def odf_picture(document: Any, image: OdfElement) -> bytes | None:
    """A `draw:image`'s bytes: the part it names, or (in a flat file) its own base64 data."""
    import base64
    import binascii

    if (inline := image.get_element("office:binary-data")) is not None:
        try:
            return base64.b64decode("".join(str(inline.text or "").split()), validate=True) or None
        except (binascii.Error, ValueError):
            return None
    return odf_part(document, image.get_attribute("xlink:href"))


def odf_part(document: Any, href: Any) -> bytes | None:
    """A part stored in the file (a picture, an embedded object's content), by the path a frame
    names; None for one linked from outside it or missing (odfdo then looks for the file on disk,
    and there is none)."""
    path = str(href or "").removeprefix("./")
    if not path or "://" in path or path.startswith("/") or ".." in path.split("/"):
        return None
    try:
        part = document.get_part(path)
        if part is not None and not isinstance(part, bytes):  # an XML part, parsed: its bytes as stored
            part = document.container.get_part(path)
    except (ValueError, KeyError):
        return None
    return part if isinstance(part, bytes) and part else None
