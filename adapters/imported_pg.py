"""Which event ids the event log already holds: the importers ask before publishing, so a second
import of the same export publishes nothing and an interrupted one resumes where it stopped."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg_pool import ConnectionPool


def known_event_ids(pool: ConnectionPool, ids: Sequence[str]) -> set[str]:
    """The subset of `ids` stored in `events` (one query; callers pass a batch, not a whole export)."""
    if not ids:
        return set()
    with pool.connection() as conn:
        rows = conn.execute("SELECT event_id FROM events WHERE event_id = ANY(%s)", (list(ids),)).fetchall()
    return {row[0] for row in rows}
