import json

from adapters.fakes import FakeSink
from producers.publisher import Publisher, PublishError
from schemas.events import MessageEvent


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
    pub = Publisher(sink, tmp_path, flush_interval_s=0.005)
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
    sink.down = True
    pub = Publisher(sink, tmp_path, buffer_size=3, flush_interval_s=10)
    for i in range(10):
        pub.publish_nowait(ev(i))
    pub.close()  # Redis still down: what was buffered is spooled too
    assert pub.spool.pending_count() == 10
    sink.down = False
    later = Publisher(sink, tmp_path)
    assert later.flush(5)  # a later publisher (a restarted bot) delivers the spool
    assert sorted(ids(sink)) == sorted(f"e{i}" for i in range(10))


def test_close_flushes_the_buffer(tmp_path):
    sink = FakeSink()
    pub = Publisher(sink, tmp_path, flush_interval_s=60)
    for i in range(100):
        pub.publish_nowait(ev(i))
    pub.close()
    assert ids(sink) == [f"e{i}" for i in range(100)]
