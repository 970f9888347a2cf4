"""The ingest consumer process: reads the events stream as one consumer of the group.

Its own pending entries (read before a crash or a failed commit) are processed first, then new
ones; entries idle too long in a dead consumer are claimed and processed like its own.

Reading and validating a batch overlaps with committing the previous one: a single writer
thread commits batches in the order they were read, and each batch is acknowledged only after
its own commit, so the invariants of IngestService hold unchanged."""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from typing import Protocol

from chatmem.adapters.errors import TRANSIENT_ERRORS
from chatmem.adapters.metrics import instruments, timed
from chatmem.adapters.procs import process_name
from chatmem.memory.ingest import IngestLimits, IngestService, PreparedBatch
from chatmem.memory.ports import Doorbell, EventStore, EventStream
from chatmem.schemas.settings import Settings

log = logging.getLogger(__name__)

_DONE = object()


class _Writer:
    """Commits prepared batches in order on its own thread; remembers the first failure."""

    def __init__(self, service: IngestService):
        self.service = service
        self.queue: queue.Queue = queue.Queue(maxsize=1)  # one batch in flight ahead of the reader
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not _DONE:
            if self.error is None:
                try:
                    with timed(instruments().ingest_batch_seconds):
                        self.service.commit(item)
                except BaseException as error:  # handed to the reader thread, which decides
                    self.error = error
            self.queue.task_done()
        self.queue.task_done()

    def submit(self, batch: PreparedBatch) -> None:
        self.queue.put(batch)

    def drain(self) -> None:
        """Wait for every submitted batch; re-raise the first failure (and forget it)."""
        self.queue.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        self.queue.put(_DONE)
        self.thread.join()


class IngestWiring(Protocol):
    """What an ingest consumer uses; the composition root's Container provides it."""

    @property
    def settings(self) -> Settings: ...
    @property
    def stream(self) -> EventStream: ...
    @property
    def store(self) -> EventStore: ...
    @property
    def doorbell(self) -> Doorbell: ...


class IngestRunner:
    def __init__(self, container: IngestWiring, consumer: str | None = None):
        s = container.settings
        self.settings = s
        self.stream = container.stream
        self.consumer = consumer or process_name("ingest")
        self.service = IngestService(
            container.stream,
            container.store,
            container.doorbell,
            stream_key=s.stream_key,
            limits=IngestLimits(s.max_text_chars, s.max_data_uri_bytes, s.max_future_skew_s, s.min_occurred_at),
        )

    def run(self, stop: threading.Event, *, until_idle: bool = False) -> None:
        """Consume until `stop` is set (or, with until_idle, until nothing is left to read)."""
        # Each batch allocates thousands of short-lived objects and few cycles: collecting
        # every 700 allocations costs a sizeable share of ingest CPU for nothing.
        gc.set_threshold(50_000, 20, 20)
        writer = _Writer(self.service)
        try:
            self._loop(stop, writer, until_idle)
        finally:
            try:
                writer.drain()
            except TRANSIENT_ERRORS as error:
                log.warning("ingest: last batch not committed (%s); it stays pending", error)
            writer.close()
        log.info("ingest consumer %s stopped: %s", self.consumer, self.service.stats)

    def _loop(self, stop: threading.Event, writer: _Writer, until_idle: bool) -> None:
        s = self.settings
        self.stream.ensure_group()
        own_backlog = True
        backoff = 0.1
        claim_every = max(0.5, s.ingest_claim_idle_ms / 2000)
        next_claim = time.monotonic()
        next_trim = time.monotonic() + s.ingest_trim_every_s
        log.info("ingest consumer %s reading %s", self.consumer, s.stream_key)
        while not stop.is_set():
            try:
                if writer.error is not None:
                    writer.drain()  # raises the writer's failure here
                now = time.monotonic()
                if now >= next_claim:
                    next_claim = now + claim_every
                    if self.stream.claim_stale(self.consumer, s.ingest_claim_idle_ms, s.ingest_batch_size):
                        writer.drain()
                        own_backlog = True  # claimed entries are now ours: read them below
                read_new = not own_backlog
                if own_backlog:
                    # Our pending list includes batches still being committed: wait for them.
                    writer.drain()
                    entries = self.stream.read_own_pending(self.consumer, s.ingest_batch_size)
                    own_backlog = bool(entries)
                    if entries:
                        with timed(instruments().ingest_batch_seconds):
                            self.service.process(entries)
                        continue
                else:
                    entries = self.stream.read_new(self.consumer, s.ingest_batch_size, s.ingest_block_ms)
                    if entries:
                        writer.submit(self.service.prepare(entries))
                if not entries:
                    writer.drain()
                    self.service.refresh_watermark()
                    if until_idle and read_new:
                        return
                if now >= next_trim:
                    next_trim = now + s.ingest_trim_every_s
                    self.service.trim()
                backoff = 0.1
            except TRANSIENT_ERRORS as error:
                log.warning("ingest: %s; retrying in %.1fs", error, backoff)
                own_backlog = True  # whatever was read stays pending for us: read it again
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
