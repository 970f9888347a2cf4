"""Derived text: what an attachment turns into for search, and the structure-aware chunks a
document (or an image's OCR lines) is cut into."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TEXT_KINDS = ("user_caption", "vision_short", "vision_detail", "ocr", "file_summary", "chunk", "transcript")


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


def transcript_texts(text: str, max_tokens: int, count: Callable[[str], int]) -> list[DerivedText]:
    """A recording's words as `transcript` texts of at most `max_tokens`, cut between sentences."""
    chunks = chunk_blocks([Block(text)], max_tokens, count)
    return [DerivedText("transcript", c.ord, c.text, c.meta) for c in chunks]
