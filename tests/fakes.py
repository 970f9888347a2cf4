"""In-memory fakes of every port, for unit tests (no I/O). Same interfaces as the real
adapters; they model the behaviour the domain logic relies on, not the services' internals."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel

from chatmem.memory.attachments import (
    Analysis,
    BadFile,
    Block,
    Extraction,
    Heard,
    ImageInfo,
    Reference,
    RefState,
    Sniffed,
    VideoFrames,
    VideoInfo,
)
from chatmem.memory.attachments.filetypes import DOCX_MIME, ODP_MIME, ODT_MIME, PPTX_MIME
from chatmem.memory.boundary_llm import AssistFactory
from chatmem.memory.dates import Period
from chatmem.memory.episodes import Job, Plan, SummaryPolicy, ThreadContext, log_text, message_text
from chatmem.memory.fact_jobs import FactWrite, UserLine
from chatmem.memory.facts import FactCandidate, resolve
from chatmem.memory.jobs import Jobs
from chatmem.memory.offline_llm import OfflineLLM
from chatmem.memory.pipeline import ThreadProcessor
from chatmem.memory.ports import Embedder, LeaseLost, TransientError, UnknownThread
from chatmem.memory.prompts import ImageDescription, Line, Prompt
from chatmem.memory.recall import (
    ArtifactCandidate,
    FoundFact,
    Hops,
    Inline,
    SummaryCandidate,
    TermStats,
    TurnCandidate,
)
from chatmem.memory.segmentation import SegmenterConfig, SegmenterState
from chatmem.memory.sequencer import advance_thread
from chatmem.memory.summaries import LevelItem, StaleGeneration, SummaryRecord
from chatmem.memory.text import plain_apostrophes
from chatmem.schemas.read import Citation
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
        # Entry ids carry the time Redis took the entry; ingest compares event times with it.
        self._ms = itertools.count(int(time.time() * 1000))
        self.down = False
        self.bulk: set[str] = set()  # entry ids published by a bulk (import) sink

    def add_many(self, payloads: Sequence[bytes], *, bulk: bool = False) -> list[str]:
        if self.down:
            raise TransientError("fake stream is down")
        ids = []
        for payload in payloads:
            entry_id = f"{next(self._ms)}-0"
            self.entries.append((entry_id, payload))
            ids.append(entry_id)
        if bulk:
            self.bulk.update(ids)
        return ids

    def _entry(self, entry_id: str, payload: bytes | None) -> StreamEntry:
        return StreamEntry(entry_id, payload, entry_id in self.bulk)

    def ensure_group(self) -> None:
        pass

    def _check(self) -> None:
        if self.down:
            raise TransientError("fake stream is down")

    def read_new(self, consumer: str, count: int, block_ms: int) -> list[StreamEntry]:
        self._check()
        last = stream_pos(self.last_delivered)
        out = [self._entry(i, p) for i, p in self.entries if stream_pos(i) > last][:count]
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
        return [self._entry(i, body.get(i)) for i in mine]

    def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]:
        self._check()
        body = dict(self.entries)
        stale = sorted((i for i in self.pending if self.idle_ms.get(i, 0) >= min_idle_ms), key=stream_pos)[:count]
        for i in stale:
            self.pending[i] = consumer
            self.idle_ms[i] = 0
        return [self._entry(i, body.get(i)) for i in stale]

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
    # (kind, event_id, payload or detail) as the event_notices table keeps them, deduplicated.
    notices: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def store_batch(self, events: Sequence[AcceptedEvent], dead: Sequence[DeadLetter]) -> StoreResult:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        inserted = conflicts = 0
        for a in events:
            if a.event.event_id not in self.events:
                self.events[a.event.event_id] = a
                inserted += 1
            elif json.loads(self.events[a.event.event_id].payload) != json.loads(a.payload):
                key = ("conflict", a.event.event_id, a.payload)
                conflicts += key not in self.notices
                self.notices.setdefault(key, "event_id reused with different content")
            if a.clock_note:
                self.notices.setdefault(("clock", a.event.event_id, ""), a.clock_note)
        for d in dead:
            self.dead[d.entry_id] = d
            self.dead_count[d.entry_id] = self.dead_count.get(d.entry_id, 0) + 1
        return StoreResult(inserted, len(events) - inserted, len(dead), conflicts)

    def advance_watermark(self, stream_key: str, watermark: int) -> list[str]:
        old = self.watermarks.get(stream_key, 0)
        if watermark <= old:
            return []
        self.watermarks[stream_key] = watermark
        return sorted({a.event.thread_id for a in self.events.values() if old <= a.stream_pos < watermark})

    def commit(self, events: Sequence[Any], stream_key: str = "chatmem:events") -> list[str]:
        """Store published events (schemas.events models) as ingest would, and move the watermark
        past them: the threads they touch are returned, as advance_watermark returns them."""
        start = max((a.stream_pos for a in self.events.values()), default=0)
        accepted = [
            AcceptedEvent(f"{start + i}-0", start + i, e, e.model_dump_json()) for i, e in enumerate(events, start=1)
        ]
        self.store_batch(accepted, [])
        return self.advance_watermark(stream_key, start + len(events) + 1)

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

    def first_pending(self, thread_ids: Sequence[str], limit: int) -> dict[str, list[LoggedEvent]]:
        found = {t: self.pending_events(t, self.cursors.get(t, 0), limit) for t in thread_ids}
        return {t: events for t, events in found.items() if events}

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
        self.bulk: set[str] = set()
        self.sent_bulk: list[str] = []

    def ring(self, thread_ids: Iterable[str]) -> int:
        fresh = [t for t in dict.fromkeys(thread_ids) if t not in self.marked]
        self.marked.update(fresh)
        self.sent.extend(t for t in fresh if t not in self.bulk)
        self.sent_bulk.extend(t for t in fresh if t in self.bulk)
        return len(fresh)

    def classify(self, *, bulk: Iterable[str], live: Iterable[str]) -> None:
        self.bulk = (self.bulk | set(bulk)) - set(live)

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
    facts: dict[str, list] = field(default_factory=dict)  # user_id -> [memory.recall.FoundFact]

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
        self.clock = 0.0  # seconds; tests move it forward to age the references
        self.updated: dict[tuple[str, int], float] = {}

    def add_message(self, event_id: str, thread_id: str, user_id: str, payload: dict) -> None:
        self.payloads[event_id] = payload
        for i, att in enumerate(payload.get("attachments") or []):
            self.refs[(event_id, i)] = Reference(event_id, i, thread_id, user_id, "pending", att)
            self.updated[(event_id, i)] = self.clock

    def reference(self, event_id: str, position: int) -> Reference | None:
        ref = self.refs.get((event_id, position))
        if ref is None or ref.sha256 is None:
            return ref
        art = self.artifacts[ref.sha256]
        return replace(ref, artifact_status=art["status"], mime=art["mime"], kind=art["kind"])

    def fail_reference(self, event_id: str, position: int, reason: str) -> None:
        self.refs[(event_id, position)] = replace(self.refs[(event_id, position)], status="failed", reason=reason)
        self.updated[(event_id, position)] = self.clock

    def link(self, ref: Reference, sha256: str, sniffed: Sniffed, size: int) -> str:
        art = self.artifacts.setdefault(
            sha256, {"status": "pending", "mime": sniffed.mime, "kind": sniffed.kind, "size": size, "claims": 0}
        )
        self.refs[(ref.event_id, ref.position)] = replace(ref, status="linked", sha256=sha256)
        self.updated[(ref.event_id, ref.position)] = self.clock
        return art["status"]

    def save_caption(self, ref: Reference, text: str, vector: np.ndarray, model: str | None = None) -> None:
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

    def finish(self, sha256: str, analysis: Analysis, vectors: np.ndarray, model: str | None = None) -> None:
        assert len(vectors) == len(analysis.texts)
        self.artifacts[sha256].update(
            status="done", description=analysis.description, texts=analysis.texts, meta=analysis.meta
        )

    def fail_artifact(self, sha256: str, reason: str) -> None:
        self.artifacts[sha256].update(status="failed", reason=reason)

    def analysed(self) -> list[tuple[str, str, str, str | None]]:
        return [
            (sha, a.get("mime", ""), a.get("kind", ""), None)
            for sha, a in sorted(self.artifacts.items())
            if a.get("status") == "done"
        ]

    def replace_analysis(self, sha256: str, analysis: Analysis, vectors: np.ndarray, model: str | None = None) -> None:
        self.finish(sha256, analysis, vectors, model)

    def heard(self, sha256: str) -> Heard:
        art = self.artifacts[sha256]
        meta = art.get("meta", {})
        words = " ".join(t.text for t in art.get("texts", []) if t.kind == "transcript")
        return Heard(words, meta.get("transcription_model"), meta.get("speech"))

    def stale_references(self, older_than_s: int) -> list[tuple[str, int]]:
        """The sweeper's LostAttachments port: references still pending, or linked to an artifact
        not yet analysed, untouched for `older_than_s` seconds (oldest first)."""
        stale = [
            (self.updated.get(key, 0.0), key)
            for key, ref in self.refs.items()
            if (ref.status == "pending" or (ref.status == "linked" and self._unfinished(ref.sha256)))
            and self.updated.get(key, 0.0) < self.clock - older_than_s
        ]
        return [key for _, key in sorted(stale)]

    def _unfinished(self, sha256: str | None) -> bool:
        return self.artifacts.get(sha256 or "", {}).get("status") in ("pending", "processing")

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


# --- models --------------------------------------------------------------------------------------

_WORDS = re.compile(r"[^\W_]+", re.UNICODE)
M = TypeVar("M", bound=BaseModel)


class FakeEmbedder:
    """Deterministic bag-of-words vectors: each lowercase word hashes to one signed dimension, so
    texts sharing words are similar and the same text always gets the same unit vector."""

    model = "fake-bag-of-words"

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        self.calls: list[list[str]] = []

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in _WORDS.findall(text.lower()):
            h = int.from_bytes(hashlib.sha1(word.encode()).digest()[:4], "big")
            v[h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        norm = float(np.linalg.norm(v))
        if norm == 0.0:
            v[0] = 1.0
            return v
        return v / norm

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([self._vector(t) for t in texts], dtype=np.float32).reshape(len(texts), self.dim)


class FakeLLM:
    """The LLM port: answers from `answers` (prompt name -> a response, or a function of the
    prompt's input), else as the offline extractive LLM would. Records every prompt; while `fail`
    is set, every call raises it (a provider outage)."""

    def __init__(self, answers: dict[str, BaseModel | Callable[[dict], BaseModel]] | None = None) -> None:
        self.model = "fake-llm"
        self.answers = dict(answers or {})
        self.calls: list[Prompt] = []
        self.fail: Exception | None = None
        self._offline = OfflineLLM(FakeEmbedder())

    def complete(self, prompt: Prompt, response_model: type[M]) -> M:
        self.calls.append(prompt)
        if self.fail is not None:
            raise self.fail
        answer = self.answers.get(prompt.name)
        if answer is None:
            return self._offline.complete(prompt, response_model)
        result = answer if isinstance(answer, BaseModel) else answer(prompt.input)
        return response_model.model_validate(result.model_dump())

    def called(self, name: str) -> int:
        return sum(1 for p in self.calls if p.name == name)


class FakeTokenCounter:
    """One token per whitespace-separated word (and at least one per non-empty text)."""

    name = "fake-words"

    def count(self, text: str) -> int:
        words = len(text.split())
        return words if words or not text else 1


# --- projections and summaries -------------------------------------------------------------------


@dataclass
class FakeSummary:
    id: int
    record: SummaryRecord
    is_active: bool = True
    embedding: np.ndarray | None = None
    created: float = 0.0  # the projections' clock when saved


class FakeProjections:
    """Per-generation messages, episodes, summaries and commands of each thread, with the thread's
    processing state: the Projections port of the doorbell, what replay needs (next_generation,
    switch_generation), the SummaryStore / SummaryVectors of the summary jobs and the sweeper's
    LostFinals, with PostgresProjections' rules.

    Leases and cursors live in `log` (a FakeThreadLog); the live `advance` is called as
    `advance(None, lease, events)` where the real one gets the open connection. A thread exists
    (generation 1, memory on) from its first load_context or `add_thread`."""

    def __init__(self, log: FakeThreadLog | None = None) -> None:
        self.log = log
        self.contexts: dict[str, ThreadContext] = {}
        self.episodes: dict[tuple[int, str], dict] = {}  # (generation, episode_id) -> row
        self.messages: dict[tuple[str, int, int], dict] = {}  # (thread_id, generation, seq) -> row
        self.commands: dict[tuple[str, int], dict] = {}  # (event_id, generation) -> row
        self.references: dict[tuple[str, int], tuple[str, str]] = {}  # (event_id, position) -> (thread, user)
        self.summaries: dict[tuple[int, str], FakeSummary] = {}  # (generation, summary_key) -> row
        self._ids = itertools.count(1)
        self.fail_next: Exception | None = None  # the next apply / save_summary raises it, writing nothing
        self.clock = 0.0  # seconds; tests move it to age what is saved

    def _fail(self) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error

    # --- thread state ---------------------------------------------------------------------
    def add_thread(self, thread_id: str) -> ThreadContext:
        return self.contexts.setdefault(thread_id, ThreadContext(thread_id, 1, True, {}, SegmenterState(), None, 0, 0))

    def load_context(self, thread_id: str) -> ThreadContext:
        return self.add_thread(thread_id)

    def memory_on_ahead(self, thread_id: str, after_pos: int, watermark_key: str) -> bool:
        if self.log is None:
            return False
        watermark = self.log.store.watermarks.get(watermark_key, 0)
        return any(
            e.type == "command" and e.payload.get("command") == "memory_on" and after_pos < e.stream_pos < watermark
            for e in self.log.store.logged(thread_id)
        )

    def deletion_ahead(self, thread_id: str, after_pos: int, watermark_key: str) -> bool:
        if self.log is None:
            return False
        watermark = self.log.store.watermarks.get(watermark_key, 0)
        logged = self.log.store.logged(thread_id)
        gone = {
            i
            for e in logged
            if e.type == "message_deleted" and after_pos < e.stream_pos < watermark
            for i in e.payload.get("platform_message_ids", [])
        }
        return any(
            e.type in ("message", "message_edited")
            and e.payload.get("platform_message_id") in gone
            and not (e.payload.get("metadata") or {}).get("erased")
            for e in logged
        )

    def deletions_naming(self, thread_id: str, logged: Sequence[tuple[str, int]]) -> list[str]:
        if self.log is None:
            return []
        owners = [thread_id, thread_id.rsplit(":", 1)[0]] if ":" in thread_id else [thread_id]
        return sorted(
            owner
            for owner in owners
            if any(
                e.type == "message_deleted" and pid in e.payload.get("platform_message_ids", []) and e.stream_pos < pos
                for e in self.log.store.logged(owner)
                for pid, pos in logged
            )
        )

    def _lease_held(self, lease: ThreadLease) -> bool:
        return self.log is None or self.log.leases.get(lease.thread_id) == lease.owner

    def apply(self, plan: Plan, *, lease: ThreadLease | None, advance) -> ThreadLease | None:  # noqa: ANN001
        """Live (lease given): the cursor move, the rows and the thread's state, all or nothing.
        Replay (lease None): the rows of the new generation only."""
        ctx = plan.context
        assert ctx is not None
        self._fail()
        if lease is not None:
            if plan.consumed:
                lease = advance(None, lease, plan.consumed)  # raises LeaseLost before anything is written
            elif not self._lease_held(lease):
                raise LeaseLost(lease.thread_id)
        self._write(plan, ctx.generation)
        if lease is not None:
            self.contexts[ctx.thread_id] = ctx
        return lease

    def _write(self, plan: Plan, gen: int) -> None:
        tid = plan.context.thread_id  # type: ignore[union-attr]
        for ep in plan.opened:
            self.episodes.setdefault(
                (gen, ep.episode_id),
                {
                    "episode_id": ep.episode_id,
                    "thread_id": tid,
                    "ordinal": ep.ordinal,
                    "start_seq": ep.start_seq,
                    "end_seq": None,
                    "status": "open",
                    "opened_by": ep.opened_by,
                    "closed_by": None,
                    "topic_label": None,
                },
            )
        for m in plan.messages:
            if (tid, gen, m.seq) in self.messages:
                raise ValueError(f"duplicate message {tid}/{gen}/{m.seq}")  # the primary key
        for m in plan.messages:
            self.messages[(tid, gen, m.seq)] = {
                "seq": m.seq,
                "event_id": m.event_id,
                "stream_pos": m.stream_pos,
                "episode_id": m.episode_id,
                "user_id": m.user_id,
                "role": m.role,
                "text": m.text,
                "platform_message_id": m.platform_message_id,
                "occurred_at": m.occurred_at,
                "embedding": m.embedding,
                "is_active": True,
            }
        for mv in plan.moves:
            for (t, g, seq), row in self.messages.items():
                if t == tid and g == gen and seq >= mv.from_seq and row["episode_id"] == mv.from_episode:
                    row["episode_id"] = mv.to_episode
        for c in plan.closed:
            self.episodes[(gen, c.episode_id)].update(status="closed", end_seq=c.end_seq, closed_by=c.closed_by)
        for platform_id, text in plan.edits:
            for (t, g, _), row in self.messages.items():
                if t == tid and g == gen and row["platform_message_id"] == platform_id:
                    row["text"] = text
        for event_id, position, user_id in plan.attachments:
            self.references.setdefault((event_id, position), (tid, user_id))
        for ack in plan.commands:
            self.commands.setdefault(
                (ack.event_id, gen),
                {"thread_id": tid, "command": ack.command, "status": ack.status, "detail": ack.detail},
            )

    def next_generation(self, thread_id: str) -> int:
        gens = [self.add_thread(thread_id).generation]
        gens += [g for (g, _), e in self.episodes.items() if e["thread_id"] == thread_id]
        gens += [g for (t, g, _) in self.messages if t == thread_id]
        return max(gens) + 1

    def switch_generation(self, lease: ThreadLease, ctx: ThreadContext) -> bool:
        if not self._lease_held(lease):
            return False
        self.contexts[ctx.thread_id] = ctx
        if self.log is not None:
            self.log.cursors[ctx.thread_id] = lease.cursor_pos
        return True

    def missing_finals(self) -> list[tuple[str, int, Job]]:
        out = []
        for (gen, eid), e in sorted(self.episodes.items()):
            ctx = self.contexts.get(e["thread_id"])
            if ctx is None or ctx.generation != gen or e["status"] != "closed":
                continue
            if (gen, f"{eid}:final") not in self.summaries:
                out.append((e["thread_id"], gen, Job("final", eid, e["start_seq"], e["end_seq"])))
        return out

    # --- reading back (for assertions) ------------------------------------------------------
    def thread_messages(self, thread_id: str, generation: int | None = None) -> list[dict]:
        gen = self.contexts[thread_id].generation if generation is None else generation
        return [row for (t, g, _), row in sorted(self.messages.items()) if t == thread_id and g == gen]

    def thread_episodes(self, thread_id: str, generation: int | None = None) -> list[dict]:
        gen = self.contexts[thread_id].generation if generation is None else generation
        rows = [e for (g, _), e in self.episodes.items() if e["thread_id"] == thread_id and g == gen]
        return sorted(rows, key=lambda e: e["ordinal"])

    def thread_summaries(self, thread_id: str, generation: int | None = None) -> list[FakeSummary]:
        gen = self.contexts[thread_id].generation if generation is None else generation
        rows = [s for (g, _), s in self.summaries.items() if s.record.thread_id == thread_id and g == gen]
        return sorted(rows, key=lambda s: s.record.summary_key)

    # --- summary store --------------------------------------------------------------------
    def job_state(self, thread_id: str, generation: int, summary_key: str) -> tuple[bool, bool]:
        return (generation, summary_key) in self.summaries, self.generation_active(thread_id, generation)

    def generation_active(self, thread_id: str, generation: int) -> bool:
        ctx = self.contexts.get(thread_id)
        # A replay writes its generation before switching to it: both are "current" for jobs.
        return ctx is not None and generation >= ctx.generation

    def episode_lines(
        self, thread_id: str, generation: int, episode_id: str, from_seq: int, upto_seq: int
    ) -> list[Line]:
        rows = [
            row
            for (t, g, seq), row in sorted(self.messages.items())
            if t == thread_id and g == generation and row["episode_id"] == episode_id and from_seq <= seq <= upto_seq
        ]
        if self.log is None:  # no log to read from: the projection's text
            return [Line(seq=row["seq"], role=row["role"], text=row["text"]) for row in rows]
        # As the Postgres store does: texts from the log, edits up to the range's last message.
        logged = {e.event_id: e for e in self.log.store.logged(thread_id)}
        upto = max((row["stream_pos"] for row in rows), default=0)
        lines = []
        for row in rows:
            edits = [
                e.payload
                for e in logged.values()
                if e.type == "message_edited"
                and e.stream_pos <= upto
                and row["platform_message_id"] is not None
                and e.payload.get("platform_message_id") == row["platform_message_id"]
            ]
            text = log_text(logged[row["event_id"]].payload, edits[-1] if edits else None)
            lines.append(Line(seq=row["seq"], role=row["role"], text=text))
        return lines

    def save_summary(self, record: SummaryRecord, *, archive_episode: bool) -> bool:
        r = record
        self._fail()
        ctx = self.contexts.get(r.thread_id)
        if ctx is None or r.generation < ctx.generation:
            raise StaleGeneration(r.thread_id)
        if (r.generation, r.summary_key) in self.summaries:
            return False
        self.summaries[(r.generation, r.summary_key)] = FakeSummary(next(self._ids), r, created=self.clock)
        same_episode = [
            s
            for (g, _), s in self.summaries.items()
            if g == r.generation and s.record.episode_id == r.episode_id and s.record.kind in ("running", "chunk")
        ]
        if r.kind in ("running", "chunk"):
            # Whatever order jobs finish in: only the newest running summary is active, and nothing
            # of an episode whose final summary exists.
            final_exists = (r.generation, f"{r.episode_id}:final") in self.summaries
            newest = max((s.record.upto_seq for s in same_episode if s.record.kind == "running"), default=0)
            for s in same_episode:
                if s.is_active and (final_exists or (s.record.kind == "running" and s.record.upto_seq < newest)):
                    s.is_active = False
        for key in r.source_keys:
            if (r.generation, key) in self.summaries:
                self.summaries[(r.generation, key)].is_active = False
        if archive_episode:
            for s in same_episode:
                s.is_active = False
            for (t, g, _), row in self.messages.items():
                if t == r.thread_id and g == r.generation and row["episode_id"] == r.episode_id:
                    row["is_active"] = False
            episode = self.episodes.get((r.generation, r.episode_id or ""))
            if episode is not None:
                episode["topic_label"] = r.content.get("topic_label")
        return True

    def embed_summaries(self, thread_id: str, embedder: Embedder, limit: int = 100) -> int:
        rows = sorted(
            (s for s in self.summaries.values() if s.record.thread_id == thread_id and s.embedding is None),
            key=lambda s: s.id,
        )[:limit]
        if not rows:
            return 0
        for s, v in zip(rows, embedder.embed([s.record.text for s in rows]), strict=True):
            s.embedding = v
        return len(rows)

    def _level_items(self, thread_id: str, generation: int) -> list[tuple[int, LevelItem]]:
        out = []
        for (g, key), s in self.summaries.items():
            r = s.record
            if r.thread_id != thread_id or g != generation:
                continue
            if r.kind == "final":
                episode = self.episodes.get((g, r.episode_id or ""))
                if episode is None:
                    continue  # the real query joins the episode
                index = episode["ordinal"] - 1
            elif r.kind == "rollup":
                index = int(r.content["group"])
            else:
                continue
            out.append((r.level, LevelItem(key, index, r.from_seq, r.upto_seq, r.text, s.is_active)))
        return out

    def level_indexes(self, thread_id: str, generation: int) -> dict[int, set[int]]:
        levels: dict[int, set[int]] = {}
        for level, item in self._level_items(thread_id, generation):
            levels.setdefault(level, set()).add(item.index)
        return levels

    def level_items(self, thread_id: str, generation: int, level: int, indexes: Sequence[int]) -> list[LevelItem]:
        wanted = set(indexes)
        items = [i for lv, i in self._level_items(thread_id, generation) if lv == level and i.index in wanted]
        return sorted(items, key=lambda i: i.index)


# --- facts ---------------------------------------------------------------------------------------


class FakeFactStore:
    """Facts with one active value per (user, category, key) and their history, and the ledger:
    the FactStore / CommandFacts ports with PostgresFactStore's rules. Messages, generations and
    command acks are read from `db`; command events from `events`."""

    def __init__(self, db: FakeProjections, events: FakeEventStore | None = None) -> None:
        self.db = db
        self.events = events
        self.ledger: dict[str, dict] = {}
        self.facts: list[dict] = []
        self._ids = itertools.count(1)

    def ledger_get(self, op_key: str) -> dict | None:
        return self.ledger.get(op_key)

    def ledger_put(self, op_key: str, result: dict) -> None:
        self.ledger.setdefault(op_key, dict(result))

    def job_state(self, op_key: str, thread_id: str, generation: int) -> tuple[dict | None, bool]:
        return self.ledger.get(op_key), self.db.generation_active(thread_id, generation)

    def missing_facts(self, older_than_s: float) -> list[tuple[str, int, str]]:
        """The sweeper's LostFacts port: closed episodes of active generations whose final is
        older than `older_than_s` and whose facts job left nothing in the ledger."""
        out = []
        for (gen, eid), e in sorted(self.db.episodes.items()):
            final = self.db.summaries.get((gen, f"{eid}:final"))
            ctx = self.db.contexts.get(e["thread_id"])
            if final is None or ctx is None or ctx.generation != gen or e["status"] != "closed":
                continue
            if final.created < self.db.clock - older_than_s and f"{eid}:g{gen}:facts" not in self.ledger:
                out.append((e["thread_id"], gen, eid))
        return out

    def episode_user_lines(self, thread_id: str, generation: int, episode_id: str) -> list[UserLine]:
        return [
            UserLine(row["seq"], row["event_id"], row["user_id"], row["text"])
            for row in self.db.thread_messages(thread_id, generation)
            if row["episode_id"] == episode_id and row["role"] == "user"
        ]

    def _active(self, user_id: str, category: str, key: str) -> dict | None:
        return next(
            (
                f
                for f in self.facts
                if f["user_id"] == user_id and f["category"] == category and f["key"] == key and f["is_active"]
            ),
            None,
        )

    def apply_fact(
        self,
        *,
        user_id: str,
        thread_id: str,
        generation: int,
        episode_id: str | None,
        fact: FactCandidate,
        event_ids: list[str],
        source: str,
    ) -> FactWrite:
        active = self._active(user_id, fact.category, fact.key)
        same_value = active is not None and active["value"].lower() == fact.value.lower()
        rebuilt = active is not None and active["thread_id"] == thread_id and active["generation"] < generation
        if active is not None and rebuilt and same_value:
            # Re-derived unchanged by a rebuild: the row (and its mem0 entry) moves to the new generation.
            active.update(generation=generation, episode_id=episode_id, text=fact.text)
            active["source_event_ids"] = list(event_ids)
            return FactWrite("same", active["id"], [], moved=True)
        if rebuilt:
            action = "replace"  # a rebuild of this thread supersedes its old generation
        else:
            action = resolve(fact.confidence, active["confidence"] if active else None, same_value).action
        if action in ("same", "keep_old"):
            return FactWrite(action, active["id"] if active else None, [])
        new_id = next(self._ids)
        replaced: list[tuple[int, str | None]] = []
        if active is not None:
            active.update(is_active=False, archived_reason="replaced", archived_by=str(new_id))
            replaced.append((active["id"], active["mem0_id"]))
        self.facts.append(
            {
                "id": new_id,
                "user_id": user_id,
                "thread_id": thread_id,
                "generation": generation,
                "episode_id": episode_id,
                "category": fact.category,
                "key": fact.key,
                "value": fact.value,
                "text": fact.text,
                "confidence": fact.confidence,
                "importance": fact.importance,
                "source": source,
                "source_event_ids": list(event_ids),
                "mem0_id": None,
                "is_active": True,
                "archived_reason": None,
                "archived_by": None,
            }
        )
        return FactWrite("insert" if active is None else "replace", new_id, replaced)

    def _by_id(self, fact_id: int) -> dict | None:
        return next((f for f in self.facts if f["id"] == fact_id), None)

    def set_mem0_id(self, fact_id: int, mem0_id: str) -> None:
        if (f := self._by_id(fact_id)) is not None:
            f["mem0_id"] = mem0_id

    def mem0_id_of(self, fact_id: int) -> str | None:
        f = self._by_id(fact_id)
        return f["mem0_id"] if f else None

    def forget(self, *, user_id: str, text: str, event_id: str) -> list[tuple[int, str | None]]:
        t = plain_apostrophes(text.strip().lower())  # as the SQL store compares
        out = []
        for f in self.facts:
            value, key = plain_apostrophes(f["value"].lower()), plain_apostrophes(f["key"].lower())
            if f["user_id"] == user_id and f["is_active"] and (value in t or t in value or (len(key) > 2 and key in t)):
                f.update(is_active=False, archived_reason="forgotten", archived_by=event_id)
                out.append((f["id"], f["mem0_id"]))
        return out

    def command_event(self, event_id: str) -> dict | None:
        accepted = self.events.events.get(event_id) if self.events is not None else None
        if accepted is None or accepted.event.type != "command":
            return None
        payload = accepted.event.model_dump(mode="json")
        return {
            "thread_id": accepted.event.thread_id,
            "user_id": accepted.event.user_id,
            "command": payload.get("command"),
            "args": payload.get("args"),
        }

    def set_command_detail(self, event_id: str, generation: int, detail: str) -> None:
        if (event_id, generation) in self.db.commands:
            self.db.commands[(event_id, generation)]["detail"] = detail

    def archive_rebuilt(self, thread_id: str, generation: int) -> list[tuple[int, str | None]]:
        out = []
        for f in self.facts:
            if f["thread_id"] == thread_id and f["generation"] < generation and f["is_active"]:
                f.update(is_active=False, archived_reason="rebuilt")
                out.append((f["id"], f["mem0_id"]))
        return out

    def user_facts(self, user_id: str, *, include_history: bool = False) -> list[dict]:
        rows = [f for f in self.facts if f["user_id"] == user_id and (include_history or f["is_active"])]
        return sorted(rows, key=lambda f: (f["category"], f["key"], f["id"]))


class FakeMem0:
    """mem0 as the fact jobs and recall use it: the MemoryStore port (add / find by our fact id /
    delete) and FactSearch (word-overlap search within one user). With `crash_after_add`, the next
    add stores the memory and then raises, as a worker dying before it records the id would."""

    def __init__(self) -> None:
        self.memories: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.adds = 0
        self.crash_after_add = False
        self._ids = itertools.count(1)

    def add(self, text: str, *, user_id: str, run_id: str, metadata: dict[str, Any]) -> list[str]:
        self.adds += 1
        memory_id = f"mem-{next(self._ids)}"
        self.memories[memory_id] = {
            "id": memory_id,
            "memory": text,
            "user_id": user_id,
            "run_id": run_id,
            "metadata": dict(metadata),
        }
        if self.crash_after_add:
            self.crash_after_add = False
            raise TransientError("worker lost after the mem0 write")
        return [memory_id]

    def find(self, *, user_id: str, fact_id: int) -> list[str]:
        return [
            m["id"]
            for m in self.memories.values()
            if m["user_id"] == user_id and m["metadata"].get("chatmem_fact_id") == str(int(fact_id))
        ]

    def delete(self, memory_id: str) -> None:
        if self.memories.pop(memory_id, None) is not None:
            self.deleted.append(memory_id)

    def search(self, query: str, *, user_id: str, limit: int = 5) -> list[dict]:
        words = set(_WORDS.findall(query.lower()))
        scored = []
        for m in self.memories.values():
            if m["user_id"] != user_id:
                continue
            overlap = len(words & set(_WORDS.findall(m["memory"].lower())))
            if overlap:
                scored.append({**m, "score": overlap / max(len(words), 1)})
        scored.sort(key=lambda m: (-m["score"], m["id"]))
        return scored[:limit]

    def of_user(self, user_id: str) -> list[str]:
        return sorted(m["memory"] for m in self.memories.values() if m["user_id"] == user_id)


# --- wiring --------------------------------------------------------------------------------------


# --- reading attachments -------------------------------------------------------------------------


class FakeImageReader:
    """The ImageReader port: every image is `info`, except those `others` names (BadFile for
    bytes in `corrupt`)."""

    def __init__(
        self,
        info: ImageInfo | None = None,
        corrupt: Iterable[bytes] = (),
        others: dict[bytes, ImageInfo] | None = None,
    ) -> None:
        self.info = info or ImageInfo("PNG", 640, 160, {})
        self.corrupt = set(corrupt)
        self.others = others or {}

    def inspect(self, data: bytes) -> ImageInfo:
        if data in self.corrupt:
            raise BadFile("corrupt image: cannot be decoded")
        return self.others.get(data, self.info)

    def frames(self, data: bytes, limit: int) -> list[bytes]:
        return []  # stills only


class FakeOcr:
    """The OcrEngine port: the same (line, confidence) list for any image, except those `by_image`
    names."""

    def __init__(
        self, lines: Sequence[tuple[str, float]] = (), by_image: dict[bytes, list[tuple[str, float]]] | None = None
    ) -> None:
        self.lines = list(lines)
        self.by_image = by_image or {}
        self.calls = 0

    def read(self, data: bytes) -> list[tuple[str, float]]:
        self.calls += 1
        return list(self.by_image.get(data, self.lines))


class FakeVideoReader:
    """The VideoReader port: every video shows `pictures` (PNG bytes stand-ins) at one a second;
    BadFile with `fail` when set (a video that cannot be decoded)."""

    def __init__(
        self, pictures: Sequence[bytes] = (b"picture",), info: VideoInfo | None = None, fail: str = ""
    ) -> None:
        self.pictures = list(pictures)
        self.info = info or VideoInfo(1280, 720, 42.0, "h264")
        self.fail = fail
        self.limits: list[int] = []

    def frames(self, data: bytes, limit: int) -> VideoFrames:
        self.limits.append(limit)
        if self.fail:
            raise BadFile(self.fail)
        shown = self.pictures[:limit]
        return VideoFrames(self.info, [(float(i), p) for i, p in enumerate(shown)], b"sheet" if shown else None)


class FakeVision:
    """The VisionModel port: describes an image from its OCR text; while `fail` is set, raises
    it (a provider outage)."""

    model = "fake-vision"

    def __init__(self, short: str = "an image", fail: Exception | None = None) -> None:
        self.short = short
        self.fail = fail
        self.calls: list[tuple[str, bool]] = []  # (mime, of_video)

    def describe(self, data: bytes, mime: str, ocr_text: str, *, of_video: bool = False) -> ImageDescription:
        self.calls.append((mime, of_video))
        if self.fail is not None:
            raise self.fail
        return ImageDescription(short=self.short, detail=f"{self.short} reading {ocr_text}".strip())


class FakeTranscriber:
    """The Transcriber port: `words` for any recording; while `fail` is set, raises it."""

    model = "fake-whisper"

    def __init__(self, words: str = "", fail: Exception | None = None) -> None:
        self.words = words
        self.fail = fail
        self.calls: list[tuple[bytes, str]] = []

    def transcribe(self, data: bytes, mime: str) -> str:
        self.calls.append((data, mime))
        if self.fail is not None:
            raise self.fail
        return self.words


class FakeDocumentReader:
    """The DocumentReader port: `blocks` for any document, `images` as a scan's page images and
    as the pictures of a presentation or a Word document."""

    def __init__(self, blocks: Sequence[Block] | None = None, images: Sequence[tuple[int, bytes]] = ()) -> None:
        self.blocks = (
            [Block("Title", heading=True, level=1), Block("Body text here.", page=1)]
            if blocks is None
            else list(blocks)
        )
        self.images = list(images)

    def read(self, data: bytes, mime: str) -> tuple[list[Block], dict]:
        return list(self.blocks), {"pages": max((b.page or 1 for b in self.blocks), default=0)}

    def page_images(self, data: bytes, limit: int) -> list[tuple[int, bytes]]:
        return self.images[:limit]

    def pictures(self, data: bytes, mime: str, limit: int) -> list[tuple[int | None, bytes]]:
        return list(self.images[:limit]) if mime in (PPTX_MIME, ODP_MIME, DOCX_MIME, ODT_MIME) else []


def scripted_reader(spec: object) -> Callable[[bytes, Sniffed], Extraction]:
    """A Read port for the analysis helper process (a ReaderSpec's `factory`), driven by the
    bytes: `hang` never returns, `crash` kills its own process, `oops` raises a plain error,
    `bad` is a BadFile; any other bytes become one block of text, with the helper's pid."""
    import os
    import signal

    def read(data: bytes, sniffed: Sniffed) -> Extraction:
        if data.startswith(b"hang"):
            while True:
                time.sleep(1)
        if data.startswith(b"crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if data.startswith(b"oops"):
            raise ZeroDivisionError("division by zero")
        if data.startswith(b"bad"):
            raise BadFile("scripted bad file")
        return Extraction(blocks=[Block(data.decode("utf-8", "replace"))], meta={"pid": os.getpid()})

    return read


# --- recall --------------------------------------------------------------------------------------


@dataclass
class _Turn:
    thread_id: str
    seq: int
    episode_id: str
    event_id: str
    platform_message_id: str | None
    user_id: str
    role: str
    text: str
    occurred_at: datetime
    is_active: bool
    vector: np.ndarray


class FakeRecallStore:
    """The RecallStore port over lists: lexemes are lowercase words, similarity is the cosine of
    the embedder's vectors, candidates are the union of the lexical and the dense top `limit`
    (as the SQL does). Threads are readable by the users who wrote in them."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.turns: list[_Turn] = []
        self.summaries: list[tuple[SummaryCandidate, np.ndarray]] = []
        self.facts: list[tuple[str, FoundFact]] = []  # (user_id, fact)
        self.members: dict[str, set[str]] = {}  # thread_id -> users

    def add_turn(
        self,
        thread_id: str,
        user_id: str,
        text: str,
        *,
        episode_id: str = "",
        role: str = "user",
        platform_message_id: str | None = None,
        occurred_at: datetime | None = None,
        is_active: bool = True,
    ) -> None:
        seq = 1 + sum(1 for t in self.turns if t.thread_id == thread_id)
        vector = self.embedder.embed([text])[0]
        at = occurred_at or datetime(2026, 1, 1, tzinfo=UTC)
        episode = episode_id or f"{thread_id}#1"
        event = f"{thread_id}:{seq}"
        self.turns.append(
            _Turn(thread_id, seq, episode, event, platform_message_id, user_id, role, text, at, is_active, vector)
        )
        if role == "user":
            self.members.setdefault(thread_id, set()).add(user_id)

    def add_summary(
        self,
        thread_id: str,
        text: str,
        from_seq: int,
        upto_seq: int,
        *,
        episode_id: str | None = None,
        kind: str = "final",
        level: int = 1,
    ) -> None:
        summary = SummaryCandidate(
            len(self.summaries) + 1,
            thread_id,
            episode_id or f"{thread_id}#1",
            kind,
            level,
            from_seq,
            upto_seq,
            text,
            True,
            0.0,
            (),
            len(text.split()),
        )
        self.summaries.append((summary, self.embedder.embed([text])[0]))

    def add_fact(self, user_id: str, thread_id: str, text: str, category: str = "preference") -> int:
        fact_id = len(self.facts) + 1
        citation = Citation(source="fact", thread_id=thread_id)
        self.facts.append((user_id, FoundFact(fact_id, thread_id, None, text, category, 0.0, citation)))
        return fact_id

    def session(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def readable_threads(self, user_id: str, thread_id: str | None) -> list[str]:
        mine = sorted(t for t, users in self.members.items() if user_id in users)
        return [t for t in mine if thread_id in (None, t)]

    def lexemes(self, text: str) -> list[str]:
        return sorted(set(_WORDS.findall(text.lower())))

    def _stats(self, texts: Sequence[str], lexemes: Sequence[str]) -> TermStats:
        words = [set(_WORDS.findall(t.lower())) for t in texts]
        lengths = [len(t.split()) for t in texts]
        df = tuple(sum(1 for w in words if lex in w) for lex in lexemes)
        return TermStats(len(texts), sum(lengths) / len(lengths) if lengths else 0.0, df)

    def _tf(self, text: str, lexemes: Sequence[str]) -> tuple[int, ...]:
        words = _WORDS.findall(text.lower())
        return tuple(words.count(lex) for lex in lexemes)

    def _pool(
        self,
        items: Sequence[Any],
        texts: Sequence[str],
        vectors: Sequence[np.ndarray],
        lexemes: Sequence[str],
        qvec: np.ndarray,
        limit: int,
    ) -> list[tuple[int, float]]:
        sims = [float(np.dot(v, qvec)) for v in vectors]
        lexical = [i for i, t in enumerate(texts) if any(self._tf(t, lexemes))][:limit]
        dense = sorted(range(len(items)), key=lambda i: -sims[i])[:limit]
        return [(i, sims[i]) for i in sorted(set(lexical) | set(dense))]

    def ahead(self, work: Callable[[], Any]) -> Inline[Any]:
        return Inline(work)  # in one thread: done when asked for

    def _turn(self, t: Any, sim: float, lexemes: Sequence[str]) -> TurnCandidate:
        return TurnCandidate(
            t.thread_id,
            t.seq,
            t.episode_id,
            t.event_id,
            t.platform_message_id,
            t.user_id,
            t.role,
            t.text,
            t.occurred_at,
            t.is_active,
            sim,
            self._tf(t.text, lexemes),
            len(t.text.split()),
            author_named=t.user_id.lower() in lexemes,
        )

    def turn_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, period: Period | None
    ) -> tuple[list[TurnCandidate], TermStats]:
        turns = [t for t in self.turns if t.thread_id in threads]
        texts = [t.text for t in turns]
        pool = self._pool(turns, texts, [t.vector for t in turns], lexemes, qvec, limit)
        # The period's turns join the pool as in the SQL.
        pooled = {i for i, _ in pool}
        for i, t in enumerate(turns):
            if i not in pooled and period is not None and period.first <= t.occurred_at.date() <= period.last:
                pool.append((i, float(np.dot(t.vector, qvec))))
        return [self._turn(turns[i], sim, lexemes) for i, sim in pool], self._stats(texts, lexemes)

    def hop_turns(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, hops: Hops
    ) -> list[TurnCandidate]:
        # Fact sources, as in the SQL (the fake keeps no episode vectors to rank).
        return [
            self._turn(t, float(np.dot(t.vector, qvec)), lexemes)
            for t in self.turns
            if t.thread_id in threads and t.event_id in hops.events
        ]

    def neighbours(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        by_key = {(t.thread_id, t.seq): t for t in self.turns}
        return {
            k: f"{t.user_id if t.role == 'user' else t.role}: {t.text}"
            for k in keys
            if (t := by_key.get(k)) is not None
        }

    def summary_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[SummaryCandidate], TermStats]:
        mine = [(s, v) for s, v in self.summaries if s.thread_id in threads]
        texts = [s.text for s, _ in mine]
        pool = self._pool(mine, texts, [v for _, v in mine], lexemes, qvec, limit)
        found = [mine[i][0]._replace(sim=sim, tf=self._tf(mine[i][0].text, lexemes)) for i, sim in pool]
        return found, self._stats(texts, lexemes)

    def summary_sources(self, summary: SummaryCandidate) -> list[str]:
        return [
            t.platform_message_id
            for t in self.turns
            if t.thread_id == summary.thread_id
            and summary.from_seq <= t.seq <= summary.upto_seq
            and t.platform_message_id is not None
        ]

    def fact_candidates(self, user_id: str, lexemes: Sequence[str], limit: int) -> list[FoundFact]:
        scored = [(sum(self._tf(f.text, lexemes)), f) for u, f in self.facts if u == user_id]
        return [replace(f, rank=float(n)) for n, f in sorted(scored, key=lambda x: -x[0]) if n > 0][:limit]

    def artifact_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[ArtifactCandidate], TermStats]:
        return [], TermStats(0, 0.0, tuple(0 for _ in lexemes))

    def facts_by_id(self, user_id: str, fact_ids: Sequence[int]) -> list[FoundFact]:
        return [f for u, f in self.facts if u == user_id and f.fact_id in fact_ids]


class MemoryRig:
    """The fakes wired as the container wires the real adapters: the event log, the doorbell's
    processor, the summary and fact stores, mem0 and the jobs. `publish` commits events; `drain`
    runs the doorbell for a thread; `run_jobs` runs the queued jobs (inline, as replay does)."""

    def __init__(
        self,
        *,
        policy: SummaryPolicy | None = None,
        seg_cfg: SegmenterConfig | None = None,
        fanin: int = 2,
        keep: int = 1,
        assist: AssistFactory | None = None,
    ) -> None:
        self.stream_key = "chatmem:events"
        self.events = FakeEventStore()
        self.log = FakeThreadLog(self.events, self.stream_key)
        self.doorbell = FakeDoorbell()
        self.db = FakeProjections(self.log)
        self.facts = FakeFactStore(self.db, self.events)
        self.mem0 = FakeMem0()
        self.embedder = FakeEmbedder()
        self.llm = FakeLLM()
        # No topic-shift splits unless asked: the fake vectors are not a topic model.
        self.seg_cfg = seg_cfg or SegmenterConfig(shift_threshold=-1.0)
        self.policy = policy or SummaryPolicy()
        self.jobs = Jobs(self.db, self.embedder, self.facts, self.mem0, fanin, keep)
        self.queued: list[tuple[str, int, Job]] = []
        self.processor = ThreadProcessor(
            self.db,
            self.embedder,
            self.seg_cfg,
            self.policy,
            lambda t, g, j: self.queued.append((t, g, j)),
            lambda _conn, lease, events: self.log.advance_cursor(lease, events),
            self.stream_key,
            assist=assist,
            renew_lease=self.log.renew_lease,
        )

    def publish(self, events: Sequence[Any]) -> list[str]:
        return self.events.commit(events, self.stream_key)

    def drain(self, thread_id: str, owner: str = "w1", batch_size: int = 100) -> int:
        result = advance_thread(
            self.log,
            self.doorbell,
            thread_id,
            owner=owner,
            lease_s=30,
            batch_size=batch_size,
            apply=self.processor.apply,
        )
        return result.applied

    def run_jobs(self) -> int:
        ran = 0
        while self.queued:
            thread_id, generation, job = self.queued.pop(0)
            self.jobs.run_inline(self.llm, thread_id, generation, job)
            ran += 1
        return ran
