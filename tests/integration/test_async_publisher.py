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
