"""End to end with JSON logs: ingest, a worker and the API as real processes sharing one metrics
folder. After the run, the API's /metrics (parsed with prometheus_client's parser) equals what
`chatmem status --json` reports, counts the work the other processes recorded, and every process
logged JSON lines carrying the ids of what it worked on."""

import json
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from tests.conftest import scalar, spawn, status_json, stop, wait_for
from tests.unit.test_observability import exported_series

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, v) in ls for k, v in labels.items()))


def test_metrics_equal_status_after_a_run(settings_factory):
    port = _free_port()
    s = settings_factory(log_format="json", api_port=port)
    url = f"http://127.0.0.1:{port}"
    procs = {
        "ingest": spawn(s, "ingest"),
        "worker": spawn(s, "worker", "--queues", "all", "--concurrency", "2"),
        "api": spawn(s, "api"),
    }
    try:
        with Publisher.from_settings(s) as pub:
            for i in range(60):
                pub.publish_nowait(
                    MessageEvent(event_id=f"e{i}", thread_id=f"t{i % 3}", user_id="u", text=f"message number {i}")
                )
        import redis

        from chatmem.adapters.redis_stream import RedisEventSink

        RedisEventSink(redis.Redis.from_url(s.redis_url), s.stream_key).add_many(
            [b"{broken", json.dumps({"type": "message", "event_id": "x", "thread_id": "t0", "text": "?"}).encode()]
        )
        from chatmem.adapters.services import ServiceUrls
        from chatmem.bootstrap import Container

        c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
        try:
            applied = lambda: scalar(c, "SELECT coalesce(sum(applied_events), 0) FROM threads") == 60  # noqa: E731
            assert wait_for(applied, timeout=120), stop(procs["worker"])[-3000:]
            dead = lambda: scalar(c, "SELECT count(*) FROM dead_letters") == 2  # noqa: E731
            assert wait_for(dead, timeout=30)

            def idle() -> bool:  # every queued summary done, so both reads see the same state
                try:
                    samples = _scrape(url)
                except httpx.HTTPError:
                    return False
                return _total(samples, "chatmem_queue_depth") == 0 and _total(samples, "chatmem_stream_pending") == 0

            assert wait_for(idle, timeout=120, interval=0.5), stop(procs["api"])[-3000:]
        finally:
            c.close()

        samples = _scrape(url)
        report = status_json(s)

        # The shared state: equal to the status report.
        assert samples[("chatmem_state_up", ())] == 1
        assert _total(samples, "chatmem_events_ingested_total") == report["counts"]["events"] == 60
        assert _total(samples, "chatmem_dead_letters_total") == report["counts"]["dead_letters"] == 2
        assert samples[("chatmem_dead_letters_total", (("reason", "malformed_json"),))] == 1
        assert samples[("chatmem_dead_letters_total", (("reason", "invalid_user_id"),))] == 1
        assert samples[("chatmem_stream_pending", ())] == report["stream"]["pending"]
        for queue, depth in report["queues"].items():
            assert samples[("chatmem_queue_depth", (("queue", queue),))] == depth
        assert samples[("chatmem_thread_lag_events_max", ())] == report["lag"]["max_events"] == 0
        assert samples[("chatmem_thread_lag_events_gcount", ())] == report["counts"]["threads"] == 3

        # What the other processes recorded reaches the API's /metrics through the folder.
        assert _total(samples, "chatmem_ingest_batch_seconds_count") >= 1  # ingest
        # Pool processes: doorbell tasks, for one thread or for threads rung together.
        doorbells = sum(
            _total(samples, "chatmem_task_duration_seconds_count", task=t)
            for t in ("advance_thread", "advance_threads")
        )
        assert doorbells >= 1
        assert _total(samples, "chatmem_task_duration_seconds_count", task="summarize") >= 1
        assert _total(samples, "chatmem_embed_seconds_count") >= 1
        assert _total(samples, "chatmem_llm_calls_total", outcome="ok") >= 1  # the offline LLM summarised
        assert _total(samples, "chatmem_task_failures_total") == 0
        assert {name for name, _ in samples if name.startswith("chatmem_")} <= exported_series() | {
            n.removesuffix("_total") + "_created" for n in exported_series()
        }
    finally:
        outputs = {name: stop(p) for name, p in procs.items()}

    # JSON logs: every line of every process is one JSON object; a task's lines carry its ids.
    lines = {name: [ln for ln in out.splitlines() if ln.strip()] for name, out in outputs.items()}
    for name, out in lines.items():
        bad = [ln for ln in out if not ln.startswith("{")]
        assert not bad, f"{name}: {bad[:5]}"
        parsed = [json.loads(ln) for ln in out]
        assert all({"ts", "level", "logger", "message"} <= set(p) for p in parsed)
    assert any(json.loads(ln)["logger"].startswith("chatmem.workers.ingest") for ln in lines["ingest"])
    worker = [json.loads(ln) for ln in lines["worker"]]
    assert any(p.get("thread_id") in ("t0", "t1", "t2") for p in worker), lines["worker"][-20:]
    assert any("episode_id" in p for p in worker)
