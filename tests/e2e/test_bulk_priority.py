"""A bulk import does not hold back live threads: imported events go through the same log, but
their threads' doorbells wait behind live ones and yield the worker between slices."""

from datetime import UTC, datetime, timedelta

import pytest

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from tests.conftest import scalar, spawn, stop, wait_for

pytestmark = pytest.mark.e2e

TOPICS = ["hiking boots", "sourdough bread", "tax forms", "piano lessons", "bike repair", "garden tomatoes"]


def imported(thread: int, n: int) -> list[MessageEvent]:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    return [
        MessageEvent(
            event_id=f"import-{thread}-{i}",
            thread_id=f"imported-{thread}",
            user_id="carol",
            text=f"Message {i} about {TOPICS[(i // 40) % len(TOPICS)]}, note {i * 7 % 13}.",
            occurred_at=start + timedelta(minutes=i),
        )
        for i in range(n)
    ]


def lag(container, prefix: str) -> int:
    return scalar(
        container,
        """SELECT count(*) FROM events e JOIN threads t USING (thread_id)
           WHERE e.thread_id LIKE %s AND e.stream_pos > t.cursor_pos""",
        prefix + "%",
    )


def test_a_live_message_is_applied_while_an_import_is_still_being_processed(container):
    s = container.settings
    slices = {"apply_batch_size": "40", "bulk_batches_per_task": "1"}
    procs = [spawn(s, "ingest"), spawn(s, "worker", "--queues", "segment", "--concurrency", "1", **slices)]
    try:
        events = [e for t in range(4) for e in imported(t, 300)]
        with Publisher.from_settings(s, bulk=True) as pub:
            pub.publish_many(events)
        stored = lambda: scalar(container, "SELECT count(*) FROM events") == len(events)  # noqa: E731
        assert wait_for(stored, timeout=60), stop(procs[0])[-3000:]
        started = lambda: scalar(container, "SELECT count(*) FROM messages") > 0  # noqa: E731
        assert wait_for(started, timeout=120), stop(procs[1])[-3000:]
        live = MessageEvent(event_id="live-1", thread_id="live-chat", user_id="dave", text="Is the shop open today?")
        with Publisher.from_settings(s) as pub:
            pub.publish(live)
        applied = lambda: scalar(container, "SELECT count(*) FROM messages WHERE event_id = 'live-1'") == 1  # noqa: E731
        assert wait_for(applied, timeout=120, interval=0.02), stop(procs[1])[-3000:]
        # First in, first out would have drained all four imported threads before the live one.
        waiting = lag(container, "imported-")
        assert waiting >= len(events) // 2, f"only {waiting} imported events were still waiting"
        done = lambda: lag(container, "imported-") == 0  # noqa: E731
        assert wait_for(done, timeout=300), stop(procs[1])[-3000:]
    finally:
        for p in procs:
            stop(p)
    assert scalar(container, "SELECT count(*) FROM messages") == len(events) + 1
