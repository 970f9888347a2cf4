"""Case 3: Postgres stopped for 30 s, once while ingest commits and once while the doorbells
drain. The session's embedded server is shut down (`pg_ctl stop -m fast`: every session cut,
new connections refused) and started again on the same data folder, so its address holds."""

from __future__ import annotations

import time
from contextlib import contextmanager

import psycopg
import pytest

from chatmem.adapters.services import EmbeddedPostgres
from tests.chaos.harness import Load, Stack, conversation, finish

pytestmark = pytest.mark.chaos

OUTAGE_S = 30  # what the fault matrix asks for: Postgres gone for 30 s


@contextmanager
def postgres_stopped(server: EmbeddedPostgres, url: str):
    """The server is down for the block and up again after it, at the same address."""
    assert server.stop()
    try:
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=5).close()  # the fault is real
        yield
    finally:
        server.start()


def test_postgres_stopped_during_ingest_and_doorbells(chaos_settings, chaos_container, embedded, tmp_path):
    started = time.monotonic()
    case = "pg-outage"
    server: EmbeddedPostgres = embedded["pg"]
    load = Load(chaos_settings, conversation(case, 1000, 20), 10)
    with Stack(chaos_settings, tmp_path / "stack.log") as stack:
        stack.wait_ready()
        load.start()
        load.reached(0.3)
        with postgres_stopped(server, chaos_settings.database_url):
            time.sleep(OUTAGE_S)
        load.join(30)
        with postgres_stopped(server, chaos_settings.database_url):  # now the doorbells are draining
            time.sleep(OUTAGE_S)
        out = finish(case, f"Postgres stopped 2x{OUTAGE_S} s", chaos_container, load, stack, started)
        restarts = {n: stack.restarts(n) for n in stack.names}
    print(out, restarts)
    # Every process waits the outage out: a crash loop would make `chatmem up` give up on it.
    assert restarts == dict.fromkeys(restarts, 0)
