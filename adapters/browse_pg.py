"""Browsing: a user's threads, a thread's episodes, one episode with its summaries and messages
(the CLI's `threads` / `episodes` and the HTTP browse routes). Callers check membership first
(`readable_threads`)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from chatmem.adapters.read_pg import PostgresReader
from chatmem.adapters.sql import message_active
from chatmem.schemas.events import ERASED


class PostgresBrowser(PostgresReader):
    """Listings as rows (dicts) of the active generation."""

    def threads_of(self, user_id: str) -> list[dict[str, Any]]:
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT t.thread_id, t.generation, t.message_count, t.episode_count, t.updated_at,
                          (SELECT max(occurred_at) FROM messages m WHERE m.thread_id = t.thread_id
                           AND m.generation = t.generation) AS last_message_at
                   FROM thread_members tm JOIN threads t USING (thread_id)
                   WHERE tm.user_id = %s ORDER BY last_message_at DESC NULLS LAST, t.thread_id""",
                (user_id,),
            ).fetchall()

    def episodes(self, thread_id: str) -> list[dict[str, Any]]:
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT e.episode_id, e.ordinal, e.status, e.start_seq, e.end_seq, e.opened_by, e.closed_by,
                          e.started_at, e.ended_at, e.topic_label,
                          (SELECT count(*) FROM messages m WHERE m.episode_id = e.episode_id
                           AND m.generation = e.generation) AS messages
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   WHERE e.thread_id = %s ORDER BY e.ordinal""",
                (thread_id,),
            ).fetchall()

    def recent_episodes(self, user_id: str, limit: int) -> list[dict[str, Any]]:
        """The latest episodes of every thread the user is in, newest first."""
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT e.thread_id, e.episode_id, e.topic_label AS title, e.status, e.started_at, e.ended_at
                   FROM thread_members tm
                   JOIN threads t ON t.thread_id = tm.thread_id
                   JOIN episodes e ON e.thread_id = t.thread_id AND e.generation = t.generation
                   WHERE tm.user_id = %s
                   ORDER BY e.started_at DESC NULLS LAST, e.ordinal DESC LIMIT %s""",
                (user_id, limit),
            ).fetchall()

    def active_summaries(self, thread_id: str) -> list[dict[str, Any]]:
        """Active summaries of the thread's current generation, highest level first."""
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT s.kind, s.level, s.episode_id, s.from_seq, s.upto_seq, s.text FROM summaries s
                   JOIN threads t ON t.thread_id = s.thread_id AND t.generation = s.generation
                   WHERE s.thread_id = %s AND s.is_active
                   ORDER BY s.level DESC, s.upto_seq DESC, s.kind""",
                (thread_id,),
            ).fetchall()

    def episode_summaries(self, episode_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The final and running summaries of these episodes (active generation), by episode."""
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                """SELECT s.episode_id, s.kind, s.upto_seq, s.text, s.content FROM summaries s
                   JOIN threads t ON t.thread_id = s.thread_id AND t.generation = s.generation
                   WHERE s.episode_id = ANY(%s) AND s.kind IN ('final', 'running')
                   ORDER BY s.episode_id, s.upto_seq DESC""",
                (episode_ids,),
            ).fetchall()
        found: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            found.setdefault(r["episode_id"], []).append(r)
        return found

    def episode(self, episode_id: str) -> dict[str, Any] | None:
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            ep = cur.execute(
                """SELECT e.episode_id, e.thread_id, e.ordinal, e.status, e.start_seq, e.end_seq, e.opened_by,
                          e.closed_by, e.started_at, e.ended_at, e.topic_label
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   WHERE e.episode_id = %s""",
                (episode_id,),
            ).fetchone()
            if ep is None:
                return None
            ep["summaries"] = cur.execute(
                """SELECT kind, level, from_seq, upto_seq, text, content, is_active, created_at FROM summaries
                   WHERE episode_id = %s AND generation = (SELECT generation FROM threads WHERE thread_id = %s)
                   ORDER BY kind = 'final' DESC, upto_seq DESC""",
                (episode_id, ep["thread_id"]),
            ).fetchall()
            ep["messages"] = cur.execute(
                f"""SELECT seq, user_id, role, text, platform_message_id, occurred_at,
                           {message_active("m")} AS is_active FROM messages m
                    WHERE episode_id = %s AND generation = (SELECT generation FROM threads WHERE thread_id = %s)
                    ORDER BY seq""",
                (episode_id, ep["thread_id"]),
            ).fetchall()
        return ep

    def logged_message(self, event_id: str) -> dict[str, Any] | None:
        """A message as logged, whether or not processed yet: its thread, author and platform
        message id (in clear in the log). None when there is none, or its content is erased."""
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                f"""SELECT thread_id, user_id, payload->>'platform_message_id' AS platform_message_id
                    FROM events WHERE event_id = %s AND type = 'message'
                      AND NOT coalesce(payload->'metadata' ? '{ERASED}', false)""",
                (event_id,),
            ).fetchone()
