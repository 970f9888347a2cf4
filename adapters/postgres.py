"""The Postgres side: event log, dead letters, threads (cursor + lease), ingest watermark."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from chatmem.adapters.keys_pg import EventKeys, wrapped_key_sql
from chatmem.adapters.sql import scalar
from chatmem.memory.ports import LeaseLost, TransientError, UnknownThread
from chatmem.schemas.records import AcceptedEvent, DeadLetter, LoggedEvent, StoreResult, ThreadLease

log = logging.getLogger(__name__)

_EVENT_COLUMNS = ("event_id", "stream_pos", "type", "schema_version", "thread_id", "user_id", "occurred_at", "payload")

# A duplicate event_id whose content differs from the logged version: the first one stays in the
# log, this one is kept whole as a notice (jsonb equality: a byte-identical redelivery is silent).
_INSERT_CONFLICTS = """
INSERT INTO event_notices (kind, event_id, stream_pos, detail, payload, payload_md5)
SELECT 'conflict', s.event_id, s.stream_pos,
       'event_id reused with different content; the version at stream position ' || e.stream_pos
           || ' stays in the log, this one is kept here',
       s.payload, md5(s.payload::text)
FROM _stage_events s JOIN events e USING (event_id)
WHERE e.payload <> s.payload
ON CONFLICT DO NOTHING
"""
_INSERT_CLOCK_NOTICES = """
INSERT INTO event_notices (kind, event_id, stream_pos, detail)
SELECT 'clock', * FROM unnest(%s::text[], %s::bigint[], %s::text[])
ON CONFLICT DO NOTHING
"""

_INSERT_DEAD = """
INSERT INTO dead_letters (source, entry_id, raw, reason)
SELECT * FROM unnest(%s::text[], %s::text[], %s::bytea[], %s::text[])
ON CONFLICT (source, entry_id) DO UPDATE
    SET delivery_count = dead_letters.delivery_count + 1, last_seen = now(), reason = EXCLUDED.reason
