"""Recall's candidate queries: full text over GIN (lexemes scored as BM25 by the domain),
vectors over HNSW with iterative scan, over messages, summaries, attachment texts and facts,
with what their citations need. Every query takes the thread list or user id the domain
resolved from the caller; nothing from a request is spliced into SQL (the vector size is an
int from settings)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any, TypeVar

import numpy as np
import psycopg

from chatmem.adapters.read_pg import PostgresReader, ReadConnections
from chatmem.memory.dates import Period
from chatmem.memory.recall import ArtifactCandidate, FoundFact, Hops, SummaryCandidate, TermStats, TurnCandidate
from chatmem.schemas.read import Citation

C = TypeVar("C", TurnCandidate, SummaryCandidate, ArtifactCandidate)

# A query's lexemes as an OR query. Lexemes come from to_tsvector, so quoting is all they need;
# quote_literal would switch to E'' syntax for a backslash, which tsquery does not read.
_OR_QUERY = """(SELECT coalesce(string_agg(quote_literal(l), ' | '), '')::tsquery
                FROM unnest(%(lex)s::text[]) l WHERE position(E'\\\\' IN l) = 0)"""

# How often each query lexeme occurs in a row (only asked of rows that match): the row's text
# vector cut down to the query's lexemes (weight A marks them), as text, counted by
# `term_counts`. Unnesting each row's vector once per query lexeme was a fifth of the turn
# search's time in Postgres (docs/benchmarks.md).
_TERM_FREQUENCIES = "ts_filter(setweight({t}.tsv, 'A', %(lex)s::text[]), '{{a}}')::text"
# One entry of a text vector's text form: 'lexeme' or 'lexeme':1A,5A (quote and backslash doubled).
_ENTRY = re.compile(r"'((?:[^']|'')*)'(?::(\S+))?")
_ESCAPED = re.compile(r"''|\\\\")


# BM25's collection figures over a scope's rows of `table`: size (`docs`, an SQL expression),
# mean length, and the document frequency of each query lexeme. The rows that match the text
# query are found once, through the scope's threads (counting each lexeme through the text index
# visited its rows in every thread: 430 ms a recall at 1M messages), then tested against each
# lexeme's own query (half the time of unnesting every row's lexemes). The
# mean length is taken over at most AVG_LEN_ROWS of the scope's rows: it only scales length
# normalisation, and over a heavy user's 20,000 messages the exact figure cost 10 ms a recall.
AVG_LEN_ROWS = 2000
_COUNT = "(SELECT count(*) FROM {table} x JOIN scope USING (thread_id, generation))"
_STATS = """SELECT {docs} AS docs,
       (SELECT avg(length(y.tsv)) FROM (SELECT x.tsv FROM {table} x JOIN scope USING (thread_id, generation)
                                        LIMIT %(avg_rows)s) y) AS avg_len,
       ARRAY(SELECT coalesce(df.n, 0) FROM unnest(%(lex)s::text[]) WITH ORDINALITY AS l(lexeme, i)
             LEFT JOIN (WITH hit AS MATERIALIZED (SELECT x.tsv FROM {table} x JOIN scope USING (thread_id, generation),
                                                   q WHERE x.tsv @@ q.tsq)
                        SELECT lq.i, count(*) AS n
                        FROM hit, (SELECT i, quote_literal(l)::tsquery AS tq
                                   FROM unnest(%(lex)s::text[]) WITH ORDINALITY AS a(l, i)
                                   WHERE position(E'\\\\' IN l) = 0) lq
                        WHERE hit.tsv @@ lq.tq GROUP BY lq.i) df
             ON df.i = l.i ORDER BY l.i) AS df"""

# Up to this many messages in scope, vector search is exact (thread index + sort); above, HNSW.
EXACT_SCAN_MAX = 20_000

# Citations of the facts in `hits` (id, rank): their first source event, its message, and the
# platform ids of every source message. The facts are chosen first, then joined.
_FACT_CITED = """
    SELECT f.id, f.thread_id, f.episode_id, f.text, f.category, hits.rank,
           m.seq, m.episode_id, m.platform_message_id, e.event_id, e.occurred_at,
           ARRAY(SELECT m2.platform_message_id FROM messages m2 JOIN threads t2 USING (thread_id)
                 WHERE m2.event_id = ANY(f.source_event_ids) AND m2.generation = t2.generation
                 AND m2.platform_message_id IS NOT NULL ORDER BY m2.seq)
    FROM hits JOIN facts f ON f.id = hits.id
    LEFT JOIN events e ON e.event_id = f.source_event_ids[1]
    LEFT JOIN threads t ON t.thread_id = e.thread_id
    LEFT JOIN messages m ON m.event_id = e.event_id AND m.thread_id = e.thread_id AND m.generation = t.generation
    ORDER BY hits.rank DESC, f.id
