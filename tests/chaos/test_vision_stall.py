"""Case: the vision endpoint stalls (accepts each request, answers nothing) while messages with
images flow. Each try ends at the timeout, the job retries with backoff and its last attempt
describes the image offline. Messages are never held up by it, nothing is lost, and the images
all end up read."""

from __future__ import annotations

import time

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.schemas.events import Attachment, AttachmentKind
from tests.chaos.harness import BASE, CHAOS_SETTINGS, Load, Stack, _rows, conversation, finish
from tests.chaos.test_kills_side_workers import image_url
from tests.chaos.test_llm_faults import FlakyOpenAI, flaky_endpoint
from tests.conftest import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.heavy]


def test_vision_endpoint_stalls_while_images_arrive(settings_factory, embedded, tmp_path, monkeypatch):
    started = time.monotonic()
    asked: list[float] = []
    stalling = FlakyOpenAI.do_POST

    def counted(handler):  # noqa: ANN001
        asked.append(time.monotonic())
        stalling(handler)

    monkeypatch.setattr(FlakyOpenAI, "do_POST", counted)
    case = "vision-stall"
    events = conversation(case, 200, 10)
    for i in range(3, len(events), 40):
        image = Attachment(url=image_url(i), kind=AttachmentKind.IMAGE)
        events[i] = events[i].model_copy(update={"attachments": [image]})
    n_images = len(range(3, len(events), 40))
    with flaky_endpoint("stall") as url:
        s = settings_factory(
            **CHAOS_SETTINGS,
            vision_model="chaos-vision",
            vision_base_url=url,
            vision_api_key="k",
            llm_timeout_s=0.5,  # vision waits 1.5x: 0.75 s a try, against a 20 s stall
            # One retry shows the backoff; each try is three requests (the client's own two
            # retries), about 3.7 s against the stall, and the five images queue on one process.
            attachment_max_retries=1,
            attachment_retry_backoff_s=0.5,
        )
        c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))  # type: ignore[arg-type]
        processes = {**BASE, "attachments": ("worker", "--queues", "attachments", "--concurrency", "1")}
        load = Load(s, events, 6)
        try:
            with Stack(s, tmp_path / "stack.log", processes) as stack:
                stack.wait_ready()
                load.start()
                # The messages are applied while the images wait on the stalled endpoint.
                finish(case, "vision endpoint stalls", c, load, stack, started)

                def images_read() -> bool:
                    rows = _rows(
                        c,
                        """SELECT count(*) FILTER (WHERE ar.status = 'done'), count(*)
                           FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                           WHERE a.thread_id LIKE %s""",
                        case + "-%",
                    )
                    return rows[0] == (n_images, n_images)

                by_status = "SELECT status, count(*) FROM artifacts GROUP BY 1"
                assert wait_for(images_read, 120, 0.5), (_rows(c, by_status), stack.tail())
                # Read offline (OCR and metadata): the stalled model described none of them.
                described = _rows(c, "SELECT count(*) FROM artifacts WHERE meta ? 'vision_model'")[0][0]
                assert described == 0
                # ...though it was asked, and each image more than once (retried, then given up).
                assert len(asked) > n_images
        finally:
            c.close()
