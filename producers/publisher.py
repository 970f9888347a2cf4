"""Publishing events: the only thing a bot calls on the write path.

- `publish(event)` returns once the event is in the Redis stream, or raises PublishError.
- `publish_nowait(event)` never blocks: the event is written to a bounded pipe read by a
  flusher process (see producers/flusher.py) that sends batches; when Redis is unreachable, or
  the pipe is full, events go to a disk spool that is delivered, oldest first, once Redis
  answers again. `close()` (also run at exit) flushes what is left. A full spool
  (CHATMEM_SPOOL_MAX_BYTES) keeps what it holds and refuses newer events: they are counted
  (`refused`), logged without content, and the call still returns at once.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio

from chatmem.adapters.redis_stream import EVENT_FIELD, RedisEventSink
from chatmem.memory.ports import EventSink
from chatmem.producers.flusher import ACK, FRAME, Flusher
from chatmem.producers.spool import Spool, SpoolAppender
from chatmem.schemas.records import AnyEvent
from chatmem.schemas.settings import Settings

log = logging.getLogger(__name__)

_SINK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# An overflow episode (pipe full) appends to one spool file for at most this long / many
# events, then the pipe is tried again.
_OVERFLOW_S = 0.05
_OVERFLOW_EVENTS = 5000


class PublishError(RuntimeError):
    """The event did not reach Redis; the caller still owns it."""


def serialize(event: AnyEvent) -> bytes:
    return event.model_dump_json().encode()


class _ThreadFlusher:
    """Runs the flusher on a thread of this process (unit tests, fakes)."""

    def __init__(self, sink: EventSink):
        self.sink = sink

    def __call__(self, read_fd: int, ack_fd: int, spool: Spool) -> _FlusherHandle:
        flusher = Flusher(self.sink, Spool(spool.dir, spool.max_bytes), read_fd, ack_fd)

        def run() -> None:
            try:
                flusher.run()
            finally:
                os.close(read_fd)
                os.close(ack_fd)

        thread = threading.Thread(target=run, name="chatmem-flusher", daemon=True)
        thread.start()
        return _FlusherHandle(thread.join, thread.is_alive)


class _ProcessFlusher:
    """Runs the flusher as a child process: no GIL shared with the bot's threads."""

    def __init__(self, redis_url: str, stream_key: str, bulk: bool = False):
        self.redis_url = redis_url
        self.stream_key = stream_key
        self.bulk = bulk

    def __call__(self, read_fd: int, ack_fd: int, spool: Spool) -> _FlusherHandle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chatmem.producers.flusher",
                "--redis-url",
                self.redis_url,
                "--stream-key",
                self.stream_key,
                "--spool-dir",
                str(spool.dir),
                *(["--spool-max-bytes", str(spool.max_bytes)] if spool.max_bytes is not None else []),
                "--read-fd",
                str(read_fd),
                "--ack-fd",
                str(ack_fd),
                *(["--bulk"] if self.bulk else []),
            ],
            pass_fds=(read_fd, ack_fd),
            start_new_session=True,  # a Ctrl-C meant for the bot must not cut the final flush
        )
        os.close(read_fd)
        os.close(ack_fd)

        def join(timeout: float | None) -> None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("flusher %d still running after %.0fs; it finishes on its own", proc.pid, timeout)

        return _FlusherHandle(join, lambda: proc.poll() is None)


@dataclass(frozen=True)
class _FlusherHandle:
    join: Callable[[float | None], None]
    alive: Callable[[], bool]