"""


def _vec_ok(alias: str, d: int) -> str:
    """The row's vector is comparable with the query's: same size, same model. The model test is
    `coalesce(embed_model, legacy) = model` written so that the planner can use the column's
    statistics (it guessed one row in 200 for the coalesce)."""
    return (
        f"vector_dims({alias}.embedding) = {d}"
        f" AND ({alias}.embed_model = %(model)s OR ({alias}.embed_model IS NULL AND %(legacy)s = %(model)s))"
    )


class PostgresRecallReader(PostgresReader):
    """The `RecallStore` of memory/recall.py."""

    def __init__(self, connections: ReadConnections, query_model: Callable[[], str], legacy_model: str):
        super().__init__(connections)
        # Vectors are compared only with those of the query's model: `query_model` names the
        # model the query embedder uses now; rows written before models were recorded (NULL)
        # are the configured one's.
        self.query_model = query_model
        self.legacy_model = legacy_model

    def _vector_params(self, qvec: np.ndarray) -> tuple[int, dict[str, str]]:
        """The query's dimension (from the vector itself, so a model switch between embedding
        and reading never makes a malformed query) and the model filter."""
        return int(len(qvec)), {"model": self.query_model(), "legacy": self.legacy_model}

    def _search_params(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[int, dict[str, Any]]:
        """What every candidate query binds: the scope, the query's lexemes and vector, the list
        size, the model filter, and how many rows BM25's mean length reads."""
        d, models = self._vector_params(qvec)
        return d, {
            **models,
            "threads": list(threads),
            "lex": list(lexemes),
            "q": qvec,
            "n": limit,
            "avg_rows": AVG_LEN_ROWS,
        }

    def lexemes(self, text: str) -> list[str]:
        with self._conn() as conn:
            row = conn.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", (text,)).fetchone()
        return list(row[0]) if row else []

    # --- recall candidates ------------------------------------------------------------------
    def turn_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, period: Period | None
    ) -> tuple[list[TurnCandidate], TermStats]:
        d, params = self._search_params(threads, lexemes, qvec, limit)
        params |= {
            # Whole days in UTC, as stored; NULL bounds select nothing.
            "d0": datetime.combine(period.first, time(), UTC) if period else None,
            "d1": datetime.combine(period.last + timedelta(days=1), time(), UTC) if period else None,
        }
        sql = f"""
        WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s)),
        q AS (SELECT {_OR_QUERY} AS tsq),
        lex AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation), q
                WHERE m.tsv @@ q.tsq ORDER BY ts_rank(m.tsv, q.tsq) DESC LIMIT %(n)s),
        dense AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation)
                  WHERE {_vec_ok("m", d)}
                  ORDER BY (m.embedding::vector({d}) <=> %(q)s::vector({d})){{exact}} LIMIT %(n)s),
        -- The turns sent on the day or month the query names, through an index, never a scan.
        dated AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation)
                  WHERE m.occurred_at >= %(d0)s AND m.occurred_at < %(d1)s AND {_vec_ok("m", d)}
                  ORDER BY m.embedding::vector({d}) <=> %(q)s::vector({d}) LIMIT %(n)s),
        pool AS (SELECT * FROM lex UNION SELECT * FROM dense UNION SELECT * FROM dated),
        -- BM25's collection figures over the whole scope: size, mean length, document frequencies.
        -- The scope's size is the threads' message counts, read first (a count scanned them all).
        stats AS ({_STATS.format(table="messages", docs="%(docs)s::bigint")})
        SELECT {_turn_columns(d)}, stats.docs, stats.avg_len, stats.df
        FROM pool JOIN scope s USING (thread_id)
        JOIN messages m ON m.thread_id = pool.thread_id AND m.generation = s.generation AND m.seq = pool.seq,
        q, stats"""
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                "SELECT coalesce(sum(message_count), 0) FROM threads WHERE thread_id = ANY(%s)", (list(threads),)
            ).fetchone()
            size = row[0] if row else 0  # an aggregate: always one row
            if size > EXACT_SCAN_MAX:
                # Filtered vector queries keep scanning the HNSW graph until they have `limit` rows.
                conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                conn.execute("SET LOCAL hnsw.ef_search = 100")
            # A small scope is read through its thread index and sorted exactly ("+ 0" keeps the
            # planner off the HNSW index, which would walk the whole graph to find a few rows).
            sql = sql.replace("{exact}", "" if size > EXACT_SCAN_MAX else " + 0")
            rows = conn.execute(sql, {**params, "docs": size}).fetchall()
        if not rows:
            return [], TermStats(0, 0.0, (0,) * len(lexemes))
        return _turns(rows, lexemes), _row_stats(rows[0][14:17])

    def hop_turns(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, hops: Hops
    ) -> list[TurnCandidate]:
        if not (hops.episodes or hops.ranges or hops.events):
            return []
        d, params = self._search_params(threads, lexemes, qvec, limit)
        params |= {
            "eps": list(hops.episodes),
            "r_thread": [r[0] for r in hops.ranges],
            "r_from": [r[1] for r in hops.ranges],
            "r_upto": [r[2] for r in hops.ranges],
            "events": list(hops.events),
        }
        sql = f"""
        WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s)),
        q AS (SELECT {_OR_QUERY} AS tsq),
        -- Each through an index, never a scan: the closest turns of the best episodes and of the
        -- ranges the best summaries cover, and the turns facts came from. Few rows, sorted exactly
        -- ("+ 0": never the HNSW index, whose filtered scan needs the settings of a large scope).
        episode_best AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation)
                         WHERE m.episode_id = ANY(%(eps)s) AND {_vec_ok("m", d)}
                         ORDER BY (m.embedding::vector({d}) <=> %(q)s::vector({d})) + 0 LIMIT %(n)s),
        range_best AS (SELECT m.thread_id, m.seq
                       FROM unnest(%(r_thread)s::text[], %(r_from)s::int[], %(r_upto)s::int[]) r(thread_id, lo, hi)
                       JOIN scope s USING (thread_id)
                       JOIN messages m ON m.thread_id = r.thread_id AND m.generation = s.generation
                                      AND m.seq BETWEEN r.lo AND r.hi
                       WHERE {_vec_ok("m", d)}
                       ORDER BY (m.embedding::vector({d}) <=> %(q)s::vector({d})) + 0 LIMIT %(n)s),
        sources AS (SELECT m.thread_id, m.seq FROM messages m JOIN scope s USING (thread_id, generation)
                    WHERE m.event_id = ANY(%(events)s)),
        pool AS (SELECT * FROM episode_best UNION SELECT * FROM range_best UNION SELECT * FROM sources)
        SELECT {_turn_columns(d)}
        FROM pool JOIN scope s USING (thread_id)
        JOIN messages m ON m.thread_id = pool.thread_id AND m.generation = s.generation AND m.seq = pool.seq, q"""
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        return _turns(rows, lexemes)

    def neighbours(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        if not keys:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                """SELECT m.thread_id, m.seq,
                          CASE WHEN m.role = 'user' THEN m.user_id ELSE m.role END || ': ' || m.text
                   FROM unnest(%s::text[], %s::int[]) k(thread_id, seq)
                   JOIN threads t ON t.thread_id = k.thread_id
                   JOIN messages m ON m.thread_id = k.thread_id AND m.generation = t.generation AND m.seq = k.seq""",
                ([k[0] for k in keys], [k[1] for k in keys]),
            ).fetchall()
        return {(r[0], r[1]): r[2] for r in rows}

    def summary_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[SummaryCandidate], TermStats]:
        d, params = self._search_params(threads, lexemes, qvec, limit)
        sql = f"""
        WITH scope AS (SELECT thread_id, generation FROM threads WHERE thread_id = ANY(%(threads)s)),
        q AS (SELECT {_OR_QUERY} AS tsq),
        lex AS (SELECT s.id FROM summaries s JOIN scope USING (thread_id, generation), q
                WHERE s.tsv @@ q.tsq ORDER BY ts_rank(s.tsv, q.tsq) DESC LIMIT %(n)s),
        dense AS (SELECT s.id FROM summaries s JOIN scope USING (thread_id, generation)
                  WHERE {_vec_ok("s", d)}
                  ORDER BY (s.embedding::vector({d}) <=> %(q)s::vector({d})) + 0 LIMIT %(n)s),
        pool AS (SELECT id FROM lex UNION SELECT id FROM dense),
        stats AS ({_STATS.format(table="summaries", docs=_COUNT.format(table="summaries"))})
        SELECT s.id, s.thread_id, s.episode_id, s.kind, s.level, s.from_seq, s.upto_seq, s.text, s.is_active,
               CASE WHEN {_vec_ok("s", d)}
                    THEN 1 - (s.embedding::vector({d}) <=> %(q)s::vector({d})) ELSE 0 END,
               CASE WHEN s.tsv @@ q.tsq THEN {_TERM_FREQUENCIES.format(t="s")} END,
               length(s.tsv), stats.docs, stats.avg_len, stats.df
        FROM pool JOIN summaries s USING (id), q, stats"""
        # Summaries are about a tenth of the messages: read through the thread index, exactly.
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        if not rows:
            return [], TermStats(0, 0.0, (0,) * len(lexemes))
        return [_candidate(SummaryCandidate, r, 9, lexemes) for r in rows], _row_stats(rows[0][12:15])

    def summary_sources(self, summary: SummaryCandidate) -> list[str]:
        with self._conn() as conn:
            rows = conn.execute(
                """SELECT m.platform_message_id FROM messages m JOIN threads t USING (thread_id)
                   WHERE m.thread_id = %s AND m.generation = t.generation AND m.seq BETWEEN %s AND %s
                   AND m.platform_message_id IS NOT NULL ORDER BY m.seq""",
                (summary.thread_id, summary.from_seq, summary.upto_seq),
            ).fetchall()
        return [r[0] for r in rows]

    # --- attachments ----------------------------------------------------------------------------
    def artifact_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[ArtifactCandidate], TermStats]:
        d, params = self._search_params(threads, lexemes, qvec, limit)
        # Visible texts: what was derived from files linked in these threads, and their captions.
        visible = """
        refs AS (SELECT event_id, position, sha256, thread_id, created_at FROM attachments
                 WHERE thread_id = ANY(%(threads)s) AND status = 'linked'),
        visible AS (SELECT t.id FROM artifact_text t WHERE t.sha256 IN (SELECT sha256 FROM refs)
                    UNION ALL
                    SELECT t.id FROM artifact_text t
                    JOIN refs r ON t.event_id = r.event_id AND t.position = r.position)"""
        sql = f"""
        WITH {visible},
        q AS (SELECT {_OR_QUERY} AS tsq),
        lex AS (SELECT t.id FROM artifact_text t JOIN visible USING (id), q
                WHERE t.tsv @@ q.tsq ORDER BY ts_rank(t.tsv, q.tsq) DESC LIMIT %(n)s),
        dense AS (SELECT t.id FROM artifact_text t JOIN visible USING (id)
                  WHERE {_vec_ok("t", d)}
                  ORDER BY (t.embedding::vector({d}) <=> %(q)s::vector({d})) + 0 LIMIT %(n)s),
        pool AS (SELECT id FROM lex UNION SELECT id FROM dense)
        SELECT t.id, ref.sha256, ar.kind, t.kind, t.text, t.meta,
               m.thread_id, m.episode_id, m.seq, m.event_id, ref.position, m.platform_message_id, m.user_id,
               m.role, m.occurred_at, att.ref ->> 'filename',
               CASE WHEN {_vec_ok("t", d)}
                    THEN 1 - (t.embedding::vector({d}) <=> %(q)s::vector({d})) ELSE 0 END,
               CASE WHEN t.tsv @@ q.tsq THEN {_TERM_FREQUENCIES.format(t="t")} END,
               length(t.tsv)
        FROM pool JOIN artifact_text t USING (id) CROSS JOIN q
        CROSS JOIN LATERAL (
            SELECT r.event_id, r.position, r.sha256, r.thread_id FROM refs r
            WHERE r.sha256 = t.sha256 OR (r.event_id = t.event_id AND r.position = t.position)
            ORDER BY r.created_at DESC LIMIT 1) ref
        JOIN threads th ON th.thread_id = ref.thread_id
        JOIN messages m ON m.thread_id = ref.thread_id AND m.generation = th.generation AND m.event_id = ref.event_id
        JOIN attachments att ON att.event_id = ref.event_id AND att.position = ref.position
        LEFT JOIN artifacts ar ON ar.sha256 = ref.sha256"""
        with self._conn() as conn, conn.transaction():
            # Most threads share no files: an index probe spares them the search.
            linked = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM attachments WHERE thread_id = ANY(%(threads)s) AND status = 'linked')",
                params,
            ).fetchone()
            rows = conn.execute(sql, params).fetchall() if linked and linked[0] else []
            if not rows:  # nothing to rank, so no collection figures
                return [], TermStats(0, 0.0, (0,) * len(lexemes))
            stat_rows = conn.execute(
                f"WITH {visible} SELECT tsvector_to_array(t.tsv) FROM artifact_text t JOIN visible USING (id)", params
            ).fetchall()
        stats = _term_stats(list(lexemes), [r[0] for r in stat_rows])
        items = [_candidate(ArtifactCandidate, r, 16, lexemes) for r in rows]
        return items, stats

    # --- facts ------------------------------------------------------------------------------
    def fact_candidates(self, user_id: str, lexemes: Sequence[str], limit: int) -> list[FoundFact]:
        hits = f"""q AS (SELECT {_OR_QUERY} AS tsq),
            hits AS (SELECT f.id, ts_rank(f.tsv, q.tsq) AS rank FROM facts f, q
                     WHERE f.user_id = %(user)s AND f.is_active AND f.tsv @@ q.tsq
                     ORDER BY rank DESC, f.id LIMIT %(n)s)"""
        with self._conn() as conn:
            return cited_facts(conn, hits, {"lex": list(lexemes), "user": user_id, "n": limit})

    def facts_by_id(self, user_id: str, fact_ids: Sequence[int]) -> list[FoundFact]:
        if not fact_ids:
            return []
        hits = """hits AS (SELECT id, 0.0::real AS rank FROM facts
                           WHERE user_id = %(user)s AND is_active AND id = ANY(%(ids)s))"""
        with self._conn() as conn:
            return cited_facts(conn, hits, {"user": user_id, "ids": list(fact_ids)})


