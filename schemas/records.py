"""Records that cross the ports between domain logic and adapters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from chatmem.schemas.events import AnyEvent as AnyEvent  # its home before deletions joined it

# A Redis stream id "<ms>-<n>" packs into one bigint, ordered the same way.
_SEQ_SPAN = 1_000_000


def stream_pos(entry_id: str) -> int:
    ms, _, seq = entry_id.partition("-")
    n = int(seq or 0)
    if n >= _SEQ_SPAN:
        raise ValueError(f"stream id {entry_id} has a sequence above {_SEQ_SPAN - 1}")
    return int(ms) * _SEQ_SPAN + n


def stream_id(pos: int) -> str:
    return f"{pos // _SEQ_SPAN}-{pos % _SEQ_SPAN}"


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One entry read from the events stream; `payload` is None when Redis lost the body."""

    entry_id: str
    payload: bytes | None
    bulk: bool = False  # published by an importer: processed after live traffic


@dataclass(frozen=True, slots=True)
class AcceptedEvent:
    entry_id: str
    stream_pos: int
    event: AnyEvent
    payload: str  # the JSON as published (with `occurred_at` replaced when it was out of range)
    bulk: bool = False
    clock_note: str | None = None  # why occurred_at was replaced, when it was


@dataclass(frozen=True, slots=True)
class DeadLetter:
    entry_id: str
    raw: bytes
    reason: str
    source: str = "stream"


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """An event as stored in the log, in a thread's publish order."""

    stream_pos: int
    event_id: str
    type: str
    thread_id: str
    user_id: str
    occurred_at: datetime
    payload: dict


@dataclass(frozen=True, slots=True)
class ThreadLease:
    thread_id: str
    owner: str
    cursor_pos: int
    lease_s: int = 120


@dataclass(frozen=True, slots=True)
class StoreResult:
    inserted: int
    duplicates: int
    dead_lettered: int
    conflicts: int = 0  # duplicates whose content differed from the logged version
