import json
import os
import time

from chatmem.producers.flusher import FRAME, _take_frames
from chatmem.producers.publisher import Publisher, PublishError
from chatmem.schemas.events import MessageEvent
from tests.fakes import FakeSink


def ev(i):
    return MessageEvent(event_id=f"e{i}", thread_id="t", user_id="u", text=f"m{i}")


def ids(sink):
    return [json.loads(p)["event_id"] for p in sink.payloads]


def test_sync_publish_returns_the_stream_id_or_raises(tmp_path):
    sink = FakeSink()
    pub = Publisher(sink, tmp_path)
    assert pub.publish(ev(1)) == "1-0"
    sink.down = True
    try:
        pub.publish(ev(2))
        raise AssertionError("expected PublishError")
    except PublishError as error:
        assert "did not take" in str(error)


def test_fire_and_forget_spools_while_down_and_delivers_in_order(tmp_path):
    sink = FakeSink()
    pub = Publisher(sink, tmp_path)
    for i in range(5):
        pub.publish_nowait(ev(i))
    assert pub.flush(5)
    sink.down = True
    for i in range(5, 10):
        pub.publish_nowait(ev(i))
    assert not pub.flush(0.3)  # cannot finish while Redis is away...
    assert pub.spool.pending_count() == 5  # ...but nothing waits in memory
    sink.down = False
    for i in range(10, 12):
        pub.publish_nowait(ev(i))
    assert pub.flush(5)
    pub.close()
    assert ids(sink) == [f"e{i}" for i in range(12)]


def test_full_buffer_spills_to_disk_without_blocking(tmp_path):
    sink = FakeSink()
    sink.gate.clear()  # Redis hangs: the flusher is stuck in its first send
    pub = Publisher(sink, tmp_path, buffer_bytes=4096)
    started = time.monotonic()
    for i in range(300):
        pub.publish_nowait(ev(i))
    assert time.monotonic() - started < 2.0  # the caller never waited on the stuck flusher
    assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # the overflow went to disk
    sink.gate.set()
    assert pub.flush(10)
    pub.close()
    assert sorted(ids(sink)) == sorted(f"e{i}" for i in range(300))


def test_close_flushes_everything_handed_over(tmp_path):
    sink = FakeSink()
    pub = Publisher(sink, tmp_path)
    for i in range(100):
        pub.publish_nowait(ev(i))
    pub.close()
    assert ids(sink) == [f"e{i}" for i in range(100)]
    try:
        pub.publish_nowait(ev(101))
        raise AssertionError("expected PublishError")
    except PublishError:
        pass


def test_spool_left_by_an_earlier_run_is_delivered(tmp_path):
    sink = FakeSink()
    sink.down = True
    first = Publisher(sink, tmp_path)
    for i in range(10):
        first.publish_nowait(ev(i))
    first.close()
    assert first.spool.pending_count() == 10
    sink.down = False
    later = Publisher(sink, tmp_path)  # a restarted bot
    assert later.flush(5)
    later.close()
    assert ids(sink) == [f"e{i}" for i in range(10)]


def test_frames_split_across_reads_are_reassembled():
    payloads = [b"a" * 5, b"", b"xyz" * 100]
    stream = b"".join(FRAME.pack(len(p)) + p for p in payloads)
    buf, got = bytearray(), []
    for i in range(0, len(stream), 7):
        buf += stream[i : i + 7]
        got += _take_frames(buf)
    assert got == payloads and not buf


def test_spool_erase_drops_only_the_matching_events_and_keeps_the_order(tmp_path):
    from chatmem.producers.spool import RENAME_LOCK, Spool

    spool = Spool(tmp_path)
    spool.write([json.dumps({"user_id": u, "n": i}).encode() for i, u in enumerate(["a", "b", "a"])])
    spool.write([json.dumps({"user_id": "a", "n": 3}).encode()])
    dropped = spool.erase(lambda raw: json.loads(raw)["user_id"] == "a")
    assert dropped == 3
    sink = FakeSink()
    assert spool.deliver(sink) == 1
    assert [json.loads(p) for p in sink.payloads] == [{"user_id": "b", "n": 1}]
    # The emptied file is gone, nothing is left half-written (the lock file holds no events).
    assert [p.name for p in tmp_path.iterdir()] in ([], [RENAME_LOCK])


def _spooled_ids(spool):
    return [json.loads(line)["event_id"] for p in spool.pending_files() for line in p.read_bytes().splitlines()]


