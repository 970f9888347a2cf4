"""Token counting for the context budget: tiktoken when its encoding is on this machine, else
an estimate calibrated against it (bench/tokens.py prints the error; docs/read-path.md has
the bound). The estimate is biased high on purpose, so a budget it enforces holds for the
real tokenizer too."""

from __future__ import annotations

import os
import re
import tempfile
from functools import lru_cache
from hashlib import sha1
from pathlib import Path
from typing import Protocol

ENCODING = "o200k_base"

# One match per estimated token: up to 6 Latin letters, up to 2 letters of other scripts
# (Cyrillic and others split finer), up to 3 digits, or one symbol. Counting matches keeps the
# whole estimate inside the regex engine.
_TOKENS = re.compile(r"[A-Za-z]{1,6}|[^\W\d_A-Za-z]{1,2}|\d{1,3}|[^\w\s]|_")


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


class EstimateCounter:
    """Latin words: one token per 6 letters (at least one); other scripts: one per 2 letters;
    digits: one per 3; each symbol: one."""

    name = "estimate"

    def count(self, text: str) -> int:
        return len(_TOKENS.findall(text))


class TiktokenCounter:
    def __init__(self, encoding):  # noqa: ANN001
        self._enc = encoding
        self.name = f"tiktoken:{encoding.name}"

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))


def _cached_locally(name: str) -> bool:
    # tiktoken downloads a missing encoding; with no network that is an error after a DNS
    # failure, so look for its cache file first (tiktoken names it by the URL's sha1).
    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    folder = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    folder = folder or str(Path(tempfile.gettempdir()) / "data-gym-cache")
    return (Path(folder) / sha1(url.encode()).hexdigest()).is_file()


@lru_cache(maxsize=1)
def default_counter() -> TokenCounter:
    if _cached_locally(ENCODING):
        try:
            import tiktoken

            return TiktokenCounter(tiktoken.get_encoding(ENCODING))
        except Exception:  # noqa: BLE001 - a corrupt cache file: the estimate still works
            pass
    return EstimateCounter()
