"""Text blocks from what the document readers walk: rows of cells, runs of paragraphs. Shared by
the Office readers (adapters/documents.py) and the OpenDocument ones (adapters/opendocument.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, time
from typing import Any

from chatmem.memory.attachments import Block


def sheet_blocks(sheets: Iterable[tuple[str, Iterable[Sequence[Any]]]], max_chars: int) -> list[Block]:
    """Each sheet's name as a heading, then a block per row with a value, its cells joined by " | "."""
    blocks: list[Block] = []
    chars = 0
    for title, rows in sheets:
        blocks.append(Block(title, heading=True, level=1))
        for row in rows:
            cells = [text for v in row if v is not None and (text := cell_text(v))]
            if not cells:
                continue
            blocks.append(Block(" | ".join(cells)))
            chars += len(blocks[-1].text)
            if chars > max_chars:
                return blocks
    return blocks


def until(blocks: Iterable[Block], max_chars: int) -> list[Block]:
    """Blocks until about `max_chars` of text."""
    taken: list[Block] = []
    chars = 0
    for block in blocks:
        taken.append(block)
        chars += len(block.text)
        if chars > max_chars:
            break
    return taken


def whole(value: Any, default: int) -> int:
    """An attribute that should hold a whole number; `default` when it does not."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def cell_text(value: Any) -> str:
    """A cell as text; a date and time at midnight is the date alone (a date cell, as shown)."""
    if isinstance(value, datetime) and value.time() == time():
        return value.date().isoformat()
    return str(value).strip()


CHART_ROWS = 200  # of one chart: a chart of thousands of points is a picture of a table, not a table


def chart_lines(title: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[Any]]]) -> list[str]:
    """A chart as the numbers it draws, whoever stored it (a .pptx or .docx's DrawingML part, an
    OpenDocument chart object): `Chart: <title>`, then a row per category (its number when it
    has none) with each series' value named, `North | 2025: 12 | 2026: 15.5`; a value not given
    is left out, as is a row with none."""
    lines = [" ".join(f"Chart: {title}".split()) if title.strip() else "Chart"]
    rows = max((len(values) for _, values in series), default=0)
    for i in range(min(rows, CHART_ROWS)):
        named = [
            f"{name}: {chart_number(values[i])}" if name else chart_number(values[i])
            for name, values in series
            if i < len(values) and values[i] not in (None, "")
        ]
        if named:
            label = categories[i] if i < len(categories) and categories[i] else str(i + 1)
            lines.append(" | ".join([label, *named]))
    return lines


def chart_number(value: Any) -> str:
    """A chart's value as a person writes it: 12, 15.5, 0.125 (not 12.0); words as they are."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return " ".join(str(value).split())
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.6g}"
