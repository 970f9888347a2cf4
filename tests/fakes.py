"""In-memory fakes of every port, for unit tests (no I/O). Same interfaces as the real
adapters; they model the behaviour the domain logic relies on, not the services' internals."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from chatmem.memory.attachments import Analysis, BadFile, Reference, RefState, Sniffed
from chatmem.memory.episodes import message_text
from chatmem.memory.ports import LeaseLost, TransientError, UnknownThread
from chatmem.schemas.records import (
    AcceptedEvent,
    DeadLetter,
    LoggedEvent,
    StoreResult,
    StreamEntry,
    ThreadLease,
    stream_pos,
)


class FakeEventStream:
    """A stream with one consumer group: delivery, pending entries, acks, reclaim."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, bytes]] = []
        self.last_delivered = "0-0"
        self.pending: dict[str, str] = {}  # entry id -> consumer
        self.idle_ms: dict[str, int] = {}
        self.acked: list[str] = []
        self._ms = itertools.count(1_700_000_000_000)
        self.down = False

    def add_many(self, payloads: Sequence[bytes]) -> list[str]:
        if self.down:
            raise TransientError("fake stream is down")
        ids = []
        for payload in payloads:
            entry_id = f"{next(self._ms)}-0"
            self.entries.append((entry_id, payload))
            ids.append(entry_id)
        return ids

    def ensure_group(self) -> None:
        pass

    def _check(self) -> None:
        if self.down:
            raise TransientError("fake stream is down")

    def read_new(self, consumer: str, count: int, block_ms: int) -> list[StreamEntry]:
        self._check()
        last = stream_pos(self.last_delivered)
        out = [StreamEntry(i, p) for i, p in self.entries if stream_pos(i) > last][:count]
        for e in out:
            self.pending[e.entry_id] = consumer
            self.idle_ms[e.entry_id] = 0
        if out:
            self.last_delivered = out[-1].entry_id
        return out

    def read_own_pending(self, consumer: str, count: int) -> list[StreamEntry]:
        self._check()
        body = dict(self.entries)
        mine = sorted((i for i, c in self.pending.items() if c == consumer), key=stream_pos)[:count]
        return [StreamEntry(i, body.get(i)) for i in mine]

    def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]:
        self._check()
        body = dict(self.entries)
        stale = sorted((i for i in self.pending if self.idle_ms.get(i, 0) >= min_idle_ms), key=stream_pos)[:count]
        for i in stale:
            self.pending[i] = consumer
            self.idle_ms[i] = 0
        return [StreamEntry(i, body.get(i)) for i in stale]

    def ack(self, entry_ids: Sequence[str]) -> None:
        self._check()
        for i in entry_ids:
            if self.pending.pop(i, None) is not None:
                self.acked.append(i)

    def committed_watermark(self) -> int:
        after_last = stream_pos(self.last_delivered) + 1
        if self.pending:
            return min(min(stream_pos(i) for i in self.pending), after_last)
        return after_last

    def trim_below(self, pos: int) -> int:
        before = len(self.entries)
        self.entries = [(i, p) for i, p in self.entries if stream_pos(i) >= pos]
        return before - len(self.entries)


@dataclass
class FakeEventStore:
    events: dict[str, AcceptedEvent] = field(default_factory=dict)
    dead: dict[str, DeadLetter] = field(default_factory=dict)
    dead_count: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)
    fail_next: Exception | None = None

    def store_batch(self, events: Sequence[AcceptedEvent], dead: Sequence[DeadLetter]) -> StoreResult:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        inserted = 0
        for a in events:
            if a.event.event_id not in self.events:
                self.events[a.event.event_id] = a
                inserted += 1
        for d in dead:
            self.dead[d.entry_id] = d
            self.dead_count[d.entry_id] = self.dead_count.get(d.entry_id, 0) + 1
        return StoreResult(inserted, len(events) - inserted, len(dead))

    def advance_watermark(self, stream_key: str, watermark: int) -> list[str]:
        old = self.watermarks.get(stream_key, 0)
        if watermark <= old:
            return []
        self.watermarks[stream_key] = watermark
        return sorted({a.event.thread_id for a in self.events.values() if old <= a.stream_pos < watermark})

    # The thread log reads the same events.
    def logged(self, thread_id: str) -> list[LoggedEvent]:
        rows = sorted((a for a in self.events.values() if a.event.thread_id == thread_id), key=lambda a: a.stream_pos)
        return [
            LoggedEvent(
                a.stream_pos,
                a.event.event_id,
                a.event.type,
                a.event.thread_id,
                a.event.user_id,
                a.event.occurred_at,
                a.event.model_dump(mode="json"),
            )
            for a in rows
        ]


