"""`chatmem up` runs the whole pipeline and the HTTP API in the foreground; Ctrl-C (or SIGTERM)
stops all of it."""

import signal
import socket

import httpx
import psutil
import pytest

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from tests.conftest import scalar, spawn, status_json, wait_for

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


def test_up_starts_a_killed_process_again_and_status_shows_it(container):
    import os

    from tests.conftest import stop

    up = spawn(container.settings, "up", api_port=free_port())
    try:
        ingest = lambda: [p for p in psutil.Process(up.pid).children() if "ingest" in _cmdline(p)]  # noqa: E731
        pids: list[int] = []
        one = lambda: len(found := ingest()) == 1 and not pids.append(found[0].pid)  # noqa: E731
        assert wait_for(one, timeout=60)
        victim = pids[-1]
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: one() and pids[-1] != victim, timeout=30)
        with Publisher.from_settings(container.settings) as pub:
            pub.publish(MessageEvent(event_id="after-crash", thread_id="t", user_id="u", text="still here"))
        stored = lambda: scalar(container, "SELECT count(*) FROM events WHERE event_id = 'after-crash'") == 1  # noqa: E731
        assert wait_for(stored, timeout=60)
        # stdout alone, as `chatmem status --json | jq` reads it (log lines go to stderr).
        processes = {p["command"]: p for p in status_json(container.settings)["processes"]}
        assert processes["ingest"]["state"] == "up" and processes["ingest"]["restarts"] == 1
        assert all(p["state"] == "up" for p in processes.values())
    finally:
        out = stop(up, timeout=60)
    assert up.returncode == 0, out[-2000:]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # a killed child not reaped yet (a zombie), or gone
        return []
