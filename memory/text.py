"""How the cue and fact patterns read a message: the same words however they were typed or
tokenised. A phone's keyboard types "I’m" with a typographic apostrophe, and tokenised corpora
split contractions off their word ("i 'd like", "do n't"); the patterns are written for "I'm"."""

from __future__ import annotations

import re

TYPO_APOSTROPHES = "\u2019\u2018\u02bc"  # ’ ‘ ʼ: what keyboards type for '
_APOSTROPHES = str.maketrans(dict.fromkeys(TYPO_APOSTROPHES, "'"))
_SPLIT_CONTRACTION = re.compile(r"(?<=\w) (n't|'(?:s|m|d|ll|re|ve))\b", re.IGNORECASE)


def plain_apostrophes(text: str) -> str:
    """`text` with every typographic apostrophe made plain: "I’m" -> "I'm"."""
    return text.translate(_APOSTROPHES)


def pattern_text(text: str) -> str:
    """`text` with plain apostrophes and split contractions joined back: "I’m" -> "I'm",
    "i 'd like" -> "i'd like", "do n't" -> "don't". For matching only; what is stored, quoted or
    counted stays as written."""
    text = plain_apostrophes(text)
    # Read on every message the segmenter sees: the search only where a split one can be.
    return _SPLIT_CONTRACTION.sub(r"\1", text) if " '" in text or " n'" in text or " N'" in text else text
