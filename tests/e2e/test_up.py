"""`chatmem up` runs the whole pipeline in the foreground and Ctrl-C stops all of it."""

import signal

import psutil
import pytest

from producers.publisher import Publisher
from schemas.events import MessageEvent
from tests.conftest import scalar, spawn, wait_for

pytestmark = pytest.mark.e2e


def test_up_processes_events_and_ctrl_c_stops_everything(container):
    up = spawn(container.settings, "up")
    try:
        with Publisher.from_settings(container.settings) as pub:
            pub.publish_many(
                [MessageEvent(event_id=f"e{i}", thread_id=f"t{i % 3}", user_id="u", text=f"m{i}") for i in range(30)]
            )
        applied = lambda: scalar(container, "SELECT coalesce(sum(applied_events), 0) FROM threads") == 30  # noqa: E731
        assert wait_for(applied, timeout=90)
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 3  # ingest, worker (+ its pool), sweeper
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out[-2000:]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
