"""What every read adapter shares: one pinned connection per read, and thread membership.

The read path's queries are split by consumer: recall candidates (adapters/recall_pg.py), the
sections of a context (adapters/context_pg.py) and browsing (adapters/browse_pg.py). They all
take one `ReadConnections`, so a read that spans them (build_context runs recall inside its own
session) runs on one connection. Every query takes the thread list or user id the domain
resolved from the caller; nothing from a request is spliced into SQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import psycopg
from psycopg_pool import ConnectionPool


class ReadConnections:
    """The pool, and the connection pinned by the current thread's open session (if any)."""

    def __init__(self, pool: ConnectionPool):
        self.pool = pool
        self._local = threading.local()

    @contextmanager
    def session(self) -> Iterator[None]:
        """One connection for every query of a read: a pool checkout costs a round trip."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self.pool.connection() as conn:
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """The pinned connection inside a session; a pooled one for a query on its own."""
        pinned = getattr(self._local, "conn", None)
        if pinned is not None:
            yield pinned
        else:
            with self.pool.connection() as conn:
                yield conn


class PostgresReader:
    """Base of the read adapters: the shared session and the membership check reads start with."""

    def __init__(self, connections: ReadConnections):
        self.connections = connections

    def session(self) -> AbstractContextManager[None]:
        """Group the queries of one read (one connection), across every reader sharing it."""
        return self.connections.session()

    def _conn(self) -> AbstractContextManager[psycopg.Connection]:
        return self.connections.connection()

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
