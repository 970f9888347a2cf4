"""The queries behind build_context (memory/context.py): a thread's running summary, its
summaries by level, its recent turns, and the user's top facts with their citations."""

from __future__ import annotations

from psycopg.rows import dict_row

from chatmem.adapters.read_pg import PostgresReader
from chatmem.adapters.recall_pg import cited_facts
from chatmem.memory.context import ContextTurn, ThreadSnapshot
from chatmem.memory.recall import FoundFact
from chatmem.schemas.read import Citation


class PostgresContextReader(PostgresReader):
    """The `ContextStore` of memory/context.py."""

    def snapshot(self, thread_id: str, recent_limit: int) -> ThreadSnapshot:
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            gen = cur.execute("SELECT generation FROM threads WHERE thread_id = %s", (thread_id,)).fetchone()
            if gen is None:
                return ThreadSnapshot(thread_id, None, None, [], [])
            g = gen["generation"]
            running = cur.execute(
                """SELECT s.text, s.content, s.episode_id, s.from_seq, s.upto_seq FROM summaries s
                   JOIN threads t ON t.thread_id = s.thread_id AND t.generation = s.generation
                   WHERE s.thread_id = %s AND s.kind = 'running' AND s.is_active
                   AND s.episode_id = (t.current_episode->>'episode_id')
                   ORDER BY s.upto_seq DESC LIMIT 1""",
                (thread_id,),
            ).fetchone()
            summaries = cur.execute(
                """SELECT text, episode_id, from_seq, upto_seq, level, kind FROM summaries
                   WHERE thread_id = %s AND generation = %s AND is_active AND kind IN ('final', 'rollup', 'chunk')
                   ORDER BY level DESC, upto_seq DESC""",
                (thread_id, g),
            ).fetchall()
            recent = cur.execute(
                """SELECT seq, episode_id, user_id, role, text, platform_message_id, event_id, occurred_at
                   FROM messages WHERE thread_id = %s AND generation = %s ORDER BY seq DESC LIMIT %s""",
                (thread_id, g, recent_limit),
            ).fetchall()
        turns = [
            ContextTurn(
                text=r["text"],
                role=r["role"],
                author=r["user_id"],
                citation=Citation(
                    source="message",
                    thread_id=thread_id,
                    episode_id=r["episode_id"],
                    seq=r["seq"],
                    platform_message_id=r["platform_message_id"],
                    event_id=r["event_id"],
                    occurred_at=r["occurred_at"],
                ),
            )
            for r in recent
        ]
        return ThreadSnapshot(thread_id, g, running, summaries, turns)

    def user_facts(self, user_id: str, limit: int) -> list[FoundFact]:
        """The user's active facts, most important and confident first."""
        hits = """hits AS (SELECT id, importance * confidence AS rank FROM facts
                           WHERE user_id = %(user)s AND is_active ORDER BY rank DESC, id DESC LIMIT %(n)s)"""
        with self._conn() as conn:
            return cited_facts(conn, hits, {"user": user_id, "n": limit})
