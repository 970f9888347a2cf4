"""Small helpers for queries that always return one row (aggregates, SHOW, RETURNING)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import Params

# What Connection.execute takes (psycopg's `Query` also admits t-strings, which execute does not).
Query = str | bytes | sql.SQL | sql.Composed
# The thread named by the parameter `t` and its sub-threads (`<thread>:<topic>`, a forum's topics):
# a chat's deletion does not say which topic the message was in.
THREAD_FAMILY = "SELECT thread_id FROM threads WHERE thread_id = %(t)s OR starts_with(thread_id, %(t)s || ':')"


def one(conn: psycopg.Connection, query: Query, params: Params | None = None) -> tuple[Any, ...]:
    """The one row the query returns; LookupError when it returns none."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise LookupError(f"the query returned no row: {query!r}")
    return row


def scalar(conn: psycopg.Connection, query: Query, params: Params | None = None) -> Any:
    """The first column of the one row the query returns."""
    return one(conn, query, params)[0]


def message_active(alias: str) -> str:
    """SQL for whether the message row `alias` is active: not yet archived with its episode (the
    flag lives on the episode row, migrations/0013; a message of an episode row not written yet
    is active)."""
    return (
        f"NOT coalesce((SELECT e.archived FROM episodes e"
        f" WHERE e.episode_id = {alias}.episode_id AND e.generation = {alias}.generation), false)"
    )
