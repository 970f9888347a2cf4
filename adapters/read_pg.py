"""What every read adapter shares: one pinned connection per read (and a spare one for work a
read starts ahead, when one is free), and thread membership.

The read path's queries are split by consumer: recall candidates (adapters/recall_pg.py), the
sections of a context (adapters/context_pg.py) and browsing (adapters/browse_pg.py). They all
take one `ReadConnections`, so a read that spans them (build_context runs recall inside its own
session) runs on one connection. Every query takes the thread list or user id the domain
resolved from the caller; nothing from a request is spliced into SQL."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

import psycopg

from chatmem.adapters.postgres import PinningPool

T = TypeVar("T")

# Work run ahead of a read: two threads (a read starts one query ahead; a second read in the
# process may too). Each tries for a spare connection for at most AHEAD_WAIT_S, in steps, and
# gives up as soon as the read needs the result and takes the work back.
AHEAD_THREADS = 2
AHEAD_STEP_S = 0.002
AHEAD_WAIT_S = 0.05
_ahead_lock = threading.Lock()
_ahead_executors: dict[int, ThreadPoolExecutor] = {}


def _executor() -> ThreadPoolExecutor:
    """This process's threads for work ahead (threads do not survive a fork: a forked child
    makes its own)."""
    with _ahead_lock:
        pid = os.getpid()
        if pid not in _ahead_executors:
            _ahead_executors[pid] = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="chatmem-read-ahead")
        return _ahead_executors[pid]


class ReadConnections:
    """The pool, whose connection a read's session pins for the current thread: its queries run
    on that one connection, in one transaction the session ends."""

    def __init__(self, pool: PinningPool):
        self.pool = pool

    def session(self) -> AbstractContextManager[None]:
        """One connection for every query of a read: a pool checkout costs a round trip."""
        return self.pool.pinned(commit_blocks=False)

    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        """The pinned connection inside a session; a pooled one for a query on its own."""
        return self.pool.connection()

    def ahead(self, work: Callable[[], T]) -> Callable[[], T]:
        """Start `work` (queries through this object) now on a spare connection in another thread,
        so that it runs while the caller's session runs its own; the returned function gives its
        result. Whoever comes first does the work: when no connection is free at once (a busy
        process) or no thread, the caller does it on its own connection when it asks, so a read
        never waits on another read's connection. The work sees its own snapshot: recall's
        candidate lists are read in two transactions, as two reads a moment apart would be."""
        claim = threading.Lock()  # acquired by whichever side runs `work`

        def run() -> tuple[bool, T | None]:
            deadline = time.monotonic() + AHEAD_WAIT_S
            while not claim.locked() and time.monotonic() < deadline:
                with self.pool.spare(AHEAD_STEP_S) as pinned:
                    if not pinned:
                        continue
                    if not claim.acquire(blocking=False):
                        break
                    return True, work()
            return False, None

        future = _executor().submit(run)

        def result() -> T:
            if claim.acquire(blocking=False):  # not started: do it here
                future.cancel()
                return work()
            done, value = future.result()
            assert done  # the claim was taken by `run`, which returns the work's value or raises
            return value  # type: ignore[return-value]

        return result


class PostgresReader:
    """Base of the read adapters: the shared session and the membership check reads start with."""

    def __init__(self, connections: ReadConnections):
        self.connections = connections

    def session(self) -> AbstractContextManager[None]:
        """Group the queries of one read (one connection), across every reader sharing it."""
        return self.connections.session()

    def _conn(self) -> AbstractContextManager[psycopg.Connection]:
        return self.connections.connection()

    def ahead(self, work: Callable[[], T]) -> Callable[[], T]:
        """`work` started on a spare connection (`ReadConnections.ahead`)."""
        return self.connections.ahead(work)

    def readable_threads(self, user_id: str, thread_id: str | None) -> list[str]:
        with self._conn() as conn:
            if thread_id is not None:
                rows = conn.execute(
                    "SELECT thread_id FROM thread_members WHERE user_id = %s AND thread_id = %s", (user_id, thread_id)
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT thread_id FROM thread_members WHERE user_id = %s ORDER BY thread_id", (user_id,)
                ).fetchall()
        return [r[0] for r in rows]