def test_a_full_spool_keeps_what_it_holds_and_refuses_newer_events(tmp_path, caplog):
    sink = FakeSink()
    sink.down = True
    limit = 4096
    pub = Publisher(sink, tmp_path, spool_max_bytes=limit)
    started = time.monotonic()
    for i in range(100):
        pub.publish_nowait(MessageEvent(event_id=f"e{i}", thread_id="t", user_id="u", text=f"private words {i}"))
    assert time.monotonic() - started < 1.0  # the bot never waits on a full spool
    assert not pub.flush(0.5)  # Redis is away: the spool is not delivered...
    spooled = _spooled_ids(pub.spool)
    assert 0 < len(spooled) < 100 and pub.spool.used_bytes() <= limit
    assert spooled == [f"e{i}" for i in range(len(spooled))]  # the oldest are kept, in order
    assert pub.refused == 100 - len(spooled)  # ...and every event not spooled is counted
    full = [r for r in caplog.records if "spool full" in r.getMessage()]
    assert full and full[0].levelname == "ERROR"
    assert not any("private words" in r.getMessage() for r in caplog.records)  # no content in the log
    sink.down = False
    for i in range(100, 110):
        pub.publish_nowait(ev(i))
    assert pub.flush(5)
    pub.close()
    # What was spooled is delivered once, before anything newer; the refused ones are gone.
    assert ids(sink) == spooled + [f"e{i}" for i in range(100, 110)]
    assert pub.refused == 100 - len(spooled) and pub.spool.used_bytes() == 0


def test_a_full_spool_refuses_the_overflow_of_a_stuck_flusher_without_blocking(tmp_path):
    sink = FakeSink()
    sink.gate.clear()  # Redis hangs: the pipe fills and events overflow to the spool
    pub = Publisher(sink, tmp_path, buffer_bytes=4096, spool_max_bytes=8192)
    started = time.monotonic()
    for i in range(400):
        pub.publish_nowait(ev(i))
    assert time.monotonic() - started < 2.0
    sink.gate.set()
    assert pub.flush(10)
    pub.close()
    delivered = ids(sink)
    assert len(delivered) == len(set(delivered))  # nothing twice
    assert pub.refused > 0 and len(delivered) + pub.refused == 400  # nothing else missing


def test_the_spool_writes_the_prefix_that_fits_and_counts_the_rest(tmp_path):
    from chatmem.producers.spool import Spool

    spool = Spool(tmp_path, max_bytes=4096)
    line = b"x" * 999  # 1000 bytes with its newline
    spool.write([line] * 3)
    spool.write([line] * 3)  # one more fits, two do not
    assert spool.pending_count() == 4 and spool.used_bytes() == 4000
    assert spool.refused_count() == 2
    assert Spool(tmp_path).refused_count() == 2  # what status and /metrics read
    sink = FakeSink()
    assert spool.deliver(sink) == 4 and spool.used_bytes() == 0
    spool.write([line])  # room again once delivered
    assert spool.pending_count() == 1 and spool.refused_count() == 2


def test_a_disk_full_before_the_limit_refuses_like_a_full_spool(tmp_path, monkeypatch):
    import errno
    import os

    from chatmem.producers import spool as spool_module

    spool = spool_module.Spool(tmp_path, max_bytes=1 << 20)
    spool.write([b"kept"])

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_module.os, "fsync", no_space)
    assert spool.write([b"a", b"b"]) is None  # no exception reaches the bot or the flusher
    assert spool.refused_count() == 2
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # no torn file left to deliver
    monkeypatch.setattr(spool_module.os, "fsync", os.fsync)
    sink = FakeSink()
    assert spool.deliver(sink) == 1 and sink.payloads == [b"kept"]


def test_the_spool_is_its_users_alone_since_it_holds_events_in_clear(tmp_path):
    from chatmem.producers.spool import REFUSED_FILE, Spool

    spool = Spool(tmp_path / "spool", max_bytes=1500)
    spool.write([b"x" * 999])
    out = spool.appender()
    out.append(b"y" * 10)
    out.close()
    spool.write([b"z" * 999])  # refused: the count file is written too
    files = [*spool.pending_files(), spool.dir / REFUSED_FILE]
    assert len(files) == 3
    assert [f.stat().st_mode & 0o777 for f in files] == [0o600] * 3
    assert spool.dir.stat().st_mode & 0o077 == 0


def test_flush_is_not_done_while_a_spool_file_is_out_for_delivery(tmp_path):
    # A delivery in flight renames its file; if Redis refuses, the file comes back. Until then the
    # events are neither sent nor waiting in the spool's list, and flush must not say "sent".
    pub = Publisher(FakeSink(), tmp_path)
    in_flight = tmp_path / f".claimed-{os.getpid()}-spool-0001.jsonl"
    in_flight.write_bytes(b'{"event_id": "e1"}\n')
    assert pub.spool.pending_files() == []
    assert pub.flush(timeout=0.2) is False
    in_flight.unlink()
    assert pub.flush(timeout=0.2) is True
    pub.close()
