"""What every read adapter shares: one pinned connection per read (and a spare one for work a
read starts ahead, when one is free), and thread membership.

The read path's queries are split by consumer: recall candidates (adapters/recall_pg.py), the
sections of a context (adapters/context_pg.py) and browsing (adapters/browse_pg.py). They all
take one `ReadConnections`, so a read that spans them (build_context runs recall inside its own
session) runs on one connection. Every query takes the thread list or user id the domain
resolved from the caller; nothing from a request is spliced into SQL."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Generic, Self, TypeVar

import psycopg

from chatmem.adapters.postgres import PinningPool
from chatmem.adapters.procs import process_threads
from chatmem.memory.recall import Inline, Pending

T = TypeVar("T")

# Work run ahead of a read: two threads (a read starts one query ahead; a second read in the
# process may too). Each tries for a spare connection for at most AHEAD_WAIT_S, in steps, and
# gives up as soon as the read needs the result and takes the work back.
AHEAD_THREADS = 2
AHEAD_STEP_S = 0.01  # longer than the interpreter's thread switch, so a free connection is seen
AHEAD_WAIT_S = 0.05


class ReadConnections:
    """The pool, whose connection a read's session pins for the current thread: its queries run
    on that one connection, in one transaction the session ends."""

    def __init__(self, pool: PinningPool, parallel: bool = True):
        self.pool = pool
        # The one switch for work beside a read (`recall_parallel`); False: `ahead` work runs when
        # asked for, on the read's own connection, and readers keep their statements whole.
        self.parallel = parallel

    def session(self) -> AbstractContextManager[None]:
        """One connection for every query of a read: a pool checkout costs a round trip."""
        return self.pool.pinned(commit_blocks=False)

    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        """The pinned connection inside a session; a pooled one for a query on its own."""
        return self.pool.connection()

    def ahead(self, work: Callable[[], T]) -> Pending[T]:
        """Start `work` (queries through this object) now on a spare connection in another thread,
        so that it runs while the caller's session runs its own; `.result()` gives its result.
        Whoever comes first does the work: when no connection is free at once (a busy process) or
        no thread, the caller does it on its own connection when it asks, so a read never waits
        on another read's connection. The work sees its own snapshot: recall's candidate lists
        are read in two transactions, as two reads a moment apart would be. Not `parallel`: the
        caller does it when it asks, always."""
        return Ahead(self.pool, work) if self.parallel else Inline(work)


class Ahead(Generic[T]):
    """Work started on a spare connection by `ReadConnections.ahead`."""

    def __init__(self, pool: PinningPool, work: Callable[[], T]):
        self._work = work
        self._claim = threading.Lock()  # acquired by whichever side runs `work`, or by `cancel`
        self._future: Future[tuple[bool, T | None]] | None
        try:
            self._future = process_threads("chatmem-read-ahead", AHEAD_THREADS).submit(self._run, pool)
        except RuntimeError:  # the interpreter is shutting down: no thread, done when asked for
            self._future = None

    def _run(self, pool: PinningPool) -> tuple[bool, T | None]:
        deadline = time.monotonic() + AHEAD_WAIT_S
        while not self._claim.locked() and time.monotonic() < deadline:
            with pool.spare(AHEAD_STEP_S) as pinned:
                if not pinned:
                    continue
                if not self._claim.acquire(blocking=False):
                    break
                return True, self._work()
        return False, None

    def result(self) -> T:
        if self._claim.acquire(blocking=False):  # not started: do it here
            if self._future is not None:
                self._future.cancel()
            return self._work()
        if self._future is None:
            raise RuntimeError("asked twice for work done ahead, or after cancelling it")
        done, value = self._future.result()
        if not done:
            raise RuntimeError("asked twice for work done ahead, or after cancelling it")
        return value  # type: ignore[return-value]  # `_run` took the claim: the work's value

    def cancel(self) -> None:
        """The result is not needed (the read failed): work not started yet never starts."""
        if self._claim.acquire(blocking=False) and self._future is not None:
            self._future.cancel()


class PostgresReader:
    """Base of the read adapters: the shared session and the membership check reads start with."""

    def __init__(self, connections: ReadConnections):
        self.connections = connections

    def session(self) -> AbstractContextManager[None]:
        """Group the queries of one read (one connection), across every reader sharing it."""
        return self.connections.session()

    def _conn(self) -> AbstractContextManager[psycopg.Connection]:
        return self.connections.connection()

    def ahead(self, work: Callable[[], T]) -> Pending[T]:
        """`work` started on a spare connection (`ReadConnections.ahead`)."""
        return self.connections.ahead(work)

    def serial(self) -> Self:
        """This reader with every query of a read on its one connection (`recall_parallel` off)."""
        other = copy.copy(self)
        other.connections = ReadConnections(self.connections.pool, parallel=False)
        return other

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
