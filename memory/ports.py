"""Ports: the interfaces the domain logic needs. Each has a real adapter in `adapters/` and a
hand-written in-memory fake in `tests/fakes.py` for unit tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import numpy as np
from pydantic import BaseModel

from chatmem.memory.prompts import Prompt
from chatmem.schemas.records import AcceptedEvent, DeadLetter, LoggedEvent, StoreResult, StreamEntry, ThreadLease

T = TypeVar("T", bound=BaseModel)


class TransientError(Exception):
    """A failure worth retrying (a service briefly unreachable); anything else is not."""


class LLMRefused(Exception):
    """The LLM endpoint refused the request (a bad key, an unknown model, a request it does not
    serve): another attempt will not fix it. Whoever can do without the model does."""


class EventStream(Protocol):
    """The consumer side of the events stream (a Redis stream with a consumer group)."""

    def ensure_group(self) -> None: ...

    def read_new(self, consumer: str, count: int, block_ms: int) -> list[StreamEntry]: ...

    def read_own_pending(self, consumer: str, count: int) -> list[StreamEntry]: ...

    def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]: ...

    def ack(self, entry_ids: Sequence[str]) -> None: ...

    def committed_watermark(self) -> int:
        """stream_pos below which every entry has been acknowledged (so committed)."""
        ...

    def trim_below(self, pos: int) -> int: ...


class EventSink(Protocol):
    """The producer side: append serialized events to the stream, in order."""

    def add_many(self, payloads: Sequence[bytes]) -> list[str]: ...


class EventStore(Protocol):
    """The append-only event log and the ingest bookkeeping around it."""

    def store_batch(self, events: Sequence[AcceptedEvent], dead: Sequence[DeadLetter]) -> StoreResult: ...

    def advance_watermark(self, stream_key: str, watermark: int) -> list[str]:
        """Raise the watermark; return the threads with events that just became final."""
        ...


class ThreadLog(Protocol):
    """Per-thread, in-order access to the log for the doorbell."""

    def acquire_lease(self, thread_id: str, owner: str, lease_s: int) -> ThreadLease | None:
        """The lease, or None while another worker holds it; UnknownThread if there is no thread."""
        ...

    def release_lease(self, thread_id: str, owner: str) -> None: ...

    def renew_lease(self, lease: ThreadLease) -> None: ...

    def pending_events(self, thread_id: str, after_pos: int, limit: int) -> list[LoggedEvent]: ...

    def first_pending(self, thread_ids: Sequence[str], limit: int) -> dict[str, list[LoggedEvent]]:
        """Each thread's next `limit` events after its cursor, read without a lease: only for
        work that is safe to repeat (embedding ahead into the shared cache)."""
        ...

    def advance_cursor(self, lease: ThreadLease, events: Sequence[LoggedEvent]) -> ThreadLease:
        """Move the cursor past `events` if the lease still holds; raise LeaseLost otherwise."""
        ...

    def lagging_threads(self, limit: int) -> list[str]: ...


class Doorbell(Protocol):
    """Rings the per-thread doorbell task, at most once while one is pending."""

    def ring(self, thread_ids: Iterable[str]) -> int:
        """Queue the doorbell of each thread not already rung; threads classified as bulk are
        queued at bulk priority. Returns how many were queued."""
        ...

    def clear(self, thread_id: str) -> None: ...

    def classify(self, *, bulk: Iterable[str], live: Iterable[str]) -> None:
        """Threads fed by an import become bulk; a live event makes a thread live again."""
        ...


class UnknownThread(Exception):
    """No event of this thread was ever committed (a stray or forged doorbell)."""


class LeaseLost(Exception):
    """Another worker took the thread over; this one must stop without applying."""


class Embedder(Protocol):
    """Text -> unit-normalised vectors (rows), batched."""

    @property
    def model(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class PairEncoder(Protocol):
    """The segmenter's pair model (memory/boundary_pair.py): its logit of a topic shift at the
    candidate, given the turns before it, its trained head applied."""

    def logit(self, context: str, candidate: str) -> float: ...

    def for_thread(self, thread_id: str) -> PairEncoder:
        """The same model, its answers kept under this thread (a cache erasure can find)."""
        ...


def concrete(embedder: Embedder) -> Embedder:
    """The one embedder to use for a batch: an embedder that switches models (a re-embedding)
    names the one in use now, so the vectors and the model recorded with them agree."""
    current = getattr(embedder, "current", None)
    return current() if callable(current) else embedder


class LLM(Protocol):
    """Structured completion: a versioned prompt in, a validated pydantic model out."""

    model: str

    def complete(self, prompt: Prompt, response_model: type[T]) -> T: ...
