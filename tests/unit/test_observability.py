"""Metrics, the dashboard and the Prometheus config (parsed: there is no docker here), JSON logs.

The dashboard may only query series the code exports; the Prometheus config must scrape the
services and ports compose runs."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from chatmem.adapters import metrics
from chatmem.adapters.logs import JsonFormatter, configure_logging, is_utf8, log_context
from chatmem.schemas.queues import Queue
from chatmem.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
DASHBOARD = INFRA / "grafana" / "dashboards" / "chatmem.json"
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def _state(**kw) -> metrics.SharedState:
    base = {
        "events": 12,
        "dead_letters": {"malformed_json": 2, "invalid_user_id": 1},
        "stream_pending": 3,
        "queue_depths": {q.value: i for i, q in enumerate(Queue)},
        "thread_lags": [5, 250],
        "threads": 4,
    }
    return metrics.SharedState(**(base | kw))


def exported_series() -> set[str]:
    """Every series name chatmem's code can export: the recorded instruments and the shared state."""
    families = [
        f for field in fields(metrics.Instruments) for f in getattr(metrics.instruments(), field.name).describe()
    ]
    families += list(metrics.SharedStateCollector(_state).collect())
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_spec_metrics_are_exported():
    series = exported_series()
    for name in (
        "chatmem_events_ingested_total",
        "chatmem_dead_letters_total",
        "chatmem_stream_pending",
        "chatmem_thread_lag_events_max",
        "chatmem_thread_lag_events_bucket",
        "chatmem_queue_depth",
        "chatmem_task_duration_seconds_bucket",
        "chatmem_task_failures_total",
        "chatmem_thread_apply_failures_total",
        "chatmem_llm_calls_total",
        "chatmem_llm_tokens_total",
        "chatmem_embed_seconds_bucket",
        "chatmem_attachments_total",
        "chatmem_context_seconds_bucket",
        "chatmem_recall_seconds_bucket",
    ):
        assert name in series


def test_every_series_the_dashboard_queries_is_exported():
    used = {name for expr in _queries() for name in re.findall(r"\bchatmem_[a-z0-9_]+", expr)}
    assert {"chatmem_events_ingested_total", "chatmem_queue_depth", "chatmem_llm_tokens_total"} <= used
    assert used <= exported_series(), used - exported_series()


def test_the_dashboard_is_valid_grafana_json_over_the_provisioned_datasource():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    source = yaml.safe_load(
        (INFRA / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )
    uid = source["datasources"][0]["uid"]
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    titles = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] == "row":
            continue
        titles.add(panel["title"])
        assert panel["datasource"]["uid"] == uid and panel["targets"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), expr
            for var in re.findall(r"\$([a-z_]+)", expr):  # dashboard variables, or Grafana's own
                assert var in variables or var.startswith("__"), var
    # What the issue asks the dashboard to show.
    for wanted in ("Ingest rate", "Thread lag", "Queue depths", "Task latency p95", "Dead letters", "LLM cost"):
        assert any(t.startswith(wanted) for t in titles), wanted
    provider = yaml.safe_load(
        (INFRA / "grafana" / "provisioning" / "dashboards" / "chatmem.yml").read_text(encoding="utf-8")
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_prometheus_scrapes_what_compose_runs():
    prom = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text(encoding="utf-8"))
    services = compose["services"]
    env = compose["x-chatmem"]["environment"]
    port = int(env["CHATMEM_METRICS_PORT"])
    assert env["CHATMEM_METRICS_HOST"] == "0.0.0.0"
    assert not env["CHATMEM_METRICS_DIR"].startswith("/data")  # never the volume containers share
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert prom["global"]["scrape_interval"]
    assert jobs["chatmem-api"]["static_configs"][0]["targets"] == [f"api:{Settings().api_port}"]
    assert "8765:8765" in services["api"]["ports"]
    scraped = set()
    for job in jobs.values():
        for sd in job.get("dns_sd_configs", []):
            assert sd["port"] == port and sd["type"] == "A"
            scraped |= set(sd["names"])
    chatmem_services = {
        name for name, s in services.items() if s.get("image") == "chatmem:latest" and name not in ("api", "migrate")
    }
    assert scraped == chatmem_services
    assert {f"worker-{q.value}" for q in Queue} <= scraped
    # The files compose mounts are the ones in the repository.
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (INFRA / source).exists(), source
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]


