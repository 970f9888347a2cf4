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
