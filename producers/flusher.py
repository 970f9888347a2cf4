"""The fire-and-forget flusher: reads length-prefixed events from a pipe, appends them to the
stream in batches, spools them to disk while Redis is away and delivers the spool (oldest
first) before anything newer. It reports how many events it has handled (sent, spooled, or
refused by a full spool) on
an ack pipe, so the publisher can wait for a flush.

It runs as a child process of the bot (so it never competes with the bot for the GIL, and
what was handed over survives a crash of the bot), or on a thread for unit tests."""

from __future__ import annotations

import argparse
import logging
import os
import select
import struct
import time

from chatmem.memory.ports import EventSink
from chatmem.producers.spool import Spool

log = logging.getLogger(__name__)

FRAME = struct.Struct("!I")
ACK = struct.Struct("!Q")
SINK_ERRORS = (ConnectionError, TimeoutError, OSError)


def sink_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (*SINK_ERRORS, redis.ConnectionError, redis.TimeoutError)


class Flusher:
    def __init__(self, sink: EventSink, spool: Spool, read_fd: int, ack_fd: int, *, max_batch: int = 1000):
        self.sink = sink
        self.spool = spool
        self.read_fd = read_fd
        self.ack_fd = ack_fd
        self.max_batch = max_batch
        self.handled = 0
        self._acked = -1
        self._retry_at = 0.0
        self._errors = sink_errors()
        os.set_blocking(ack_fd, False)

    def run(self) -> None:
        buf = bytearray()
        eof = False
        while not eof:
            readable, _, _ = select.select([self.read_fd], [], [], 0.1)
            if readable:
                chunk = os.read(self.read_fd, 1 << 20)
                eof = not chunk
                buf += chunk
            payloads = _take_frames(buf)
            for i in range(0, len(payloads), self.max_batch):
                self._send(payloads[i : i + self.max_batch], final=eof)
            if not payloads and self.spool.pending_files():
                self._deliver_spool(final=eof)
            self._ack()
        self._deliver_spool(final=True)
        self._ack()

    def _send(self, payloads: list[bytes], *, final: bool) -> None:
        # A full spool would refuse the batch: try Redis now rather than at the next retry, so
        # nothing is refused in the second after Redis came back.
        if self._deliver_spool(final=final or not self.spool.fits(payloads)):
            try:
                self.sink.add_many(payloads)
            except self._errors as error:
                log.warning("Redis unreachable (%s); %d events to the spool", error, len(payloads))
                self.spool.write(payloads)
                self._retry_at = time.monotonic() + 1.0
        else:
            self.spool.write(payloads)  # keep order: newer events queue behind the spool
        self.handled += len(payloads)

    def _deliver_spool(self, *, final: bool) -> bool:
        """True when the spool is empty (delivered now or already)."""
        if not self.spool.pending_files():
            return True
        if not final and time.monotonic() < self._retry_at:
            return False
        try:
            sent = self.spool.deliver(self.sink)
            log.info("delivered %d spooled events", sent)
            return True
        except self._errors:
            self._retry_at = time.monotonic() + 1.0
            return False

    def _ack(self) -> None:
        # The publisher reads only the latest count; an ack that does not fit now is sent on a
        # later turn of the loop (every 0.1 s at most), so a flush never waits forever.
        if self._acked == self.handled:
            return
        try:
            os.write(self.ack_fd, ACK.pack(self.handled))
            self._acked = self.handled
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self._acked = self.handled  # the publisher is gone; nobody is waiting


def _take_frames(buf: bytearray) -> list[bytes]:
    out = []
    pos = 0
    while len(buf) - pos >= FRAME.size:
        (size,) = FRAME.unpack_from(buf, pos)
        if len(buf) - pos - FRAME.size < size:
            break
        start = pos + FRAME.size
        out.append(bytes(buf[start : start + size]))
        pos = start + size
    del buf[:pos]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="chatmem fire-and-forget flusher (started by the publisher)")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--stream-key", required=True)
    parser.add_argument("--spool-dir", required=True)
    parser.add_argument("--spool-max-bytes", type=int, default=None)
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--ack-fd", type=int, required=True)
    parser.add_argument("--bulk", action="store_true", help="mark entries as bulk (importers)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s chatmem-flusher %(message)s")

    import redis

    from chatmem.adapters.redis_stream import RedisEventSink

    client = redis.Redis.from_url(args.redis_url, socket_connect_timeout=1, socket_timeout=5)
    sink = RedisEventSink(client, args.stream_key, bulk=args.bulk)
    Flusher(sink, Spool(args.spool_dir, args.spool_max_bytes), args.read_fd, args.ack_fd).run()


if __name__ == "__main__":
    main()
