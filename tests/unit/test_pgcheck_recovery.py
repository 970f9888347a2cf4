"""After a backend crash the self-check waits until Postgres is ready again. A connection made in
the moment before the postmaster has seen the crash reaches a server about to reset; the wait
reads the server's log for the end of the reset first (a run on a loaded machine met 'in
recovery mode' 4 ms after the check had returned)."""

import threading
import time

from chatmem.adapters import pgcheck

# The lines of that run, as Postgres 18 logged them.
BEFORE = """\
2026-12-01 04:25:09.877 UTC [12099] LOG:  database system is ready to accept connections
"""
CRASH = """\
2026-12-01 04:25:10.082 UTC [12099] LOG:  client backend (PID 12113) was terminated by signal 4: Illegal instruction
2026-12-01 04:25:10.082 UTC [12099] DETAIL:  Failed process was running: SELECT pg_sleep(60)
2026-12-01 04:25:10.082 UTC [12099] LOG:  terminating any other active server processes
2026-12-01 04:25:10.086 UTC [12099] LOG:  all server processes terminated; reinitializing
2026-12-01 04:25:10.348 UTC [12125] LOG:  database system was not properly shut down; automatic recovery in progress
"""
READY = """\
2026-12-01 04:25:10.402 UTC [12099] LOG:  database system is ready to accept connections
"""


def test_the_log_tells_a_reset_not_yet_seen_under_way_and_over():
    assert pgcheck.recovery_logged("") is None
    assert pgcheck.recovery_logged(BEFORE.replace("09.877", "10.000")) is None  # 'ready' before any crash
    assert pgcheck.recovery_logged(CRASH) is False
    assert pgcheck.recovery_logged(CRASH + READY) is True


class _Conn:
    def __init__(self, ready: threading.Event):
        self.ready = ready

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, query, *params):
        # A connection made before the log says ready would reach the server about to reset.
        assert self.ready.is_set(), "connected before the reset was over"
        return self

    def fetchone(self):
        return (False,)


def test_the_wait_reads_the_log_before_it_trusts_a_connection(tmp_path, monkeypatch):
    log = tmp_path / "log"
    log.write_text(BEFORE)
    offset = log.stat().st_size
    ready = threading.Event()
    monkeypatch.setattr(pgcheck.psycopg, "connect", lambda *a, **k: _Conn(ready))

    def postmaster():
        with log.open("a") as f:
            f.write(CRASH)
            f.flush()
            time.sleep(0.3)
            ready.set()
            f.write(READY)

    writer = threading.Thread(target=postmaster)
    writer.start()
    try:
        assert pgcheck.wait_until_ready("postgresql://x", timeout=30, server_log=log, offset=offset)
    finally:
        writer.join()
    assert ready.is_set()


def test_a_log_that_never_tells_falls_back_to_connections(tmp_path, monkeypatch):
    log = tmp_path / "log"
    log.write_text(BEFORE)
    ready = threading.Event()
    ready.set()
    monkeypatch.setattr(pgcheck, "CRASH_SEEN_WAIT", 0.2)
    monkeypatch.setattr(pgcheck.psycopg, "connect", lambda *a, **k: _Conn(ready))
    assert pgcheck.wait_until_ready("postgresql://x", timeout=30, server_log=log, offset=log.stat().st_size)


def test_without_a_log_the_connections_decide(monkeypatch):
    ready = threading.Event()
    ready.set()
    monkeypatch.setattr(pgcheck.psycopg, "connect", lambda *a, **k: _Conn(ready))
    assert pgcheck.wait_until_ready("postgresql://x", timeout=5)  # a server not embedded: no log
