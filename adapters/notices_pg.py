"""What ingest set aside or noticed, newest first: dead letters (refused entries, with the raw
bytes and the reason) and event notices (a reused event_id with other content, a producer
clock out of range, and, from the workers, an event whose batch could not be applied). The
`chatmem dead-letters` listing reads them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from psycopg_pool import ConnectionPool

from chatmem.adapters.keys_pg import EventKeys, wrapped_key_sql


class DeadLetterRow(NamedTuple):
    source: str
    entry_id: str
    reason: str
    delivery_count: int
    last_seen: datetime
    raw_preview: str


class NoticeRow(NamedTuple):
    kind: str
    event_id: str
    stream_pos: int
    detail: str
    payload: dict[str, Any] | None
    created_at: datetime


class PostgresNotices:
    def __init__(self, pool: ConnectionPool, keys: EventKeys):
        self.pool = pool
        self.keys = keys

    def dead_letters(self, limit: int) -> list[DeadLetterRow]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT source, entry_id, reason, delivery_count, last_seen,
                          convert_from(substring(raw FROM 1 FOR 200), 'SQL_ASCII')
                   FROM dead_letters ORDER BY last_seen DESC, id DESC LIMIT %s""",
                (limit,),
            ).fetchall()
        return [DeadLetterRow(*r) for r in rows]

    def apply_failed(self, event_id: str, stream_pos: int, detail: str) -> None:
        """That applying a thread stopped at the batch this event begins; once an event."""
        with self.pool.connection() as conn:
            conn.execute(
                """INSERT INTO event_notices (kind, event_id, stream_pos, detail)
                   VALUES ('apply_failed', %s, %s, %s) ON CONFLICT DO NOTHING""",
                (event_id, stream_pos, detail),
            )

    def notices(self, limit: int, kind: str | None = None) -> list[NoticeRow]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT kind, event_id, stream_pos, detail, payload, created_at, {wrapped_key_sql("n")}
                    FROM event_notices n
                    WHERE %(kind)s::text IS NULL OR kind = %(kind)s
                    ORDER BY created_at DESC, id DESC LIMIT %(n)s""",
                {"kind": kind, "n": limit},
            ).fetchall()
        return [
            NoticeRow(k, e, pos, detail, None if payload is None else self.keys.open(payload, wrapped), at)
            for k, e, pos, detail, payload, at, wrapped in rows
        ]
