"""The ingest consumer process: reads the events stream as one consumer of the group.

Its own pending entries (read before a crash or a failed commit) are processed first, then new
ones; entries idle too long in a dead consumer are claimed and processed like its own."""

from __future__ import annotations

import logging
import threading
import time

from adapters.bootstrap import TRANSIENT_ERRORS, Container, process_name
from memory.ingest import IngestLimits, IngestService

log = logging.getLogger(__name__)


class IngestRunner:
    def __init__(self, container: Container, consumer: str | None = None):
        s = container.settings
        self.settings = s
        self.stream = container.stream
        self.consumer = consumer or process_name("ingest")
        self.service = IngestService(
            container.stream,
            container.store,
            container.doorbell,
            stream_key=s.stream_key,
            limits=IngestLimits(s.max_text_chars, s.max_data_uri_bytes),
        )

    def run(self, stop: threading.Event, *, until_idle: bool = False) -> None:
        """Consume until `stop` is set (or, with until_idle, until nothing is left to read)."""
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
                now = time.monotonic()
                if now >= next_claim:
                    next_claim = now + claim_every
                    if self.stream.claim_stale(self.consumer, s.ingest_claim_idle_ms, s.ingest_batch_size):
                        own_backlog = True  # claimed entries are now ours: read them below
                read_new = not own_backlog
                if own_backlog:
                    entries = self.stream.read_own_pending(self.consumer, s.ingest_batch_size)
                    own_backlog = bool(entries)
                else:
                    entries = self.stream.read_new(self.consumer, s.ingest_batch_size, s.ingest_block_ms)
                if entries:
                    self.service.process(entries)
                else:
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
        log.info("ingest consumer %s stopped: %s", self.consumer, self.service.stats)
