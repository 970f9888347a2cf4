"""The events stream on Redis: consumer group reads, acks, reclaim, watermark and trimming."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

from chatmem.memory.ports import TransientError
from chatmem.schemas.records import StreamEntry, stream_id, stream_pos

EVENT_FIELD = b"event"


def _entries(raw: list) -> list[StreamEntry]:
    out = []
    for entry_id, fields in raw:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        out.append(StreamEntry(eid, None if fields is None else fields.get(EVENT_FIELD, b"")))
    return out


class RedisEventStream:
    def __init__(self, client: redis.Redis, stream_key: str, group: str):
        self.r = client
        self.key = stream_key
        self.group = group

    def ensure_group(self) -> None:
        try:
            # "0": entries published before the first consumer started are ingested too.
            self.r.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def _read(self, consumer: str, start: str, count: int, block_ms: int | None) -> list[StreamEntry]:
        try:
            reply: Any = self.r.xreadgroup(self.group, consumer, {self.key: start}, count=count, block=block_ms)
        except redis.ConnectionError as error:
            raise TransientError(str(error)) from error
        except redis.ResponseError as error:
            if "NOGROUP" in str(error):  # the stream was deleted under us: recreate, read again later
                self.ensure_group()
                return []
            raise
        return _entries(reply[0][1]) if reply else []

    def read_new(self, consumer: str, count: int, block_ms: int) -> list[StreamEntry]:
        return self._read(consumer, ">", count, block_ms)

    def read_own_pending(self, consumer: str, count: int) -> list[StreamEntry]:
        return self._read(consumer, "0", count, None)

    def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]:
        try:
            reply = self.r.xautoclaim(self.key, self.group, consumer, min_idle_ms, "0-0", count=count)
        except redis.ConnectionError as error:
            raise TransientError(str(error)) from error
        return _entries(reply[1])

    def ack(self, entry_ids: Sequence[str]) -> None:
        if entry_ids:
            try:
                self.r.xack(self.key, self.group, *entry_ids)
            except redis.ConnectionError as error:
                raise TransientError(str(error)) from error

    def committed_watermark(self) -> int:
        # One MULTI so "last delivered" and "oldest pending" describe the same instant.
        pipe = self.r.pipeline(transaction=True)
        pipe.xinfo_groups(self.key)
        pipe.xpending(self.key, self.group)
        try:
            groups, pending = pipe.execute()
        except redis.ConnectionError as error:
            raise TransientError(str(error)) from error
        last = next(g["last-delivered-id"] for g in groups if _s(g["name"]) == self.group)
        after_last = stream_pos(_s(last)) + 1
        if pending["pending"]:
            return min(stream_pos(_s(pending["min"])), after_last)
        return after_last

    def trim_below(self, pos: int) -> int:
        if pos <= 1:
            return 0
        # Approximate trimming only drops whole nodes below MINID: never an entry above it.
        return int(self.r.xtrim(self.key, minid=stream_id(pos), approximate=True))

    def length(self) -> int:
        return int(self.r.xlen(self.key))

    def pending_count(self) -> int:
        try:
            return int(self.r.xpending(self.key, self.group)["pending"])
        except redis.ResponseError:
            return 0


# A batch as one command: packing one command with N arguments costs the client far less CPU
# than N pipelined XADDs, and the script appends them in order, atomically.
_XADD_MANY_SCRIPT = """
local ids = {}
for i, payload in ipairs(ARGV) do
    ids[i] = redis.call('XADD', KEYS[1], '*', 'event', payload)
end
return ids
"""
_XADD_MANY_CHUNK = 1000


class RedisEventSink:
    """Appends events to the stream in one round trip per call; order within a call is kept."""

    def __init__(self, client: redis.Redis, stream_key: str):
        self.r = client
        self.key = stream_key
        self._xadd_many = client.register_script(_XADD_MANY_SCRIPT)

    def add_many(self, payloads: Sequence[bytes]) -> list[str]:
        if len(payloads) == 1:
            return [_s(self.r.xadd(self.key, {EVENT_FIELD: payloads[0]}))]
        ids: list[str] = []
        for i in range(0, len(payloads), _XADD_MANY_CHUNK):
            chunk = payloads[i : i + _XADD_MANY_CHUNK]
            ids.extend(_s(x) for x in self._xadd_many(keys=[self.key], args=list(chunk)))
        return ids


# Sets every dedupe key that is not set yet and returns the (1-based) indexes it set: one round
# trip and one short reply however many threads a batch touched.
_RING_SCRIPT = """
local fresh = {}
for i, key in ipairs(KEYS) do
    if redis.call('SET', key, '1', 'NX', 'EX', ARGV[1]) then fresh[#fresh + 1] = i end
end
return fresh
"""


class RedisDoorbell:
    """Dedupe with SET NX EX per thread, then enqueue the doorbell task for the new ones."""

    def __init__(self, client: redis.Redis, send: Callable[[str], None], ttl_s: int, prefix: str = "chatmem:doorbell:"):
        self.r = client
        self.send = send
        self.ttl_s = ttl_s
        self.prefix = prefix
        self._ring = client.register_script(_RING_SCRIPT)

    def ring(self, thread_ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return 0
        fresh = [ids[i - 1] for i in self._ring(keys=[self.prefix + t for t in ids], args=[self.ttl_s])]
        for tid in fresh:
            self.send(tid)
        return len(fresh)

    def clear(self, thread_id: str) -> None:
        self.r.delete(self.prefix + thread_id)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
