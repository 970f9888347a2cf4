"""Case 3: Postgres refuses the stack's database for a while, once while ingest commits and
once while the doorbells drain. The embedded server is shared by the session, so the case
closes only its own database (ALLOW_CONNECTIONS false + terminating its sessions) instead of
stopping the server."""

from __future__ import annotations

import time
from contextlib import contextmanager

import psycopg
import pytest

from tests.chaos.harness import Load, Stack, conversation, finish

pytestmark = pytest.mark.chaos

OUTAGE_S = 30  # what the fault matrix asks for: Postgres gone for 30 s


@contextmanager
def database_refused(admin_url: str, database: str):
    """Every session of `database` is cut and no new one is let in until the block ends."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        try:
            yield
        finally:
            conn.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')


def test_database_refused_during_ingest_and_doorbells(chaos_settings, chaos_container, embedded, tmp_path):
    started = time.monotonic()
    case = "pg-outage"
    database = psycopg.conninfo.conninfo_to_dict(chaos_settings.database_url)["dbname"]
    load = Load(chaos_settings, conversation(case, 1000, 20), 10)
    with Stack(chaos_settings, tmp_path / "stack.log") as stack:
        stack.wait_ready()
        load.start()
        load.reached(0.3)
        with database_refused(embedded["admin"], database):
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(chaos_settings.database_url).close()  # the fault is real
            time.sleep(OUTAGE_S)
        load.join(30)
        with database_refused(embedded["admin"], database):  # now the doorbells are draining
            time.sleep(OUTAGE_S)
        out = finish(case, f"database refused 2x{OUTAGE_S} s", chaos_container, load, stack, started)
        restarts = {n: stack.restarts(n) for n in stack.names}
    print(out, restarts)
    # Every process waits the outage out: a crash loop would make `chatmem up` give up on it.
    assert restarts == dict.fromkeys(restarts, 0)
