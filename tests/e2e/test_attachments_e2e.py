"""Attachments through real processes: ingest, a segment worker and a separate attachments
worker (real Celery, real OCR). Messages are projected while the attachments queue works."""

import json

import pytest

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment
from chatmem.schemas.read import Scope
from tests.conftest import scalar, spawn, stop, wait_for
from tests.e2e.test_read_e2e import cli
from tests.integration.test_attachments import TICKET, message, put, text_image

pytestmark = pytest.mark.e2e


def test_an_image_sent_by_a_bot_is_ocrd_by_the_attachments_worker_and_recalled(container, tmp_path):
    s = container.settings
    url = put(tmp_path, "ticket.png", text_image(TICKET))
    procs = [
        spawn(s, "ingest"),
        spawn(s, "worker", "--queues", "segment,summarize", "--concurrency", "1"),
        spawn(
            s,
            "worker",
            "--queues",
            "attachments",
            "--concurrency",
            "1",
            attachment_max_retries="1",
            attachment_retry_backoff_s="0.2",
        ),
    ]
    try:
        Publisher(container.sink, s.resolved_spool_dir).publish_many(
            [
                message("trip", "alice", 1, "my boarding pass", [Attachment(url=url, kind="image")]),
                message("trip", "alice", 2, "and the hotel is near the river"),
                message("trip", "alice", 3, "a link", [Attachment(url="https://files.invalid/map.png")]),
            ]
        )
        done = lambda: scalar(container, "SELECT count(*) FROM artifacts WHERE status = 'done'") == 1  # noqa: E731
        assert wait_for(done, timeout=120), stop(procs[2])[-3000:]
        assert scalar(container, "SELECT count(*) FROM messages WHERE thread_id = 'trip'") == 3
        # An unreachable URL is retried by Celery (once here), then fails with the last error.
        failed = lambda: scalar(container, "SELECT count(*) FROM attachments WHERE status = 'failed'") == 1  # noqa: E731
        assert wait_for(failed, timeout=60), stop(procs[2])[-3000:]
        reason = scalar(container, "SELECT reason FROM attachments WHERE event_id = 'trip-3'")
        assert reason.startswith("gave up after retries: cannot resolve files.invalid")
    finally:
        for p in procs:
            stop(p)
    assert "Lisbon" in scalar(container, "SELECT text FROM messages WHERE event_id = 'trip-1'")
    hit = container.recall("alice", "gate of my flight", scope=Scope.ARTIFACTS).hits[0]
    assert hit.citation.event_id == "trip-1" and "B17" in hit.snippet
    listed = cli(s, "attachments", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    statuses = {(r["event_id"], r["status"]) for r in json.loads(listed.stdout)}
    assert statuses == {("trip-1", "done"), ("trip-3", "failed")}
    retried = cli(s, "attachments", "retry")
    assert retried.returncode == 0 and "queued 1 attachments again" in retried.stdout