class Publisher:
    def __init__(
        self,
        sink: EventSink,
        spool_dir: Path,
        *,
        buffer_bytes: int = 1 << 20,
        spool_max_bytes: int | None = None,
        flusher: Callable[[int, int, Spool], _FlusherHandle] | None = None,
    ):
        self.sink = sink
        self.spool = Spool(spool_dir, spool_max_bytes)
        self.buffer_bytes = buffer_bytes
        self._launch = flusher or _ThreadFlusher(sink)
        self._pid: int | None = None
        self._wfd = -1
        self._ack_fd = -1
        self._handle: _FlusherHandle | None = None
        self._sent = 0
        self._acked = 0
        self._closed = False
        self._overflow: SpoolAppender | None = None

    @classmethod
    def from_settings(cls, settings: Settings, redis_url: str | None = None, *, bulk: bool = False) -> Publisher:
        """`bulk=True` for importers: the events go through the same log, but their threads are
        processed after live ones (a spool of its own keeps them bulk if Redis was away)."""
        from chatmem.adapters import services

        url = redis_url or settings.redis_url or services.resolve(settings).redis_url
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
        spool = settings.resolved_spool_dir / "bulk" if bulk else settings.resolved_spool_dir
        return cls(
            RedisEventSink(client, settings.stream_key, bulk=bulk),
            spool,
            buffer_bytes=settings.publish_buffer_bytes,
            spool_max_bytes=settings.spool_max_bytes,
            flusher=_ProcessFlusher(url, settings.stream_key, bulk),
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
        """Hand the event over and return at once; it is sent, or spooled, by the flusher."""
        if self._closed:
            raise PublishError("publisher is closed")
        if self._pid != os.getpid():
            self._start()  # first use, or a forked child: each process has its own flusher
        payload = serialize(event)
        if self._overflow is not None:
            if self._overflow.count < _OVERFLOW_EVENTS and time.monotonic() - self._overflow.opened < _OVERFLOW_S:
                self._overflow.append(payload)
                return
            self._end_overflow()  # before the pipe gets anything newer: order is kept
        frame = FRAME.pack(len(payload)) + payload
        try:
            written = os.write(self._wfd, frame)
        except BlockingIOError:
            written = 0
        except BrokenPipeError:
            log.warning("flusher exited; spooling and starting a new one")
            self.spool.write([payload])
            self._start()
            return
        if written == 0:
            # Buffer full (the flusher is far behind): to disk, and the caller moves on.
            self._overflow = self.spool.appender()
            self._overflow.append(payload)
            return
        if written < len(frame):
            self._write_rest(memoryview(frame)[written:])  # rare: a frame must never be torn
        self._sent += 1

    def _end_overflow(self) -> None:
        if self._overflow is not None:
            self._overflow.close()
            self._overflow = None

    def _write_rest(self, rest: memoryview) -> None:
        while rest:
            select.select([], [self._wfd], [])
            try:
                rest = rest[os.write(self._wfd, rest) :]
            except BlockingIOError:
                continue

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        ack_read, ack_write = os.pipe()
        try:
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, self.buffer_bytes)
        except OSError:
            pass  # above the system's pipe-max-size: the default size still works
        os.set_blocking(write_fd, False)
        os.set_blocking(ack_read, False)
        self._wfd, self._ack_fd = write_fd, ack_read
        self._sent = self._acked = 0
        self._handle = self._launch(read_fd, ack_write, self.spool)
        if self._pid is None:
            atexit.register(self.close)
        self._pid = os.getpid()

    def _read_acks(self) -> None:
        try:
            data = os.read(self._ack_fd, 1 << 16)
        except BlockingIOError:
            return
        usable = len(data) - len(data) % ACK.size
        if usable:
            (self._acked,) = ACK.unpack_from(data, usable - ACK.size)

    @property
    def refused(self) -> int:
        """Events refused because the spool was full (every publisher on this spool folder, ever)."""
        return self.spool.refused_count()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything handed over is sent (True) or still spooled at the timeout."""
        deadline = time.monotonic() + timeout
        self._end_overflow()
        while True:
            if self._pid == os.getpid():
                self._read_acks()
            if self._acked >= self._sent and not self.spool.holds_events():
                return True
            if time.monotonic() >= deadline:
                return False
            if self._pid != os.getpid() and self.spool.pending_files():
                self._start()  # a spool left by an earlier run: let a flusher deliver it
            time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> None:
        """Flush and stop the flusher (also run at exit)."""
        if self._closed:
            return
        self._closed = True
        self._end_overflow()
        if self._pid != os.getpid() or self._handle is None:
            return
        os.close(self._wfd)  # end of input: the flusher sends what is left, then exits
        self._handle.join(timeout)
        self._read_acks()
        os.close(self._ack_fd)

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
        from chatmem.adapters import services

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
    from chatmem.schemas.settings import load_settings

    return Publisher.from_settings(settings or load_settings())
