import json
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
    from chatmem.producers.spool import Spool

    spool = Spool(tmp_path)
    spool.write([json.dumps({"user_id": u, "n": i}).encode() for i, u in enumerate(["a", "b", "a"])])
    spool.write([json.dumps({"user_id": "a", "n": 3}).encode()])
    dropped = spool.erase(lambda raw: json.loads(raw)["user_id"] == "a")
    assert dropped == 3
    sink = FakeSink()
    assert spool.deliver(sink) == 1
    assert [json.loads(p) for p in sink.payloads] == [{"user_id": "b", "n": 1}]
    assert list(tmp_path.iterdir()) == []  # the emptied file is gone, nothing is left half-written