def test_shared_state_exposition_parses_with_lag_histogram_over_all_threads():
    text = metrics.exposition(metrics.SharedStateCollector(_state)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("chatmem_events_ingested_total", ())] == 12
    assert samples[("chatmem_dead_letters_total", (("reason", "malformed_json"),))] == 2
    assert samples[("chatmem_stream_pending", ())] == 3
    assert samples[("chatmem_queue_depth", (("queue", "facts"),))] == 2
    assert samples[("chatmem_thread_lag_events_max", ())] == 250
    assert samples[("chatmem_thread_lag_events_bucket", (("le", "0.0"),))] == 2  # two threads are not lagging
    assert samples[("chatmem_thread_lag_events_bucket", (("le", "10.0"),))] == 3
    assert samples[("chatmem_thread_lag_events_bucket", (("le", "+Inf"),))] == 4
    assert samples[("chatmem_thread_lag_events_gcount", ())] == 4
    assert samples[("chatmem_state_up", ())] == 1


def test_a_scrape_answers_when_the_stores_do_not():
    def down() -> metrics.SharedState:
        raise ConnectionError("postgres is down")

    families = {
        f.name: f
        for f in text_string_to_metric_families(metrics.exposition(metrics.SharedStateCollector(down)).decode())
    }
    assert families["chatmem_state_up"].samples[0].value == 0
    assert "chatmem_events_ingested" not in families


def test_the_multiprocess_folder_must_be_chosen_before_anything_is_recorded(tmp_path):
    metrics.instruments()
    with pytest.raises(RuntimeError, match="before"):
        metrics.use_multiprocess_dir(tmp_path / "m")


def _record(msg: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord("chatmem.test", logging.INFO, __file__, 1, msg, (), None)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_json_log_lines_carry_the_ids_in_context_and_extra():
    fmt = JsonFormatter()
    plain = json.loads(fmt.format(_record("hello")))
    assert plain["message"] == "hello" and plain["level"] == "INFO" and "thread_id" not in plain
    with log_context(thread_id="t1", episode_id="t1#2"):
        line = json.loads(fmt.format(_record("summarised", event_id="e9")))
    assert (line["thread_id"], line["episode_id"], line["event_id"]) == ("t1", "t1#2", "e9")
    assert "thread_id" not in json.loads(fmt.format(_record("after")))  # the context ended
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = _record("failed")
        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(fmt.format(record))["exception"]
    with pytest.raises(ValueError, match="unknown ids"):
        with log_context(user_id="u"):
            pass


def test_json_log_lines_stay_json_on_a_stream_that_is_not_utf8(monkeypatch):
    # A machine set to ISO-8859-1 gives stderr that encoding, and Python escapes what it cannot
    # hold as \U0001f600, which is not JSON: there the lines use JSON's own escapes.
    import io
    import sys

    latin1 = io.TextIOWrapper(io.BytesIO(), encoding="iso-8859-1", errors="backslashreplace")
    assert not is_utf8(latin1) and is_utf8(io.TextIOWrapper(io.BytesIO(), encoding="UTF8")) and not is_utf8(object())
    monkeypatch.setattr(sys, "stderr", latin1)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    try:
        configure_logging("INFO", "json")
        logging.getLogger("chatmem.test").info("Café for Маша 😀")
    finally:
        logging.captureWarnings(False)
    latin1.flush()
    (line,) = latin1.buffer.getvalue().decode("ascii").splitlines()
    assert json.loads(line)["message"] == "Café for Маша 😀"
    assert json.loads(JsonFormatter().format(_record("Маша")))["message"] == "Маша"  # UTF-8 as itself


def test_instruments_built_once_when_threads_ask_at_the_same_time():
    """Replay rebuilds two threads at once; both may record the first metric together."""
    import subprocess
    import sys

    # A fresh interpreter: this one has built its instruments already. The slowed Histogram
    # widens the window in which a second builder would start.
    script = """
import threading, time
from chatmem.adapters import metrics
real = metrics.Histogram
def slow(*a, **kw):
    time.sleep(0.05)
    return real(*a, **kw)
metrics.Histogram = slow
errors, gate = [], threading.Barrier(4)
def ask():
    gate.wait()
    try:
        metrics.instruments()
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=ask) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
raise SystemExit(1 if errors else 0)
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