"""


def _configure(conn: psycopg.Connection) -> None:
    from pgvector.psycopg import register_vector

    # Times come back in UTC, whatever zone the server is set to (an external server's setting, or
    # the machine's zone that initdb copied): a message's day, and the times shown, are the same
    # on every machine.
    conn.execute("SET TIME ZONE 'UTC'")
    # numpy arrays <-> vector, in binary; before the first migration the type does not exist yet.
    if conn.execute("SELECT 1 FROM pg_type WHERE typname = 'vector'").fetchone():
        register_vector(conn)
    conn.commit()


def bulk_insert(
    conn: psycopg.Connection,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    types: Sequence[str] | None = None,
) -> int:
    """Insert rows, skipping conflicts, in three round trips: COPY into a staging table that
    lives for the transaction (binary when `types` are given), then one INSERT ... SELECT.
    Several times faster than binding rows one by one. Table and columns are ours, never input."""
    stage = f"_stage_{table}"
    cols = ", ".join(columns)
    conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {table} WITH NO DATA"
    )
    fmt = " WITH (FORMAT BINARY)" if types else ""
    with conn.cursor() as cur, cur.copy(f"COPY {stage} ({cols}) FROM STDIN{fmt}") as copy:
        if types:
            copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)
    return conn.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage} ON CONFLICT DO NOTHING").rowcount


class RecentCheck:
    """The pool's check before it hands a connection out, skipped for a connection handed back
    within `fresh_s`: the check is a round trip of its own, and a worker that takes a
    connection several times per event paid one per take (replay: 7 of 11 round trips an event).
    A job's takes come milliseconds apart, so a short moment keeps most of the saving; a
    connection that broke within it (a database restarted that fast) fails on its first
    statement instead, which callers already treat as a transient error."""

    def __init__(self, fresh_s: float = 0.2):
        self.fresh_s = fresh_s
        self._returned: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()

    def check(self, conn: psycopg.Connection) -> None:
        returned = self._returned.pop(conn, None)
        if returned is None or time.monotonic() - returned > self.fresh_s:
            ConnectionPool.check_connection(conn)

    def returned(self, conn: psycopg.Connection) -> None:
        self._returned[conn] = time.monotonic()


class PinningPool(ConnectionPool):
    """A pool whose `connection()` can hand out one pinned connection to every block of the
    current thread (`pinned()`): a pool checkout costs a round trip, and a rebuild runs hundreds
    of short blocks an episode (taking and returning a connection for each was a sixth of its
    time); a read runs a dozen queries. A nested `pinned()` keeps the outer pin."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._local = threading.local()

    @contextmanager
    def pinned(self, *, commit_blocks: bool = True, flush_at_end: bool = False) -> Iterator[None]:
        """With `commit_blocks`, each block commits or rolls back on exit as with the pool;
        without, the blocks run in the pin's one transaction (a read's queries). With
        `flush_at_end`, the blocks' commits do not each wait for the disk; one commit at the end
        does, and so makes every earlier one durable (the log is flushed in order). For work that
        is run again when it is interrupted (a rebuild): a database crash meanwhile loses at most
        a last moment of it, as if it had been stopped there."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with super().connection() as conn:
            if flush_at_end:
                conn.execute("SET synchronous_commit = off")
                conn.commit()
            self._local.conn, self._local.commit_blocks = conn, commit_blocks
            try:
                yield
            except BaseException:
                self._local.conn = None
                if flush_at_end:
                    _sync_commits(conn)
                raise
            self._local.conn = None
            if flush_at_end:
                conn.execute("SET synchronous_commit = on")
                conn.execute("SELECT pg_current_xact_id()")  # an xid, so the commit writes a record and waits
                conn.commit()

    @contextmanager
    def spare(self, timeout: float) -> Iterator[bool]:
        """Pin a connection for this thread's read when one is free within `timeout`; yields
        whether one was. For work that runs beside a read holding its own pin: waiting the pool's
        full timeout there could wait on reads that wait on it."""
        try:
            conn = self.getconn(timeout)
        except PoolTimeout:
            yield False
            return
        pin = getattr(self._local, "conn", None), getattr(self._local, "commit_blocks", True)
        self._local.conn, self._local.commit_blocks = conn, False
        try:
            with conn:  # a read: its transaction ends with the block
                yield True
        finally:
            self._local.conn, self._local.commit_blocks = pin
            self.putconn(conn)

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            with super().connection(timeout) as conn:
                yield conn
        elif self._local.commit_blocks:
            with conn:  # commit or roll back; a pooled connection is not closed
                yield conn
        else:
            yield conn


def _sync_commits(conn: psycopg.Connection) -> None:
    """Put a connection back to waiting commits before the pool has it; close it if it cannot be."""
    try:
        conn.rollback()
        conn.execute("SET synchronous_commit = on")
        conn.commit()
    except psycopg.Error:
        conn.close()  # the pool replaces a closed connection


def make_pool(database_url: str, size: int, name: str = "chatmem", timeout_s: float = 30.0) -> PinningPool:
    recent = RecentCheck()
    pool = PinningPool(
        database_url,
        min_size=1,
        max_size=max(1, size),
        name=name,
        timeout=timeout_s,
        open=False,
        check=recent.check,
        reset=recent.returned,
        configure=_configure,
    )
    pool.open(wait=True, timeout=30)
    return pool


def _members(events: Sequence[AcceptedEvent]) -> set[tuple[str, str]]:
    return {(a.event.thread_id, a.event.user_id) for a in events if a.event.type == "message"}


class PostgresStore:
    _KNOWN_THREADS_MAX = 200_000

    def __init__(self, pool: ConnectionPool, keys: EventKeys):
        self.pool = pool
        self.keys = keys
        # Thread rows are never deleted, so one seen here needs no further upsert.
        self._known_threads: set[str] = set()
        self._known_members: set[tuple[str, str]] = set()

    # --- ingest ---------------------------------------------------------------------------
    def store_batch(self, events: Sequence[AcceptedEvent], dead: Sequence[DeadLetter]) -> StoreResult:
        try:
            return self._store(events, dead)
        except psycopg.OperationalError as error:
            raise TransientError(str(error)) from error
        except psycopg.DataError as error:
            # One row Postgres refuses must not block the batch: find it and dead-letter it.
            log.warning("batch refused (%s); storing row by row", error)
            return self._store_one_by_one(events, dead)

    def _store(self, events: Sequence[AcceptedEvent], dead: Sequence[DeadLetter]) -> StoreResult:
        inserted = conflicts = 0
        with self.pool.connection() as conn, conn.transaction():
            if events:
                payloads = self.keys.seal_payloads(
                    conn, [(a.event.user_id, a.event.thread_id, a.payload) for a in events]
                )
                inserted = bulk_insert(
                    conn,
                    "events",
                    _EVENT_COLUMNS,
                    (
                        (
                            a.event.event_id,
                            a.stream_pos,
                            a.event.type,
                            a.event.schema_version,
                            a.event.thread_id,
                            a.event.user_id,
                            a.event.occurred_at,
                            payload,
                        )
                        for a, payload in zip(events, payloads, strict=True)
                    ),
                )
                if inserted < len(events):  # only then can a duplicate have differed
                    conflicts = conn.execute(_INSERT_CONFLICTS).rowcount
                clocks = [a for a in events if a.clock_note]
                if clocks:
                    conn.execute(
                        _INSERT_CLOCK_NOTICES,
                        (
                            [a.event.event_id for a in clocks],
                            [a.stream_pos for a in clocks],
                            [a.clock_note for a in clocks],
                        ),
                    )
                new_threads = {a.event.thread_id for a in events} - self._known_threads
                if new_threads:
                    conn.execute(
                        "INSERT INTO threads (thread_id) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING",
                        (sorted(new_threads),),
                    )
                new_members = _members(events) - self._known_members
                if new_members:
                    conn.execute(
                        """INSERT INTO thread_members (thread_id, user_id)
                           SELECT * FROM unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING""",
                        ([t for t, _ in sorted(new_members)], [u for _, u in sorted(new_members)]),
                    )
            if dead:
                conn.execute(
                    _INSERT_DEAD,
                    (
                        [d.source for d in dead],
                        [d.entry_id for d in dead],
                        [d.raw for d in dead],
                        [d.reason for d in dead],
                    ),
                )
        if events:
            if len(self._known_threads) > self._KNOWN_THREADS_MAX:
                self._known_threads.clear()
                self._known_members.clear()
            self._known_threads.update(a.event.thread_id for a in events)
            self._known_members.update(_members(events))
        return StoreResult(inserted, len(events) - inserted, len(dead), conflicts)

    def _store_one_by_one(self, events: Sequence[AcceptedEvent], dead: Sequence[DeadLetter]) -> StoreResult:
        extra_dead = list(dead)
        inserted = conflicts = 0
        for a in events:
            try:
                one = self._store([a], [])
                inserted, conflicts = inserted + one.inserted, conflicts + one.conflicts
            except psycopg.DataError as error:
                extra_dead.append(DeadLetter(a.entry_id, a.payload.encode(), f"refused by Postgres: {error}"))
        self._store([], extra_dead)
        refused = len(extra_dead) - len(dead)
        return StoreResult(inserted, len(events) - inserted - refused, len(extra_dead), conflicts)

    def advance_watermark(self, stream_key: str, watermark: int) -> list[str]:
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("INSERT INTO ingest_state (stream_key) VALUES (%s) ON CONFLICT DO NOTHING", (stream_key,))
            old = scalar(conn, "SELECT watermark FROM ingest_state WHERE stream_key = %s FOR UPDATE", (stream_key,))
            if watermark <= old:
                return []
            conn.execute(
                "UPDATE ingest_state SET watermark = %s, updated_at = now() WHERE stream_key = %s",
                (watermark, stream_key),
            )
            rows = conn.execute(
                "SELECT DISTINCT thread_id FROM events WHERE stream_pos >= %s AND stream_pos < %s",
                (old, watermark),
            ).fetchall()
        return [r[0] for r in rows]

    def watermark(self, stream_key: str) -> int:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT watermark FROM ingest_state WHERE stream_key = %s", (stream_key,)).fetchone()
        return row[0] if row else 0


def _logged_columns(e: str) -> str:
    """What an event of the log is read as, its data key included (`e`: the events row's alias)."""
    columns = ", ".join(f"{e}.{c}" for c in ("stream_pos", "event_id", "type", "thread_id", "user_id", "occurred_at"))
    return f"{columns}, {e}.payload, {wrapped_key_sql(e)} AS wrapped"


class PostgresThreadLog:
    def __init__(self, pool: ConnectionPool, stream_key: str, keys: EventKeys):
        self.pool = pool
        self.stream_key = stream_key
        self.keys = keys

    def acquire_lease(self, thread_id: str, owner: str, lease_s: int) -> ThreadLease | None:
        with self.pool.connection() as conn:
            row = conn.execute(
                """
                UPDATE threads SET lease_owner = %s, lease_until = now() + make_interval(secs => %s)
                WHERE thread_id = %s AND (lease_owner IS NULL OR lease_owner = %s OR lease_until < now())
                  AND (starts_with(%s, 'reembed') OR NOT EXISTS (SELECT 1 FROM embedding_state WHERE paused))
                RETURNING cursor_pos
                """,
                (owner, lease_s, thread_id, owner, owner),
            ).fetchone()
            if (
                row is None
                and conn.execute("SELECT 1 FROM threads WHERE thread_id = %s", (thread_id,)).fetchone() is None
            ):
                raise UnknownThread(thread_id)
        return ThreadLease(thread_id, owner, row[0], lease_s) if row else None

    def renew_lease(self, lease: ThreadLease) -> None:
        with self.pool.connection() as conn:
            row = conn.execute(
                """UPDATE threads SET lease_until = now() + make_interval(secs => %s)
                   WHERE thread_id = %s AND lease_owner = %s RETURNING 1""",
                (lease.lease_s, lease.thread_id, lease.owner),
            ).fetchone()
        if row is None:
            raise LeaseLost(lease.thread_id)

    def release_lease(self, thread_id: str, owner: str) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE threads SET lease_owner = NULL, lease_until = NULL WHERE thread_id = %s AND lease_owner = %s",
                (thread_id, owner),
            )

    def _read_logged(self, sql: str, params: tuple) -> list[LoggedEvent]:
        """Rows of `_logged_columns` as events, their sealed content opened."""
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sql, params).fetchall()
        events = []
        for row in rows:
            wrapped = row.pop("wrapped")
            events.append(LoggedEvent(**{**row, "payload": self.keys.open(row["payload"], wrapped)}))
        return events

    def pending_events(self, thread_id: str, after_pos: int, limit: int) -> list[LoggedEvent]:
        return self._read_logged(
            f"""
                SELECT {_logged_columns("events")}
                FROM events
                WHERE thread_id = %s AND stream_pos > %s
                  AND stream_pos < (SELECT coalesce(max(watermark), 0) FROM ingest_state WHERE stream_key = %s)
                ORDER BY stream_pos
                LIMIT %s
            """,
            (thread_id, after_pos, self.stream_key, limit),
        )

    def first_pending(self, thread_ids: Sequence[str], limit: int) -> dict[str, list[LoggedEvent]]:
        events = self._read_logged(
            f"""
                SELECT {_logged_columns("e")}
                FROM threads t
                CROSS JOIN LATERAL (
                    SELECT * FROM events
                    WHERE events.thread_id = t.thread_id AND events.stream_pos > t.cursor_pos
                      AND events.stream_pos < (
                          SELECT coalesce(max(watermark), 0) FROM ingest_state WHERE stream_key = %s)
                    ORDER BY events.stream_pos
                    LIMIT %s
                ) e
                WHERE t.thread_id = ANY(%s)
                ORDER BY e.thread_id, e.stream_pos
            """,
            (self.stream_key, limit, list(thread_ids)),
        )
        found: dict[str, list[LoggedEvent]] = {}
        for event in events:
            found.setdefault(event.thread_id, []).append(event)
        return found

    def advance_cursor(self, lease: ThreadLease, events: Sequence[LoggedEvent]) -> ThreadLease:
        with self.pool.connection() as conn, conn.transaction():
            return self.advance_cursor_in(conn, lease, events)

    def advance_cursor_in(
        self, conn: psycopg.Connection, lease: ThreadLease, events: Sequence[LoggedEvent]
    ) -> ThreadLease:
        """Move the cursor inside the caller's transaction, so projections and cursor commit together."""
        new_pos = events[-1].stream_pos
        row = conn.execute(
            """
            UPDATE threads SET cursor_pos = %s, applied_events = applied_events + %s, updated_at = now(),
                               lease_until = now() + make_interval(secs => %s)
            WHERE thread_id = %s AND lease_owner = %s AND cursor_pos = %s
            RETURNING cursor_pos
            """,
            (new_pos, len(events), lease.lease_s, lease.thread_id, lease.owner, lease.cursor_pos),
        ).fetchone()
        if row is None:
            raise LeaseLost(lease.thread_id)
        return ThreadLease(lease.thread_id, lease.owner, new_pos, lease.lease_s)

    def all_threads(self) -> list[str]:
        with self.pool.connection() as conn:
            return [r[0] for r in conn.execute("SELECT thread_id FROM threads ORDER BY thread_id")]

    def event_counts(self, thread_ids: list[str]) -> dict[str, int]:
        """Events logged per thread (0 for a thread with none): what a replay of each costs."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT thread_id, count(*) FROM events WHERE thread_id = ANY(%s) GROUP BY thread_id",
                (thread_ids,),
            ).fetchall()
        counts = dict.fromkeys(thread_ids, 0)
        counts.update({t: int(n) for t, n in rows})
        return counts

    def lagging_threads(self, limit: int) -> list[str]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """
                WITH w AS (SELECT coalesce(max(watermark), 0) AS pos FROM ingest_state WHERE stream_key = %s)
                SELECT t.thread_id FROM threads t, w
                WHERE EXISTS (
                    SELECT 1 FROM events e
                    WHERE e.thread_id = t.thread_id AND e.stream_pos > t.cursor_pos AND e.stream_pos < w.pos
                      -- a paused thread lags on purpose until a memory_on arrives
                      AND (t.memory_on OR (e.type = 'command' AND e.payload->>'command' = 'memory_on')))
                LIMIT %s
                """,
                (self.stream_key, limit),
            ).fetchall()
        return [r[0] for r in rows]
