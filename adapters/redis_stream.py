"""The events stream on Redis: consumer group reads, acks, reclaim, watermark and trimming."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

from chatmem.memory.ports import TransientError
from chatmem.schemas.records import StreamEntry, stream_id, stream_pos

EVENT_FIELD = b"event"
# Entries published by importers carry `priority bulk`: transport, not content, so the event
# in the log is the same however it arrived.
PRIORITY_FIELD = b"priority"
BULK = b"bulk"


def _entries(raw: list) -> list[StreamEntry]:
    out = []
    for entry_id, fields in raw:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        if fields is None:
            out.append(StreamEntry(eid, None))
        else:
            out.append(StreamEntry(eid, fields.get(EVENT_FIELD, b""), fields.get(PRIORITY_FIELD) == BULK))
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

    def erase(self, matches: Callable[[bytes], bool], page: int = 1000) -> int:
        """Delete the entries still in the stream whose event `matches` selects (erasure), read
        or not: ingest skips a deleted entry, and its pending acknowledgement goes with it."""
        dropped, start = 0, "-"
        while True:
            entries = _entries(self.r.xrange(self.key, min=start, max="+", count=page) or [])
            if not entries:
                return dropped
            doomed = [e.entry_id for e in entries if e.payload is not None and matches(e.payload)]
            if doomed:
                self.r.xdel(self.key, *doomed)
                try:
                    self.r.xack(self.key, self.group, *doomed)
                except redis.ResponseError:
                    pass  # no consumer group yet
                dropped += len(doomed)
            start = "(" + entries[-1].entry_id

    def pending_count(self) -> int:
        try:
            return int(self.r.xpending(self.key, self.group)["pending"])
        except redis.ResponseError:
            return 0


# A batch as one command: packing one command with N arguments costs the client far less CPU
# than N pipelined XADDs, and the script appends them in order, atomically.
_XADD_MANY_SCRIPT = """
local ids = {}
local priority = ARGV[1]
for i = 2, #ARGV do
    if priority == '' then
        ids[i - 1] = redis.call('XADD', KEYS[1], '*', 'event', ARGV[i])
    else
        ids[i - 1] = redis.call('XADD', KEYS[1], '*', 'event', ARGV[i], 'priority', priority)
    end
end
return ids
"""
_XADD_MANY_CHUNK = 1000


class RedisEventSink:
    """Appends events to the stream in one round trip per call; order within a call is kept.
    A bulk sink (importers) marks its entries so their threads are processed after live ones."""

    def __init__(self, client: redis.Redis, stream_key: str, *, bulk: bool = False):
        self.r = client
        self.key = stream_key
        self.bulk = bulk
        self._xadd_many = client.register_script(_XADD_MANY_SCRIPT)

    def add_many(self, payloads: Sequence[bytes]) -> list[str]:
        if len(payloads) == 1:
            fields = {EVENT_FIELD: payloads[0], **({PRIORITY_FIELD: BULK} if self.bulk else {})}
            return [_s(self.r.xadd(self.key, fields))]  # type: ignore[arg-type]
        ids: list[str] = []
        priority = BULK if self.bulk else b""
        for i in range(0, len(payloads), _XADD_MANY_CHUNK):
            chunk = payloads[i : i + _XADD_MANY_CHUNK]
            ids.extend(_s(x) for x in self._xadd_many(keys=[self.key], args=[priority, *chunk]))
        return ids


# Sets every dedupe key that is not set yet and returns the (1-based) indexes it set, negated
# for bulk threads: one round trip and one short reply however many threads a batch touched.
# ARGV[2] is the bulk set's key; thread ids follow from ARGV[3].
_RING_SCRIPT = """
local fresh = {}
for i, key in ipairs(KEYS) do
    if redis.call('SET', key, '1', 'NX', 'EX', ARGV[1]) then
        if redis.call('SISMEMBER', ARGV[2], ARGV[i + 2]) == 1 then
            fresh[#fresh + 1] = -i
        else
            fresh[#fresh + 1] = i
        end
    end
end
return fresh
"""


def split_evenly(items: list[str], most: int) -> list[list[str]]:
    """Fewest groups of at most `most`, their sizes differing by at most one (so two pool
    processes get similar work)."""
    if not items:
        return []
    n = -(-len(items) // most)
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return out


class RedisDoorbell:
    """Dedupe with SET NX EX per thread, then enqueue the doorbell task for the new ones; threads
    in the bulk set (fed by imports) are enqueued at bulk priority."""

    def __init__(
        self,
        client: redis.Redis,
        send: Callable[[str, bool], None],
        ttl_s: int,
        prefix: str = "chatmem:doorbell:",
        bulk_key: str = "chatmem:bulk_threads",
        send_group: Callable[[list[str]], None] | None = None,
        group_size: int = 1,
    ):
        self.r = client
        self.send = send
        self.send_group = send_group
        self.group_size = group_size
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.bulk_key = bulk_key
        self._ring = client.register_script(_RING_SCRIPT)

    def ring(self, thread_ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return 0
        keys = [self.prefix + t for t in ids]
        fresh = self._ring(keys=keys, args=[self.ttl_s, self.bulk_key, *ids])
        # The script numbers the threads it rang from 1, negative for the bulk ones.
        for i in fresh:
            if i < 0:
                self.send(ids[-i - 1], True)
        live = [ids[i - 1] for i in fresh if i > 0]
        if self.send_group is None:
            for tid in live:
                self.send(tid, False)
        else:
            for group in split_evenly(live, self.group_size):
                self.send_group(group)
        return len(fresh)

    def clear(self, thread_id: str) -> None:
        self.r.delete(self.prefix + thread_id)

    def classify(self, *, bulk: Iterable[str], live: Iterable[str]) -> None:
        bulk, live = list(bulk), list(live)
        if not (bulk or live):
            return
        pipe = self.r.pipeline(transaction=False)
        if bulk:
            pipe.sadd(self.bulk_key, *bulk)
        if live:
            pipe.srem(self.bulk_key, *live)
        pipe.execute()

    def is_bulk(self, thread_id: str) -> bool:
        return bool(self.r.sismember(self.bulk_key, thread_id))


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
