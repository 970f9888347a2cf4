"""`chatmem up` runs the whole pipeline and the HTTP API in the foreground; Ctrl-C (or SIGTERM)
stops all of it."""

import signal
import socket

import httpx
import psutil
import pytest

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from tests.conftest import scalar, spawn, wait_for

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_up_processes_events_serves_the_api_and_a_signal_stops_everything(container, stop_signal):
    port = free_port()
    up = spawn(container.settings, "up", api_port=port)
    try:
        with Publisher.from_settings(container.settings) as pub:
            pub.publish_many(
                [MessageEvent(event_id=f"e{i}", thread_id=f"t{i % 3}", user_id="u", text=f"m{i}") for i in range(30)]
            )
        applied = lambda: scalar(container, "SELECT coalesce(sum(applied_events), 0) FROM threads") == 30  # noqa: E731
        assert wait_for(applied, timeout=90)
        healthy = lambda: _get(f"http://127.0.0.1:{port}/healthz") == 200  # noqa: E731
        assert wait_for(healthy, timeout=60)
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 4  # ingest, worker (+ its pool), sweeper, api
    finally:
        up.send_signal(stop_signal)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out[-2000:]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0
