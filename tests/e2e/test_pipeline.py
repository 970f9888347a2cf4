"""End to end: publisher -> Redis -> ingest consumer -> Postgres -> doorbell handled by a real
Celery worker process; then what `chatmem status --json` and `chatmem publish` report."""

import json
import subprocess
import sys

import pytest

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from tests.conftest import ROOT, scalar, settings_env, spawn, status_json, stop, wait_for

pytestmark = pytest.mark.e2e


def test_publish_to_applied_through_a_real_worker(container):
    s = container.settings
    ingest = spawn(s, "ingest")
    worker = spawn(s, "worker", "--queues", "segment", "--concurrency", "2")
    try:
        with Publisher.from_settings(s) as pub:
            for i in range(200):
                pub.publish_nowait(MessageEvent(event_id=f"e{i}", thread_id=f"t{i % 7}", user_id="u", text=f"m{i}"))
        done = lambda: scalar(container, "SELECT coalesce(sum(applied_events), 0) FROM threads") == 200  # noqa: E731
        assert wait_for(done, timeout=90), stop(worker)[-3000:]
        lag = scalar(
            container,
            "SELECT count(*) FROM events e JOIN threads t USING (thread_id) WHERE e.stream_pos > t.cursor_pos",
        )
        assert lag == 0
        report = status_json(s)
        assert report["counts"]["events"] == 200 and report["counts"]["threads"] == 7
        assert report["lag"]["max_events"] == 0
        assert set(report["queues"]) == {"segment", "summarize", "facts", "attachments", "maintenance"}
    finally:
        stop(ingest)
        stop(worker)


def test_publish_command_reports_accepted_and_rejected_lines(container, tmp_path):
    lines = [
        json.dumps({"type": "message", "event_id": "a", "thread_id": "t", "user_id": "u", "text": "hi"}),
        "{broken",
        json.dumps({"type": "message", "event_id": "b", "thread_id": "t", "text": "no user"}),
        json.dumps({"type": "message", "event_id": "c", "thread_id": "t", "user_id": "u", "text": "ok"}),
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "chatmem.api.cli", "publish", str(path)],
        env=settings_env(container.settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1  # some lines were rejected
    assert "accepted 2, rejected 2" in out.stdout
    assert "line 2: malformed JSON" in out.stdout and "line 3: user_id: field required" in out.stdout
    assert container.stream.length() == 2
