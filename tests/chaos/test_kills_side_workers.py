"""Case: `kill -9` of the facts worker and of the attachments worker while messages carrying
facts and images flow. Besides the pipeline's invariants: every closed episode gets its fact
extraction once, including the job the dead facts worker held unacknowledged (the sweeper queues
it again once its final summary is old), and every image is read, including the one whose
worker died mid-OCR (its claim expires and the sweeper queues it again)."""

from __future__ import annotations

import base64
import io
import json
import re
import time

import psycopg
import pytest
import redis
from PIL import Image, ImageDraw

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.schemas.events import Attachment, AttachmentKind
from tests.chaos.harness import BASE, CHAOS_SETTINGS, Load, Stack, _rows, conversation, finish
from tests.conftest import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.heavy]


def image_url(n: int) -> str:
    """A small PNG with its own text, so each is a file of its own (files are keyed by hash)."""
    img = Image.new("RGB", (260, 60), "white")
    ImageDraw.Draw(img).text((10, 20), f"TICKET {n:04d} GATE B{n % 9}", fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def facts_held(broker: redis.Redis) -> int:
    """Facts jobs delivered to a worker and not yet acknowledged (the Redis transport keeps them
    in its `unacked` hash as [message, exchange, routing key])."""
    return sum(json.loads(v)[2] == "facts" for v in broker.hvals("unacked"))


def waiting_on_ledger(c: Container) -> int:
    """Sessions blocked on the locked fact ledger: jobs that started and cannot finish."""
    return _rows(
        c,
        """SELECT count(*) FROM pg_stat_activity
           WHERE wait_event_type = 'Lock' AND query LIKE %s""",
        "%fact_ledger%",
    )[0][0]


def test_kill9_facts_and_attachments_workers(settings_factory, embedded, tmp_path):
    started = time.monotonic()
    case = "kill-side"
    # A short reading limit, so the claim of a file whose worker was killed expires in seconds,
    # and a short age for the sweeper to take a facts job for lost. No summarize worker dies here,
    # so no final summary is lost: one queued again would be a second copy of a slow one, and its
    # facts job a second copy that could finish the held job without the sweeper (a CI run saw it).
    s = settings_factory(
        **{**CHAOS_SETTINGS, "sweeper_finals_after_s": 600},
        attachment_analysis_timeout_s=5,
        sweeper_facts_after_s=5,
    )
    broker = redis.Redis.from_url(s.redis_url)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))  # type: ignore[arg-type]
    events = conversation(case, 300, 10)
    for i in range(7, len(events), 15):
        events[i] = events[i].model_copy(
            update={
                "text": f"I prefer aisle seat {i} on every flight",
                "attachments": [Attachment(url=image_url(i), kind=AttachmentKind.IMAGE)],
            }
        )
    n_images = len(range(7, len(events), 15))
    processes = {
        **BASE,
        "facts": ("worker", "--queues", "facts", "--concurrency", "1"),
        "attachments": ("worker", "--queues", "attachments", "--concurrency", "1"),
    }
    load = Load(s, events, 8)
    prefix = case + "-%"
    try:
        with Stack(s, tmp_path / "stack.log", processes) as stack:
            stack.wait_ready()
            load.start()
            load.reached(0.4)
            reading = "SELECT count(*) FROM artifacts WHERE status = 'processing'"
            assert wait_for(lambda: _rows(c, reading)[0][0] > 0, 60, 0.02), stack.tail()
            stack.kill9("attachments")  # mid-OCR: the file stays claimed by a dead worker
            load.reached(0.7)
            # The facts worker while it holds a job: the broker would hand that job out again
            # only after its visibility timeout (hours); the sweeper queues it. The ledger is
            # locked so the held job cannot finish first (a job takes a few ms; a kill that
            # landed after it was done but before its ack would prove nothing).
            with psycopg.connect(s.database_url) as hold:
                hold.execute("LOCK TABLE fact_ledger IN ACCESS EXCLUSIVE MODE")
                assert wait_for(lambda: facts_held(broker) > 0 and waiting_on_ledger(c) > 0, 60, 0.05), stack.tail()
                stack.kill9("facts", group=True)
            finish(case, "kill -9 attachments worker, facts worker", c, load, stack, started)

            def images_read() -> bool:
                rows = _rows(
                    c,
                    """SELECT count(*) FILTER (WHERE a.status = 'linked' AND ar.status = 'done'), count(*)
                       FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                       WHERE a.thread_id LIKE %s""",
                    prefix,
                )
                return rows[0] == (n_images, n_images)

            def facts_done() -> bool:
                (missing,) = _rows(
                    c,
                    """SELECT count(*) FROM episodes e WHERE e.status = 'closed' AND e.thread_id LIKE %s
                       AND NOT EXISTS (SELECT 1 FROM fact_ledger l
                                       WHERE l.op_key = e.episode_id || ':g' || e.generation || ':facts')""",
                    prefix,
                )[0]
                return missing == 0

            by_status = "SELECT status, count(*) FROM artifacts GROUP BY 1"
            assert wait_for(images_read, 120, 0.5), (_rows(c, by_status), stack.tail())
            assert wait_for(facts_done, 120, 0.5), stack.tail()
            # The held job came back through the sweeper, not the broker.
            assert re.search(r"and [1-9]\d* fact jobs", (tmp_path / "stack.log").read_text(encoding="utf-8")), (
                stack.tail()
            )
            # Each image read into one artifact (a second claimant would have failed on the key),
            # and the facts the messages state were written.
            assert _rows(c, "SELECT count(*) FROM artifacts")[0][0] == n_images
            assert _rows(c, "SELECT count(*) FROM facts WHERE user_id = 'u'")[0][0] > 0
    finally:
        broker.close()
        c.close()
