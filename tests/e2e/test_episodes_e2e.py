"""Episodes and summaries through real processes: an ingest consumer, two segment workers racing
on the same thread and a summarize worker."""

import pytest

from chatmem.producers.publisher import Publisher
from tests.conftest import scalar, spawn, stop, wait_for
from tests.scripted import EXPECTED_EPISODES, EXPECTED_STARTS, script_events

pytestmark = pytest.mark.e2e


def test_scripted_conversation_through_real_workers(container):
    s = container.settings
    procs = [
        spawn(s, "ingest", ingest_batch_size=3),  # small batches: many doorbells for one thread
        spawn(s, "worker", "--queues", "segment", "--concurrency", "2"),
        spawn(s, "worker", "--queues", "segment", "--concurrency", "1"),
        spawn(s, "worker", "--queues", "summarize", "--concurrency", "1"),
        spawn(s, "worker", "--queues", "facts", "--concurrency", "1"),
    ]
    try:
        with Publisher.from_settings(s) as pub:
            for event in script_events():
                pub.publish_nowait(event)
        closed = len(EXPECTED_EPISODES) - 1
        finals = lambda: scalar(container, "SELECT count(*) FROM summaries WHERE kind = 'final'") == closed  # noqa: E731
        assert wait_for(finals, timeout=180), stop(procs[1])[-3000:]
        facts_done = lambda: scalar(container, "SELECT count(*) FROM fact_ledger") == closed  # noqa: E731 (one per episode)
        assert wait_for(facts_done, timeout=120), stop(procs[4])[-3000:]
    finally:
        outputs = [stop(p) for p in procs]
    with container.pool.connection() as conn:
        rows = conn.execute("SELECT seq, event_id FROM messages ORDER BY seq").fetchall()
        starts = dict(conn.execute("SELECT start_seq, opened_by FROM episodes").fetchall())
        dup_keys = conn.execute("SELECT count(*) - count(DISTINCT summary_key) FROM summaries").fetchone()[0]
    assert [r[1] for r in rows] == [f"script-{i}" for i in range(1, 17)], outputs[1][-2000:]
    assert starts == EXPECTED_STARTS
    assert dup_keys == 0
    prefs = [f["value"] for f in container.fact_store.user_facts("alex")]
    assert prefs == ["morning departures"]  # "I prefer morning departures and direct flights ..." in episode 1
