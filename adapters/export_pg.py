"""Everything held about one user, for the right of access and of portability (`chatmem export
--user U`): the events they published (the log), their messages as memory holds them, the
episodes and summaries of the threads they are in, their facts with history, and the files
they sent with what was read from them. Rows become JSON-ready dicts; the CLI writes them with
the files beside."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from chatmem.adapters.keys_pg import KID, EventKeys, wrapped_key_sql
from chatmem.adapters.sql import message_active


class PostgresExport:
    def __init__(self, pool: ConnectionPool, keys: EventKeys):
        self.pool = pool
        self.keys = keys

    def user(self, user_id: str) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            events = cur.execute(
                f"""SELECT event_id, type, thread_id, occurred_at, received_at, payload,
                           {wrapped_key_sql("events")} AS wrapped
                    FROM events WHERE user_id = %s ORDER BY thread_id, stream_pos""",
                (user_id,),
            ).fetchall()
            for e in events:  # as published: content opened, the key id dropped
                opened = self.keys.open(e["payload"], e.pop("wrapped"))
                e["payload"] = {k: v for k, v in opened.items() if k != KID}
            messages = cur.execute(
                f"""SELECT m.thread_id, m.seq, m.episode_id, m.role, m.text, m.platform_message_id, m.occurred_at,
                           {message_active("m")} AS is_active
                    FROM messages m JOIN threads t ON t.thread_id = m.thread_id AND t.generation = m.generation
                    WHERE m.user_id = %s ORDER BY m.thread_id, m.seq""",
                (user_id,),
            ).fetchall()
            threads = [r["thread_id"] for r in cur.execute(
                "SELECT thread_id FROM thread_members WHERE user_id = %s ORDER BY thread_id", (user_id,)
            ).fetchall()]  # fmt: skip
            episodes = cur.execute(
                """SELECT e.thread_id, e.episode_id, e.ordinal, e.status, e.start_seq, e.end_seq, e.started_at,
                          e.ended_at, e.topic_label
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   WHERE e.thread_id = ANY(%s) ORDER BY e.thread_id, e.ordinal""",
                (threads,),
            ).fetchall()
            summaries = cur.execute(
                """SELECT s.thread_id, s.episode_id, s.kind, s.level, s.from_seq, s.upto_seq, s.text, s.content,
                          s.is_active, s.created_at
                   FROM summaries s JOIN threads t ON t.thread_id = s.thread_id AND t.generation = s.generation
                   WHERE s.thread_id = ANY(%s) ORDER BY s.thread_id, s.level, s.from_seq""",
                (threads,),
            ).fetchall()
            facts = cur.execute(
                """SELECT id, category, key, value, confidence, is_active, archived_reason, thread_id, episode_id,
                          source, source_event_ids, created_at FROM facts
                   WHERE user_id = %s ORDER BY category, key, id""",
                (user_id,),
            ).fetchall()
            files = cur.execute(
                """SELECT a.event_id, a.position, a.thread_id, a.status, a.reason, a.sha256, ar.mime_type, ar.kind,
                          ar.size_bytes, ar.description,
                          (SELECT coalesce(jsonb_agg(jsonb_build_object('kind', x.kind, 'text', x.text)
                                                     ORDER BY x.kind, x.ord), '[]')
                           FROM artifact_text x WHERE x.sha256 = a.sha256
                              OR (x.event_id = a.event_id AND x.position = a.position)) AS texts
                   FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                   WHERE a.user_id = %s ORDER BY a.thread_id, a.event_id, a.position""",
                (user_id,),
            ).fetchall()
        return {
            "user_id": user_id,
            "exported_at": datetime.now(UTC),
            "threads": threads,
            "events": events,
            "messages": messages,
            "episodes": episodes,
            "summaries": summaries,
            "facts": facts,
            "attachments": files,
        }
