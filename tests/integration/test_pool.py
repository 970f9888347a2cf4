"""The connection pool: one pinned connection for a rebuild's many blocks, and the check before a
connection is handed out skipped for one handed back a moment ago."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from chatmem.adapters.postgres import RecentCheck, make_pool


@pytest.fixture
def pool(fresh_db):
    p = make_pool(fresh_db, 2, name="test")
    with p.connection() as conn:
        conn.execute("CREATE TABLE pin (n int)")
    yield p
    p.close()


def _backend(pool) -> int:
    with pool.connection() as conn:
        return conn.info.backend_pid


def test_pinned_blocks_share_one_connection_and_each_commits(pool, fresh_db):
    requests = pool.get_stats().get("requests_num", 0)
    with pool.pinned():
        first = _backend(pool)
        with pool.connection() as conn:
            conn.execute("INSERT INTO pin VALUES (1)")
        # Committed when its block ended, as with a pooled connection: another session sees it.
        with psycopg.connect(fresh_db) as other:
            assert other.execute("SELECT count(*) FROM pin").fetchone() == (1,)
        with pytest.raises(RuntimeError), pool.connection() as conn:
            conn.execute("INSERT INTO pin VALUES (2)")
            raise RuntimeError("a block that fails")
        with pool.pinned():  # nested: the same pin
            assert _backend(pool) == first
        with pool.connection() as conn:
            assert conn.execute("SELECT array_agg(n) FROM pin").fetchone() == ([1],)  # the failed block rolled back
        assert _backend(pool) == first
    # Six blocks, one checkout from the pool.
    assert pool.get_stats().get("requests_num", 0) == requests + 1
    # Unpinned again, and the pinned connection went back to the pool in a clean state.
    with pool.connection() as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_pin_is_per_thread(pool):
    import threading

    seen: list[int] = []
    with pool.pinned(), pool.connection() as mine:
        t = threading.Thread(target=lambda: seen.append(_backend(pool)))
        t.start()
        t.join()
        assert seen and seen[0] != mine.info.backend_pid


def test_recent_check_skips_only_a_connection_just_handed_back(monkeypatch, fresh_db):
    checks: list[object] = []
    real = ConnectionPool.check_connection
    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(lambda c: (checks.append(c), real(c))))
    recent = RecentCheck(fresh_s=60)
    with psycopg.connect(fresh_db) as conn:
        recent.check(conn)  # never handed back: checked
        assert len(checks) == 1
        recent.returned(conn)
        recent.check(conn)  # handed back a moment ago: no round trip
        assert len(checks) == 1
        recent.check(conn)  # the mark is used once: the next take checks again
        assert len(checks) == 2
        stale = RecentCheck(fresh_s=0)
        stale.returned(conn)
        stale.check(conn)
        assert len(checks) == 3


def _sync(pool) -> str:
    with pool.connection() as conn:
        return conn.execute("SHOW synchronous_commit").fetchone()[0]


def test_flush_at_end_waits_only_for_the_last_commit_and_restores_the_setting(fresh_db):
    pool = make_pool(fresh_db, 1, name="one")  # one connection: the one pinned is the one checked afterwards
    with pool.connection() as conn:
        conn.execute("CREATE TABLE pin (n int)")
    with pool.pinned(flush_at_end=True):
        assert _sync(pool) == "off"
        with pool.connection() as conn:
            conn.execute("INSERT INTO pin VALUES (1)")
    assert _sync(pool) == "on"
    with psycopg.connect(fresh_db) as other:
        assert other.execute("SELECT count(*) FROM pin").fetchone() == (1,)
    with pytest.raises(RuntimeError), pool.pinned(flush_at_end=True):
        assert _sync(pool) == "off"
        raise RuntimeError("a rebuild that fails")
    assert _sync(pool) == "on"
    pool.close()


def test_a_read_session_runs_its_blocks_in_one_transaction(pool, fresh_db):
    requests = pool.get_stats().get("requests_num", 0)
    with pool.pinned(commit_blocks=False):
        with pool.connection() as conn:
            conn.execute("INSERT INTO pin VALUES (1)")
        # Not committed when the block ended: another session does not see it yet.
        with psycopg.connect(fresh_db) as other:
            assert other.execute("SELECT count(*) FROM pin").fetchone() == (0,)
        with pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM pin").fetchone() == (1,)
    with psycopg.connect(fresh_db) as other:
        assert other.execute("SELECT count(*) FROM pin").fetchone() == (1,)  # the session's end commits
    assert pool.get_stats().get("requests_num", 0) == requests + 1


def test_work_ahead_of_a_read_runs_on_a_spare_connection_beside_it(pool):
    from chatmem.adapters.read_pg import ReadConnections

    reads = ReadConnections(pool)
    pool.resize(min_size=2, max_size=2)
    pool.wait()  # a spare connection is there
    with reads.session():
        mine = _backend(pool)
        ahead = reads.ahead(lambda: _backend(pool))
        time.sleep(0.2)  # the read's own queries, meanwhile
        assert ahead.result() != mine  # a connection of its own, so its query ran beside the session's
        failing = reads.ahead(lambda: _backend(pool) // 0)
        time.sleep(0.2)
        with pytest.raises(ZeroDivisionError):  # the error of work run ahead reaches the read
            failing.result()
        # While other work holds the spare connection, later work cannot start beside the read:
        started = threading.Event()
        busy = reads.ahead(lambda: started.set() or time.sleep(0.4) or _backend(pool))
        assert started.wait(5)
        ran: list[int] = []
        cancelled = reads.ahead(lambda: ran.append(1))
        cancelled.cancel()  # the read failed before it needed the result: it never runs
        # Asked for before it started, the work runs on the read's own connection.
        assert reads.ahead(lambda: _backend(pool)).result() == mine
        assert busy.result() not in (mine, None)
        time.sleep(0.2)
        assert ran == []


def test_work_ahead_of_a_serial_read_runs_on_its_own_connection_when_asked_for(pool):
    from chatmem.adapters.read_pg import ReadConnections

    reads = ReadConnections(pool, parallel=False)  # CHATMEM_RECALL_PARALLEL=false
    pool.resize(min_size=2, max_size=2)
    pool.wait()  # a spare connection is there, and still not taken
    with reads.session():
        mine = _backend(pool)
        ran: list[int] = []
        ahead = reads.ahead(lambda: ran.append(1) or _backend(pool))
        time.sleep(0.2)
        assert ran == []  # not started beside the read
        assert ahead.result() == mine and ran == [1]


def test_work_ahead_never_waits_on_a_connection_a_read_holds(fresh_db):
    from chatmem.adapters.read_pg import AHEAD_WAIT_S, ReadConnections

    pool = make_pool(fresh_db, 1, name="one", timeout_s=5)  # the session's is the only connection
    reads = ReadConnections(pool)
    try:
        with reads.session():
            mine = _backend(pool)
            ahead = reads.ahead(lambda: _backend(pool))
            time.sleep(AHEAD_WAIT_S + 0.2)  # long past the time the work may wait for a connection
            t0 = time.monotonic()
            # Not a wait of the pool's timeout (5 s) for a connection that is never handed back:
            # the work gave up, and the read runs it on its own connection.
            assert ahead.result() == mine
            assert time.monotonic() - t0 < 2
    finally:
        pool.close()


@pytest.mark.parametrize("parallel", [True, False])
def test_the_parallel_setting_reaches_every_reader_through_the_read_connections(settings_factory, parallel):
    from chatmem.adapters.services import ServiceUrls
    from chatmem.bootstrap import Container

    s = settings_factory(recall_parallel=parallel)  # CHATMEM_RECALL_PARALLEL
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        assert c.read_connections.parallel is parallel
        # One switch: recall's store and the other readers share it.
        assert c.recall.store is c.recall_reader
        assert all(r.connections is c.read_connections for r in (c.recall_reader, c.context_reader, c.browser))
    finally:
        c.close()
