"""OpenDocument text, spreadsheets and presentations (odfdo's elements) to text blocks, as their
Office kin are read (adapters/documents.py opens the file within the checks every Office file
passes). No odfdo import at module level: it loads on first use."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from chatmem.adapters.blocks import cell_text, whole
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


def odf_blocks(element: OdfElement, *, skip_title: bool = False) -> Iterator[Block]:
    """Paragraphs and headings (a heading's level is its outline level) and table rows, in
    document order. A paragraph is read whole, its footnotes and frames with it."""
    for child in element.children:
        tag = child.tag
        if tag in _SKIPPED or (skip_title and child.get_attribute("presentation:class") == "title"):
            continue
        if tag in ("text:p", "text:h"):
            text = " ".join(child.text_recursive.split())
            level = max(1, min(9, whole(child.get_attribute("text:outline-level"), 1))) if tag == "text:h" else 0
            if text:
                yield Block(text, heading=bool(level), level=level)
        elif tag == "table:table":
            for row in odf_rows(child):
                if cells := [text for value in row if (text := cell_text(value))]:
                    yield Block(" | ".join(dict.fromkeys(cells)))
        else:
            yield from odf_blocks(child, skip_title=skip_title)


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


def odp_blocks(pages: Sequence[OdfElement], max_slides: int, max_chars: int) -> list[Block]:
    """Per slide (its number as the page): its title frame's text, or "Slide N", as a heading;
    then its other text in order; then its speaker notes."""
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
        for part in (odf_blocks(page, skip_title=True), *(odf_blocks(n) for n in notes)):
            found += [Block(b.text, page=number) for b in part]
        blocks += found
        chars += sum(len(b.text) for b in found)
        if chars > max_chars:
            break
    return blocks


def odf_errors() -> tuple[type[Exception], ...]:
    """What odfdo raises on a file it cannot read, besides what any Office file meets: its own
    zip-bomb checks, and a number or date the document writes wrongly (decimal's
    InvalidOperation is an ArithmeticError)."""
    from odfdo.security import SecurityError

    return (SecurityError, ArithmeticError, IndexError, RecursionError)


def odf_part(document: Any, href: Any) -> bytes | None:
    """A picture stored in the file, by the path a frame names; None for one linked from outside
    it or missing (odfdo then looks for the file on disk, and there is none)."""
    path = str(href or "").removeprefix("./")
    if not path or "://" in path or path.startswith("/") or ".." in path.split("/"):
        return None
    try:
        part = document.get_part(path)
    except (ValueError, KeyError):
        return None
    return part if isinstance(part, bytes) and part else None
