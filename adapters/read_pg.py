"""What every read adapter shares: one pinned connection per read, and thread membership.

The read path's queries are split by consumer: recall candidates (adapters/recall_pg.py), the
sections of a context (adapters/context_pg.py) and browsing (adapters/browse_pg.py). They all
take one `ReadConnections`, so a read that spans them (build_context runs recall inside its own
session) runs on one connection. Every query takes the thread list or user id the domain
resolved from the caller; nothing from a request is spliced into SQL."""

from __future__ import annotations

from contextlib import AbstractContextManager

import psycopg

from chatmem.adapters.postgres import PinningPool


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