class FakeThreadLog:
    def __init__(self, store: FakeEventStore, stream_key: str = "chatmem:events"):
        self.store = store
        self.stream_key = stream_key
        self.cursors: dict[str, int] = {}
        self.leases: dict[str, str] = {}
        self.applied: dict[str, list[str]] = {}

    def acquire_lease(self, thread_id: str, owner: str, lease_s: int) -> ThreadLease | None:
        if not any(a.event.thread_id == thread_id for a in self.store.events.values()):
            raise UnknownThread(thread_id)
        holder = self.leases.get(thread_id)
        if holder not in (None, owner):
            return None
        self.leases[thread_id] = owner
        return ThreadLease(thread_id, owner, self.cursors.get(thread_id, 0), lease_s)

    def renew_lease(self, lease: ThreadLease) -> None:
        if self.leases.get(lease.thread_id) != lease.owner:
            raise LeaseLost(lease.thread_id)

    def release_lease(self, thread_id: str, owner: str) -> None:
        if self.leases.get(thread_id) == owner:
            del self.leases[thread_id]

    def pending_events(self, thread_id: str, after_pos: int, limit: int) -> list[LoggedEvent]:
        watermark = self.store.watermarks.get(self.stream_key, 0)
        return [e for e in self.store.logged(thread_id) if after_pos < e.stream_pos < watermark][:limit]

    def advance_cursor(self, lease: ThreadLease, events: Sequence[LoggedEvent]) -> ThreadLease:
        if self.leases.get(lease.thread_id) != lease.owner or self.cursors.get(lease.thread_id, 0) != lease.cursor_pos:
            raise LeaseLost(lease.thread_id)
        self.cursors[lease.thread_id] = events[-1].stream_pos
        self.applied.setdefault(lease.thread_id, []).extend(e.event_id for e in events)
        return ThreadLease(lease.thread_id, lease.owner, events[-1].stream_pos, lease.lease_s)

    def lagging_threads(self, limit: int) -> list[str]:
        watermark = self.store.watermarks.get(self.stream_key, 0)
        threads = {a.event.thread_id for a in self.store.events.values()}
        return sorted(
            t for t in threads if any(self.cursors.get(t, 0) < e.stream_pos < watermark for e in self.store.logged(t))
        )[:limit]


class FakeDoorbell:
    def __init__(self) -> None:
        self.marked: set[str] = set()
        self.sent: list[str] = []

    def ring(self, thread_ids: Iterable[str]) -> int:
        fresh = [t for t in dict.fromkeys(thread_ids) if t not in self.marked]
        self.marked.update(fresh)
        self.sent.extend(fresh)
        return len(fresh)

    def clear(self, thread_id: str) -> None:
        self.marked.discard(thread_id)


class FakeSink:
    """The producer side of a stream that can be switched off, or held (a slow Redis)."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.down = False
        self.gate = threading.Event()
        self.gate.set()

    def add_many(self, payloads: Sequence[bytes]) -> list[str]:
        self.gate.wait()
        if self.down:
            raise ConnectionError("fake Redis is down")
        start = len(self.payloads)
        self.payloads.extend(payloads)
        return [f"{start + i + 1}-0" for i in range(len(payloads))]


@dataclass
class FakeContextStore:
    """The context builder's read port over in-memory threads: members, the snapshot parts
    and the user's facts."""

    members: dict[str, set[str]] = field(default_factory=dict)  # thread_id -> user ids
    snapshots: dict = field(default_factory=dict)  # thread_id -> memory.context.ThreadSnapshot
    facts: dict[str, list] = field(default_factory=dict)  # user_id -> [memory.recall.FactCandidate]

    def session(self):  # noqa: ANN201
        return contextlib.nullcontext()

    def readable_threads(self, user_id: str, thread_id: str | None) -> list[str]:
        ids = [t for t, users in sorted(self.members.items()) if user_id in users]
        return [t for t in ids if t == thread_id] if thread_id is not None else ids

    def snapshot(self, thread_id: str, recent_limit: int):  # noqa: ANN201
        snap = self.snapshots[thread_id]
        return type(snap)(snap.thread_id, snap.generation, snap.running, snap.summaries, snap.recent[:recent_limit])

    def user_facts(self, user_id: str, limit: int) -> list:
        return self.facts.get(user_id, [])[:limit]


