"""Which cached model answers a rebuild reads or writes. Erasure, retention and deletions rebuild
threads over tombstones: an answer the rebuild uses was computed from the thread without the removed
events, and every answer computed from them is among those it does not use, which are then
deleted (adapters/erase_pg.py, `sweep_answers`). The rest of the thread's answers are kept, so
the model is asked again only about what held the removed events."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

LlmKey = tuple[str, str, bytes]  # model, prompt version, input hash (llm_cache)
PairKey = tuple[str, bytes]  # model, input hash (pair_cache)


@dataclass
class Used:
    llm: set[LlmKey] = field(default_factory=set)
    pairs: set[PairKey] = field(default_factory=set)


class CacheUses:
    """Shared by a process's caches; records only for the threads being watched. A watched thread
    is leased by its rebuild, so nothing else in the process asks about it meanwhile."""

    def __init__(self) -> None:
        self._watched: dict[str, Used] = {}
        self._lock = threading.Lock()

    def llm(self, thread_id: str | None, key: LlmKey) -> None:
        if thread_id is not None and (used := self._watched.get(thread_id)) is not None:
            used.llm.add(key)

    def pair(self, thread_id: str | None, key: PairKey) -> None:
        if thread_id is not None and (used := self._watched.get(thread_id)) is not None:
            used.pairs.add(key)

    @contextmanager
    def watching(self, thread_ids: Sequence[str]) -> Iterator[Used]:
        """What the block's rebuilds of `thread_ids` used, filled in when it ends."""
        total = Used()
        with self._lock:
            for t in thread_ids:
                self._watched[t] = Used()
        try:
            yield total
        finally:
            with self._lock:
                for t in thread_ids:
                    used = self._watched.pop(t, Used())
                    total.llm |= used.llm
                    total.pairs |= used.pairs
