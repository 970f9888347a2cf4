"""The API's /metrics in one process (no multiprocess folder): the shared state read from the
stores and the read path's timings."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatmem.api.client import ChatmemClient
from tests.integration.test_http_api import server  # noqa: F401 - the shared fixture
from tests.integration.test_read_path import memory  # noqa: F401 - the fixture behind it

pytestmark = pytest.mark.integration


def _samples(url: str) -> dict[str, float]:
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples if not s.labels}


def test_metrics_count_the_read_path_and_read_the_log(server):  # noqa: F811
    url, keys, c = server
    before = _samples(url)
    with ChatmemClient(url, keys["alice"]) as client:
        client.context(thread_id="garden", user_id="alice", query="locker code")
        client.recall(user_id="alice", query="locker code")
        client.recall(user_id="alice", query="shed colour")
    after = _samples(url)
    assert after["chatmem_context_seconds_count"] - before.get("chatmem_context_seconds_count", 0) == 1
    assert after["chatmem_recall_seconds_count"] - before.get("chatmem_recall_seconds_count", 0) == 2
    assert after["chatmem_state_up"] == 1
    with c.pool.connection() as conn:
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    assert after["chatmem_events_ingested_total"] == events > 0