# --- attachments ---------------------------------------------------------------------------------


class FakeBlobStore:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.puts = 0

    def put(self, data: bytes) -> str:
        self.puts += 1
        sha = hashlib.sha256(data).hexdigest()
        self.blobs.setdefault(sha, data)
        return sha

    def get(self, sha256: str) -> bytes:
        return self.blobs[sha256]


class FakeFetcher:
    """url -> bytes, or an exception to raise (BadFile, TransientError)."""

    def __init__(self, files: dict[str, bytes | Exception]) -> None:
        self.files = files
        self.calls: list[str] = []

    def fetch(self, url: str) -> bytes:
        self.calls.append(url)
        found = self.files.get(url)
        if found is None:
            raise BadFile(f"file not found: {url}")
        if isinstance(found, Exception):
            raise found
        return found


class FakeAttachmentStore:
    """References, artifacts and message surrogates in memory, with the Postgres store's rules."""

    def __init__(self) -> None:
        self.payloads: dict[str, dict] = {}
        self.refs: dict[tuple[str, int], Reference] = {}
        self.artifacts: dict[str, dict] = {}
        self.captions: dict[tuple[str, int], str] = {}

    def add_message(self, event_id: str, thread_id: str, user_id: str, payload: dict) -> None:
        self.payloads[event_id] = payload
        for i, att in enumerate(payload.get("attachments") or []):
            self.refs[(event_id, i)] = Reference(event_id, i, thread_id, user_id, "pending", att)

    def reference(self, event_id: str, position: int) -> Reference | None:
        ref = self.refs.get((event_id, position))
        if ref is None or ref.sha256 is None:
            return ref
        art = self.artifacts[ref.sha256]
        return replace(ref, artifact_status=art["status"], mime=art["mime"], kind=art["kind"])

    def fail_reference(self, event_id: str, position: int, reason: str) -> None:
        self.refs[(event_id, position)] = replace(self.refs[(event_id, position)], status="failed", reason=reason)

    def link(self, ref: Reference, sha256: str, sniffed: Sniffed, size: int) -> str:
        art = self.artifacts.setdefault(
            sha256, {"status": "pending", "mime": sniffed.mime, "kind": sniffed.kind, "size": size, "claims": 0}
        )
        self.refs[(ref.event_id, ref.position)] = replace(ref, status="linked", sha256=sha256)
        return art["status"]

    def save_caption(self, ref: Reference, text: str, vector: np.ndarray) -> None:
        self.captions[(ref.event_id, ref.position)] = text

    def claim(self, sha256: str, claim_s: int) -> bool:
        art = self.artifacts[sha256]
        if art["status"] != "pending":
            return False
        art.update(status="processing")
        art["claims"] += 1
        return True

    def release(self, sha256: str) -> None:
        if self.artifacts[sha256]["status"] == "processing":
            self.artifacts[sha256]["status"] = "pending"

    def finish(self, sha256: str, analysis: Analysis, vectors: np.ndarray) -> None:
        assert len(vectors) == len(analysis.texts)
        self.artifacts[sha256].update(status="done", description=analysis.description, texts=analysis.texts)

    def fail_artifact(self, sha256: str, reason: str) -> None:
        self.artifacts[sha256].update(status="failed", reason=reason)

    def message_text(self, event_id: str) -> str:
        """What the message's history text would be now."""
        states = {}
        for (eid, pos), ref in self.refs.items():
            if eid != event_id:
                continue
            art = self.artifacts.get(ref.sha256 or "", {})
            if ref.status == "failed":
                states[pos] = RefState(pos, "failed", art.get("kind"), ref.sha256, reason=ref.reason)
            elif art.get("status") in ("done", "failed"):
                states[pos] = RefState(
                    pos, art["status"], art["kind"], ref.sha256, art.get("description"), art.get("reason")
                )
            else:
                states[pos] = RefState(pos, "pending", art.get("kind"), ref.sha256)
        return message_text(self.payloads[event_id], states)
