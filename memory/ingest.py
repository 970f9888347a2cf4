"""Ingest: stream entries -> validated events in the log (or dead letters), then doorbells.

Order of effects per batch, which the invariants rest on:
1. validate every entry; invalid ones become dead letters with a readable reason;
2. commit events and dead letters in one transaction (events dedupe on event_id);
3. acknowledge the entries (only now: a crash before this redelivers them);
4. raise the watermark and ring the doorbell of every thread whose events just became final.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from chatmem.memory.ports import Doorbell, EventStore, EventStream
from chatmem.schemas.events import InvalidEvent, parse_event
from chatmem.schemas.records import AcceptedEvent, DeadLetter, StreamEntry, stream_pos

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestLimits:
    max_text_chars: int
    max_data_uri_bytes: int
    max_future_skew_s: float = 600.0
    min_occurred_at: datetime = datetime(1980, 1, 1, tzinfo=UTC)


@dataclass
class IngestStats:
    batches: int = 0
    inserted: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    rung: int = 0
    conflicts: int = 0
    clock_clamped: int = 0


def validate_entries(
    entries: Sequence[StreamEntry], limits: IngestLimits
) -> tuple[list[AcceptedEvent], list[DeadLetter], list[str]]:
    """Split entries into accepted events and dead letters; the third list holds entries whose
    body Redis no longer has (trimmed while pending), which only need acknowledging."""
    accepted: list[AcceptedEvent] = []
    dead: list[DeadLetter] = []
    vanished: list[str] = []
    for entry in entries:
        if entry.payload is None:
            vanished.append(entry.entry_id)
            continue
        try:
            event = parse_event(
                entry.payload,
                max_text_chars=limits.max_text_chars,
                max_data_uri_bytes=limits.max_data_uri_bytes,
            )
            # The log keeps the payload as published (validated, not rewritten); valid JSON is UTF-8.
            pos = stream_pos(entry.entry_id)
            accepted.append(
                _within_clock(AcceptedEvent(entry.entry_id, pos, event, entry.payload.decode(), entry.bulk), limits)
            )
        except (InvalidEvent, ValueError) as error:
            reason = error.reason if isinstance(error, InvalidEvent) else str(error)
            dead.append(DeadLetter(entry.entry_id, entry.payload, reason))
    return accepted, dead, vanished


def entry_time(entry_id: str) -> datetime:
    """When Redis took the entry (its id's milliseconds): the same on every redelivery."""
    return datetime.fromtimestamp(int(entry_id.split("-", 1)[0]) / 1000, UTC)


def _within_clock(accepted: AcceptedEvent, limits: IngestLimits) -> AcceptedEvent:
    """A producer clock far in the future or before any chat could have happened would poison
    time-gap segmentation and ordering by time: the event is logged at the time Redis took it,
    and the original time is kept in its metadata and as a notice."""
    event = accepted.event
    received = entry_time(accepted.entry_id)
    ahead = event.occurred_at - received > timedelta(seconds=limits.max_future_skew_s)
    if not ahead and event.occurred_at >= limits.min_occurred_at:
        return accepted
    original = event.occurred_at.isoformat()
    why = "ahead of" if ahead else "before the minimum, at"
    note = f"occurred_at {original} is {why} ingest; logged at {received.isoformat()} (the time Redis took it)"
    clamped = event.model_copy(
        update={"occurred_at": received, "metadata": {**event.metadata, "occurred_at_original": original}}
    )
    return AcceptedEvent(
        accepted.entry_id, accepted.stream_pos, clamped, clamped.model_dump_json(), accepted.bulk, note
    )


@dataclass(frozen=True)
class PreparedBatch:
    entry_ids: list[str]
    accepted: list[AcceptedEvent]
    dead: list[DeadLetter]


class IngestService:
    def __init__(
        self,
        stream: EventStream,
        store: EventStore,
        doorbell: Doorbell,
        *,
        stream_key: str,
        limits: IngestLimits,
    ):
        self.stream = stream
        self.store = store
        self.doorbell = doorbell
        self.stream_key = stream_key
        self.limits = limits
        self.stats = IngestStats()

    def process(self, entries: Sequence[StreamEntry]) -> None:
        if entries:
            self.commit(self.prepare(entries))

    def prepare(self, entries: Sequence[StreamEntry]) -> PreparedBatch:
        """Pure CPU work, safe to overlap with the commit of the previous batch."""
        accepted, dead, _vanished = validate_entries(entries, self.limits)
        return PreparedBatch([e.entry_id for e in entries], accepted, dead)

    def commit(self, batch: PreparedBatch) -> None:
        for letter in batch.dead:
            log.warning("dead letter %s: %s", letter.entry_id, letter.reason)
        result = self.store.store_batch(batch.accepted, batch.dead)
        self._classify(batch.accepted)
        self.stream.ack(batch.entry_ids)
        self.stats.batches += 1
        self.stats.inserted += result.inserted
        self.stats.duplicates += result.duplicates
        self.stats.dead_lettered += result.dead_lettered
        self.stats.conflicts += result.conflicts
        self.stats.clock_clamped += sum(1 for a in batch.accepted if a.clock_note)
        if result.conflicts:
            log.warning("%d event id(s) reused with different content: kept as conflicts", result.conflicts)
        self.refresh_watermark()

    def _classify(self, accepted: Sequence[AcceptedEvent]) -> None:
        """Threads fed by imports are rung at bulk priority until a live event arrives for them,
        so a big import never holds back the episodes of live threads."""
        live = {a.event.thread_id for a in accepted if not a.bulk}
        bulk = {a.event.thread_id for a in accepted if a.bulk} - live
        self.doorbell.classify(bulk=bulk, live=live)

    def refresh_watermark(self) -> int:
        watermark = self.stream.committed_watermark()
        threads = self.store.advance_watermark(self.stream_key, watermark)
        if threads:
            self.stats.rung += self.doorbell.ring(threads)
        return watermark

    def trim(self) -> int:
        """Drop stream entries below the committed watermark (never anything not yet ingested)."""
        return self.stream.trim_below(self.stream.committed_watermark())
