"""Browsing: a user's threads, a thread's episodes, one episode with its summaries and messages
(the CLI's `threads` / `episodes` and the HTTP browse routes). Callers check membership first
(`readable_threads`)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from chatmem.adapters.read_pg import PostgresReader


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
                """SELECT seq, user_id, role, text, platform_message_id, occurred_at, is_active FROM messages
                   WHERE episode_id = %s AND generation = (SELECT generation FROM threads WHERE thread_id = %s)
                   ORDER BY seq""",
                (episode_id, ep["thread_id"]),
            ).fetchall()
        return ep
