"""Publishing events: the only thing a bot calls on the write path.

- `publish(event)` returns once the event is in the Redis stream, or raises PublishError.
- `publish_nowait(event)` never blocks: the event goes to a bounded in-memory buffer that a
  background thread flushes; when Redis is unreachable (or the buffer is full) events go to a
  disk spool that is delivered, oldest first, once Redis answers again. `close()` (also run at
  exit) flushes what is left.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import redis
import redis.asyncio

from adapters.redis_stream import EVENT_FIELD, RedisEventSink
from memory.ports import EventSink
from producers.spool import Spool
from schemas.records import AnyEvent
from schemas.settings import Settings

log = logging.getLogger(__name__)

_SINK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


class PublishError(RuntimeError):
    """The event did not reach Redis; the caller still owns it."""


def serialize(event: AnyEvent) -> bytes:
    return event.model_dump_json().encode()


class Publisher:
    def __init__(
        self,
        sink: EventSink,
        spool_dir: Path,
        *,
        buffer_size: int = 10_000,
        flush_interval_s: float = 0.02,
        max_batch: int = 1000,
    ):
        self.sink = sink
        self.spool = Spool(spool_dir)
        self.buffer_size = buffer_size
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        # Serialized in the caller: the flusher then holds the GIL only briefly, which is what
        # keeps a caller from waiting on it (the caller's tail latency).
        self._buffer: deque[bytes] = deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()  # one flusher at a time (background thread or close)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._retry_at = 0.0

    @classmethod
    def from_settings(cls, settings: Settings, redis_url: str | None = None) -> Publisher:
        from adapters import services

        url = redis_url or settings.redis_url or services.resolve(settings).redis_url
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
        return cls(
            RedisEventSink(client, settings.stream_key),
            settings.resolved_spool_dir,
            buffer_size=settings.publish_buffer_size,
            flush_interval_s=settings.publish_flush_interval_ms / 1000,
        )

    # --- sync -----------------------------------------------------------------------------
    def publish(self, event: AnyEvent) -> str:
        """Append one event to the stream; return its stream id."""
        return self.publish_many([event])[0]

    def publish_many(self, events: Iterable[AnyEvent]) -> list[str]:
        payloads = [serialize(e) for e in events]
        try:
            return self.sink.add_many(payloads)
        except _SINK_ERRORS as error:
            raise PublishError(f"Redis did not take the event: {error}") from error

    # --- fire-and-forget ------------------------------------------------------------------
    def publish_nowait(self, event: AnyEvent) -> None:
        """Hand the event over and return at once; it is sent, or spooled, in the background."""
        if self._closed:
            raise PublishError("publisher is closed")
        payload = serialize(event)
        if len(self._buffer) >= self.buffer_size:
            # Full: keep the caller moving and the event safe on disk rather than drop it.
            self.spool.write([payload])
            self._wake.set()
            return
        self._buffer.append(payload)
        self._idle.clear()
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chatmem-publisher", daemon=True)
                self._thread.start()
                atexit.register(self.close)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._flush_once()

    def _flush_once(self, *, final: bool = False) -> None:
        with self._lock:
            while True:
                if not self._deliver_spool(final):
                    # Redis is away: move the buffer to disk so nothing waits in memory.
                    self._spool_buffer()
                    return
                payloads = [self._buffer.popleft() for _ in range(min(len(self._buffer), self.max_batch))]
                if not payloads:
                    self._idle.set()
                    return
                try:
                    self.sink.add_many(payloads)
                except _SINK_ERRORS as error:
                    log.warning("Redis unreachable (%s); spooling %d events", error, len(payloads))
                    self.spool.write(payloads)
                    self._retry_at = time.monotonic() + 1.0

    def _deliver_spool(self, final: bool) -> bool:
        """True when the spool is empty (delivered now or already)."""
        files = self.spool.pending_files()
        if not files:
            return True
        if not final and time.monotonic() < self._retry_at:
            return False
        try:
            sent = self.spool.deliver(self.sink)
            log.info("delivered %d spooled events", sent)
            return True
        except _SINK_ERRORS:
            self._retry_at = time.monotonic() + 1.0
            return False

    def _spool_buffer(self) -> None:
        while self._buffer:
            self.spool.write([self._buffer.popleft() for _ in range(min(len(self._buffer), self.max_batch))])
        self._idle.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the buffer is sent or spooled; True when the spool is empty too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._wake.set()
            if self._idle.wait(0.05) and not self._buffer:
                if not self.spool.pending_files():
                    return True
                self._retry_at = 0.0
                self._flush_once()
        return not self._buffer and not self.spool.pending_files()

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._flush_once(final=True)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPublisher:
    """asyncio: `await publish(event)` returns once the event is in the stream."""

    def __init__(self, client: redis.asyncio.Redis, stream_key: str):
        self.r = client
        self.key = stream_key

    @classmethod
    def from_settings(cls, settings: Settings, redis_url: str | None = None) -> AsyncPublisher:
        from adapters import services

        url = redis_url or settings.redis_url or services.resolve(settings).redis_url
        return cls(redis.asyncio.Redis.from_url(url, socket_connect_timeout=1), settings.stream_key)

    async def publish(self, event: AnyEvent) -> str:
        return (await self.publish_many([event]))[0]

    async def publish_many(self, events: Iterable[AnyEvent]) -> list[str]:
        try:
            async with self.r.pipeline(transaction=False) as pipe:
                for event in events:
                    pipe.xadd(self.key, {EVENT_FIELD: serialize(event)})
                ids = await pipe.execute()
        except _SINK_ERRORS as error:
            raise PublishError(f"Redis did not take the event: {error}") from error
        return [i.decode() if isinstance(i, bytes) else i for i in ids]

    async def aclose(self) -> None:
        await self.r.aclose()


def connect(settings: Settings | None = None) -> Publisher:
    """A publisher for the configured (or embedded) Redis."""
    from schemas.settings import load_settings

    return Publisher.from_settings(settings or load_settings())
