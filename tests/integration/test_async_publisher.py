import asyncio
import threading

import pytest

from chatmem.producers.publisher import AsyncPublisher
from chatmem.schemas.events import MessageEvent
from chatmem.workers.ingest import IngestRunner
from tests.conftest import scalar

pytestmark = pytest.mark.integration


def test_async_publish_reaches_the_log_in_order(container):
    async def main():
        pub = AsyncPublisher.from_settings(container.settings)
        first = await pub.publish(MessageEvent(event_id="a0", thread_id="t", user_id="u", text="first"))
        rest = await pub.publish_many(
            [MessageEvent(event_id=f"a{i}", thread_id="t", user_id="u", text=f"m{i}") for i in range(1, 20)]
        )
        await pub.aclose()
        return [first, *rest]

    ids = asyncio.run(main())
    assert len(ids) == 20 and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    with container.pool.connection() as conn:
        got = [r[0] for r in conn.execute("SELECT event_id FROM events ORDER BY stream_pos")]
    assert got == [f"a{i}" for i in range(20)]
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0


def test_a_bulk_publisher_marks_its_entries_and_their_threads_ring_at_bulk_priority(container):
    from chatmem.producers.publisher import Publisher

    s = container.settings
    with Publisher.from_settings(s, bulk=True) as pub:
        pub.publish_many([MessageEvent(event_id=f"b{i}", thread_id="old", user_id="u", text="x") for i in range(3)])
        pub.publish_nowait(MessageEvent(event_id="b3", thread_id="old", user_id="u", text="through the flusher"))
    with Publisher.from_settings(s) as pub:
        pub.publish(MessageEvent(event_id="l0", thread_id="new", user_id="u", text="live"))
    fields = [f for _, f in container.redis.xrange(s.stream_key)]
    assert [f.get(b"priority") for f in fields] == [b"bulk"] * 4 + [None]
    sent: list[tuple[str, bool]] = []
    container.doorbell.send = lambda tid, bulk: sent.append((tid, bulk))
    container.doorbell.send_group = lambda tids: sent.extend((t, False) for t in tids)  # live threads
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert sorted(sent) == [("new", False), ("old", True)]
    assert container.doorbell.is_bulk("old") and not container.doorbell.is_bulk("new")