def cited_facts(conn: psycopg.Connection, hits_sql: str, params: Mapping[str, Any]) -> list[FoundFact]:
    """The facts a `hits` CTE (id, rank) chose, best first, each with its citation."""
    rows = conn.execute(f"WITH {hits_sql} {_FACT_CITED}", params).fetchall()
    return [_fact(r) for r in rows]


def _fact(r: tuple[Any, ...]) -> FoundFact:
    fid, thread_id, episode_id, text, category, rank, seq, m_episode, platform_id, event_id, at, ids = r
    return FoundFact(
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


def _turn_columns(d: int) -> str:
    """A turn candidate's columns (`_turns` reads them): the turn, its similarity to the query,
    term frequencies when it matches the text query, length, whether the query names its author."""
    return f"""m.thread_id, m.seq, m.episode_id, m.event_id, m.platform_message_id, m.user_id, m.role, m.text,
               m.occurred_at, m.is_active,
               CASE WHEN {_vec_ok("m", d)}
                    THEN 1 - (m.embedding::vector({d}) <=> %(q)s::vector({d})) ELSE 0 END,
               CASE WHEN m.tsv @@ q.tsq THEN {_TERM_FREQUENCIES.format(t="m")} END,
               length(m.tsv), tsvector_to_array(to_tsvector('english', m.user_id)) && %(lex)s::text[]"""


def _turns(rows: Sequence[tuple[Any, ...]], lexemes: Sequence[str]) -> list[TurnCandidate]:
    return [_candidate(TurnCandidate, r, 10, lexemes, author_named=bool(r[13])) for r in rows]


def _candidate(make: Callable[..., C], r: tuple[Any, ...], fields: int, lexemes: Sequence[str], **extra: Any) -> C:
    """A candidate from its row: `fields` columns as they are, then its vector similarity, its
    text vector's query lexemes (`_TERM_FREQUENCIES`; NULL when the row did not match the text
    query) and text length."""
    sim, matched, length = r[fields : fields + 3]
    return make(*r[:fields], sim=float(sim), tf=term_counts(matched, lexemes), length=int(length), **extra)


def term_counts(vector_text: str | None, lexemes: Sequence[str]) -> tuple[int, ...]:
    """How often each of `lexemes` occurs in a text vector given in its text form (its number
    of positions; 1 for a lexeme stored without positions, 0 for one it lacks)."""
    if not vector_text:
        return (0,) * len(lexemes)
    found: dict[str, int] = {}
    for lexeme, positions in _ENTRY.findall(vector_text):
        if "'" in lexeme or "\\" in lexeme:
            lexeme = _ESCAPED.sub(lambda m: m.group(0)[0], lexeme)
        found[lexeme] = positions.count(",") + 1 if positions else 1
    return tuple(found.get(lexeme, 0) for lexeme in lexemes)


def _row_stats(cols: tuple[Any, ...]) -> TermStats:
    """TermStats from the docs, avg_len and df columns of `_STATS`."""
    docs, avg_len, df = cols
    return TermStats(int(docs or 0), float(avg_len or 0.0), tuple(int(x) for x in df))


def _term_stats(lexemes: list[str], vectors: list[list[str]]) -> TermStats:
    """Document frequencies straight from the rows' lexeme arrays (for small document sets)."""
    docs = len(vectors)
    sets = [set(v) for v in vectors]
    df = tuple(sum(1 for s in sets if term in s) for term in lexemes)
    return TermStats(docs, (sum(len(v) for v in vectors) / docs) if docs else 0.0, df)
