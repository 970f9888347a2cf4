"""The read path's queries: candidates for recall (full text over GIN, vectors over HNSW with
iterative scan), the sections of a context, thread membership. Every query takes the thread
list or user id the domain resolved from the caller; nothing from a request is spliced into
SQL (the vector size is an int from settings)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from memory.context import ContextTurn, ThreadSnapshot
from memory.recall import FactCandidate, SummaryCandidate, TermStats, TurnCandidate
from schemas.read import Citation

# A query's lexemes as an OR query. Lexemes come from to_tsvector, so quoting is all they need;
# quote_literal would switch to E'' syntax for a backslash, which tsquery does not read.
_OR_QUERY = """(SELECT coalesce(string_agg(quote_literal(l), ' | '), '')::tsquery
                FROM unnest(%(lex)s::text[]) l WHERE position(E'\\\\' IN l) = 0)"""

# How often each query lexeme occurs in a row's text vector (only computed for rows that match).
_TERM_FREQUENCIES = """ARRAY(SELECT coalesce((SELECT coalesce(array_length(u.positions, 1), 1)
                                    FROM unnest({t}.tsv) u WHERE u.lexeme = l), 0)
                   FROM unnest(%(lex)s::text[]) WITH ORDINALITY AS x(l, i) ORDER BY i)"""


class PostgresReader:
    def __init__(self, pool: ConnectionPool, vector_dim: int):
        self.pool = pool
        self.dim = int(vector_dim)

    # --- scope ---------------------------------------------------------------------------
    def readable_threads(self, user_id: str, thread_id: str | None) -> list[str]:
        with self.pool.connection() as conn:
            if thread_id is not None:
                rows = conn.execute(
                    "SELECT thread_id FROM thread_members WHERE user_id = %s AND thread_id = %s", (user_id, thread_id)
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT thread_id FROM thread_members WHERE user_id = %s ORDER BY thread_id", (user_id,)
                ).fetchall()
        return [r[0] for r in rows]

    def threads_of(self, user_id: str) -> list[dict]:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT t.thread_id, t.generation, t.message_count, t.episode_count, t.updated_at,
                          (SELECT max(occurred_at) FROM messages m WHERE m.thread_id = t.thread_id
                           AND m.generation = t.generation) AS last_message_at
                   FROM thread_members tm JOIN threads t USING (thread_id)
                   WHERE tm.user_id = %s ORDER BY last_message_at DESC NULLS LAST, t.thread_id""",
                (user_id,),
            ).fetchall()

    def lexemes(self, text: str) -> list[str]:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", (text,)).fetchone()
        return list(row[0]) if row else []

    # --- recall candidates ------------------------------------------------------------------
    def turn_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, episodes: Sequence[str]
    ) -> tuple[list[TurnCandidate], TermStats]:
        d = self.dim
        params = {"threads": list(threads), "lex": list(lexemes), "q": qvec, "n": limit, "eps": list(episodes)}
        sql = f"""
        WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s)),
        q AS (SELECT {_OR_QUERY} AS tsq),
        lex AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation), q
                WHERE m.tsv @@ q.tsq ORDER BY ts_rank(m.tsv, q.tsq) DESC LIMIT %(n)s),
        dense AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation)
                  WHERE vector_dims(m.embedding) = {d}
                  ORDER BY m.embedding::vector({d}) <=> %(q)s::vector({d}) LIMIT %(n)s),
        episode_best AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation)
                         WHERE m.episode_id = ANY(%(eps)s) AND vector_dims(m.embedding) = {d}
                         ORDER BY m.embedding::vector({d}) <=> %(q)s::vector({d}) LIMIT %(n)s),
        pool AS (SELECT * FROM lex UNION SELECT * FROM dense UNION SELECT * FROM episode_best)
        SELECT m.thread_id, m.seq, m.episode_id, m.event_id, m.platform_message_id, m.user_id, m.role, m.text,
               m.occurred_at, m.is_active,
               CASE WHEN vector_dims(m.embedding) = {d}
                    THEN 1 - (m.embedding::vector({d}) <=> %(q)s::vector({d})) ELSE 0 END,
               CASE WHEN m.tsv @@ q.tsq THEN {_TERM_FREQUENCIES.format(t="m")} END,
               length(m.tsv)
        FROM pool JOIN scope s USING (thread_id)
        JOIN messages m ON m.thread_id = pool.thread_id AND m.generation = s.generation AND m.seq = pool.seq, q"""
        stats_sql = f"""
        WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s)),
        q AS (SELECT {_OR_QUERY} AS tsq)
        SELECT (SELECT count(*) FROM messages m JOIN scope USING (thread_id, generation)),
               (SELECT avg(length(m.tsv)) FROM messages m JOIN scope USING (thread_id, generation)),
               ARRAY(SELECT coalesce(df.n, 0) FROM unnest(%(lex)s::text[]) WITH ORDINALITY AS x(l, i)
                     LEFT JOIN (SELECT u.lexeme, count(*) AS n
                                FROM messages m JOIN scope USING (thread_id, generation), q, unnest(m.tsv) u
                                WHERE m.tsv @@ q.tsq AND u.lexeme = ANY(%(lex)s) GROUP BY u.lexeme) df
                     ON df.lexeme = x.l ORDER BY x.i)"""
        with self.pool.connection() as conn, conn.transaction():
            # Filtered vector queries keep scanning the HNSW graph until they have `limit` rows.
            conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            conn.execute("SET LOCAL hnsw.ef_search = 100")
            rows = conn.execute(sql, params).fetchall()
            docs, avg_len, df = conn.execute(stats_sql, params).fetchone()
        zero = (0,) * len(lexemes)
        turns = [
            TurnCandidate(*r[:10], sim=float(r[10]), tf=tuple(r[11]) if r[11] else zero, length=int(r[12]))
            for r in rows
        ]
        return turns, TermStats(int(docs or 0), float(avg_len or 0.0), tuple(int(x) for x in df))

    def neighbours(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        if not keys:
            return {}
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT m.thread_id, m.seq, m.user_id || ': ' || m.text
                   FROM unnest(%s::text[], %s::int[]) k(thread_id, seq)
                   JOIN threads t ON t.thread_id = k.thread_id
                   JOIN messages m ON m.thread_id = k.thread_id AND m.generation = t.generation AND m.seq = k.seq""",
                ([k[0] for k in keys], [k[1] for k in keys]),
            ).fetchall()
        return {(r[0], r[1]): r[2] for r in rows}

    def summary_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[SummaryCandidate], TermStats]:
        d = self.dim
        params = {"threads": list(threads), "lex": list(lexemes), "q": qvec, "n": limit}
        sql = f"""
        WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s)),
        q AS (SELECT {_OR_QUERY} AS tsq),
        lex AS (SELECT s.id FROM summaries s JOIN scope USING (thread_id, generation), q
                WHERE s.tsv @@ q.tsq ORDER BY ts_rank(s.tsv, q.tsq) DESC LIMIT %(n)s),
        dense AS (SELECT s.id FROM summaries s JOIN scope USING (thread_id, generation)
                  WHERE vector_dims(s.embedding) = {d}
                  ORDER BY s.embedding::vector({d}) <=> %(q)s::vector({d}) LIMIT %(n)s),
        pool AS (SELECT id FROM lex UNION SELECT id FROM dense)
        SELECT s.id, s.thread_id, s.episode_id, s.kind, s.level, s.from_seq, s.upto_seq, s.text, s.is_active,
               CASE WHEN vector_dims(s.embedding) = {d}
                    THEN 1 - (s.embedding::vector({d}) <=> %(q)s::vector({d})) ELSE 0 END,
               CASE WHEN s.tsv @@ q.tsq THEN {_TERM_FREQUENCIES.format(t="s")} END,
               length(s.tsv)
        FROM pool JOIN summaries s USING (id), q"""
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            rows = conn.execute(sql, params).fetchall()
            # Summaries are few per thread: document frequencies straight from the rows.
            stat_rows = conn.execute(
                """WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s))
                   SELECT tsvector_to_array(s.tsv) FROM summaries s JOIN scope USING (thread_id, generation)""",
                params,
            ).fetchall()
        lex = list(lexemes)
        docs = len(stat_rows)
        lengths = [len(r[0]) for r in stat_rows]
        sets = [set(r[0]) for r in stat_rows]
        df = tuple(sum(1 for s in sets if term in s) for term in lex)
        stats = TermStats(docs, (sum(lengths) / docs) if docs else 0.0, df)
        zero = (0,) * len(lex)
        summaries = [
            SummaryCandidate(*r[:9], sim=float(r[9]), tf=tuple(r[10]) if r[10] else zero, length=int(r[11]))
            for r in rows
        ]
        return summaries, stats

    def summary_sources(self, summary: SummaryCandidate) -> list[str]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT m.platform_message_id FROM messages m JOIN threads t USING (thread_id)
                   WHERE m.thread_id = %s AND m.generation = t.generation AND m.seq BETWEEN %s AND %s
                   AND m.platform_message_id IS NOT NULL ORDER BY m.seq""",
                (summary.thread_id, summary.from_seq, summary.upto_seq),
            ).fetchall()
        return [r[0] for r in rows]

    # --- facts ------------------------------------------------------------------------------
    _FACT_SELECT = """
        SELECT f.id, f.thread_id, f.episode_id, f.text, f.category, {rank},
               f.source_event_ids, m.seq, m.episode_id, m.platform_message_id, e.event_id, e.occurred_at,
               ARRAY(SELECT m2.platform_message_id FROM messages m2 JOIN threads t2 USING (thread_id)
                     WHERE m2.event_id = ANY(f.source_event_ids) AND m2.generation = t2.generation
                     AND m2.platform_message_id IS NOT NULL ORDER BY m2.seq)
        FROM facts f
        LEFT JOIN events e ON e.event_id = f.source_event_ids[1]
        LEFT JOIN threads t ON t.thread_id = e.thread_id
        LEFT JOIN messages m ON m.event_id = e.event_id AND m.thread_id = e.thread_id AND m.generation = t.generation
    """

    def fact_candidates(self, user_id: str, lexemes: Sequence[str], limit: int) -> list[FactCandidate]:
        sql = (
            f"WITH q AS (SELECT {_OR_QUERY} AS tsq) "
            + self._FACT_SELECT.format(rank="ts_rank(f.tsv, q.tsq)")
            + ", q WHERE f.user_id = %(user)s AND f.is_active AND f.tsv @@ q.tsq "
            "ORDER BY ts_rank(f.tsv, q.tsq) DESC, f.id LIMIT %(n)s"
        )
        with self.pool.connection() as conn:
            rows = conn.execute(sql, {"lex": list(lexemes), "user": user_id, "n": limit}).fetchall()
        return [_fact(r) for r in rows]

    def facts_by_id(self, user_id: str, fact_ids: Sequence[int]) -> list[FactCandidate]:
        if not fact_ids:
            return []
        sql = self._FACT_SELECT.format(rank="0.0") + " WHERE f.user_id = %s AND f.is_active AND f.id = ANY(%s)"
        with self.pool.connection() as conn:
            rows = conn.execute(sql, (user_id, list(fact_ids))).fetchall()
        return [_fact(r) for r in rows]

    def user_facts(self, user_id: str, limit: int) -> list[FactCandidate]:
        sql = (
            self._FACT_SELECT.format(rank="f.importance * f.confidence")
            + " WHERE f.user_id = %s AND f.is_active ORDER BY f.importance * f.confidence DESC, f.id DESC LIMIT %s"
        )
        with self.pool.connection() as conn:
            rows = conn.execute(sql, (user_id, limit)).fetchall()
        return [_fact(r) for r in rows]

    # --- context ------------------------------------------------------------------------------
    def snapshot(self, thread_id: str, recent_limit: int) -> ThreadSnapshot:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
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

    # --- browsing -----------------------------------------------------------------------------
    def episodes(self, thread_id: str) -> list[dict]:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT e.episode_id, e.ordinal, e.status, e.start_seq, e.end_seq, e.opened_by, e.closed_by,
                          e.started_at, e.ended_at, e.topic_label,
                          (SELECT count(*) FROM messages m WHERE m.episode_id = e.episode_id
                           AND m.generation = e.generation) AS messages
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   WHERE e.thread_id = %s ORDER BY e.ordinal""",
                (thread_id,),
            ).fetchall()

    def episode(self, episode_id: str) -> dict | None:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
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


def _fact(r: tuple) -> FactCandidate:
    fid, thread_id, episode_id, text, category, rank, _events, seq, m_episode, platform_id, event_id, at, ids = r
    return FactCandidate(
        fact_id=int(fid),
        thread_id=thread_id,
        episode_id=episode_id,
        text=text,
        category=category,
        rank=float(rank),
        citation=Citation(
            source="fact",
            thread_id=thread_id,
            episode_id=m_episode or episode_id,
            seq=seq,
            platform_message_id=platform_id,
            event_id=event_id,
            occurred_at=at,
            source_ids=list(ids or []),
        ),
    )
