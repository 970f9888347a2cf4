"""The summary store: summaries per generation (running, chunk, final, rollup) as the summary
jobs read and write them (memory/summaries.py), their vectors, and the finals a lost job left
undone (for the sweeper)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from chatmem.adapters.keys_pg import EventKeys, wrapped_key_sql
from chatmem.adapters.sql import one
from chatmem.memory.episodes import Job, author_name, log_text
from chatmem.memory.offline_llm import OfflineLLM
from chatmem.memory.ports import Embedder, concrete
from chatmem.memory.prompts import Line
from chatmem.memory.summaries import LevelItem, StaleGeneration, SummaryRecord

OFFLINE_MODEL = OfflineLLM.model


# A final or roll-up summary in one statement (a rebuild saves one per episode): the thread's
# generation checked and held, the summary inserted unless present, and only if it was, its
# sources and its episode's running and chunk summaries archived, and the episode (with it its
# messages) archived and its topic set. Every part reads the rows as they were before the
# statement; none of them touches the row inserted. The episode id (thread id and ordinal)
# picks the rows by the episode indexes: a generation a rebuild is writing has no statistics
# yet, and by generation the planner took an index that walks the whole thread (`generation + 0`
# keeps it off (generation, key)).
_SAVE_WHOLE = """
WITH t AS (SELECT generation FROM threads WHERE thread_id = %(thread)s FOR SHARE),
src AS (SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids FROM summaries
        WHERE generation = %(gen)s AND summary_key = ANY(%(sources)s::text[])),
ins AS (
    INSERT INTO summaries (summary_key, generation, thread_id, episode_id, kind, level, from_seq, upto_seq, text,
                           content, source_ids, model, prompt_version)
    SELECT %(key)s, %(gen)s, %(thread)s, %(episode)s, %(kind)s, %(level)s, %(from_seq)s, %(upto_seq)s, %(text)s,
           %(content)s, (SELECT ids FROM src), %(model)s, %(prompt_version)s
    FROM t WHERE t.generation <= %(gen)s
    ON CONFLICT (generation, summary_key) DO NOTHING RETURNING id),
sources AS (
    UPDATE summaries SET is_active = false, archived_at = now()
    WHERE id IN (SELECT unnest(ids) FROM src) AND EXISTS (SELECT 1 FROM ins)),
parts AS (
    UPDATE summaries SET is_active = false, archived_at = now()
    WHERE %(archive)s AND episode_id = %(episode)s AND generation + 0 = %(gen)s AND kind IN ('running', 'chunk')
      AND is_active AND EXISTS (SELECT 1 FROM ins)),
episode AS (
    UPDATE episodes SET topic_label = %(topic)s, archived = true
    WHERE %(archive)s AND episode_id = %(episode)s AND generation = %(gen)s AND EXISTS (SELECT 1 FROM ins))
SELECT (SELECT generation FROM t), (SELECT id FROM ins)
"""


class PostgresSummaryStore:
    """The `SummaryVectors` of memory/jobs.py and the `LostFinals` of memory/sweeper.py."""

    def __init__(self, pool: ConnectionPool, keys: EventKeys):
        self.pool = pool
        self.keys = keys

    def job_state(self, thread_id: str, generation: int, summary_key: str) -> tuple[bool, bool]:
        with self.pool.connection() as conn:
            saved, active = one(
                conn,
                """SELECT EXISTS (SELECT 1 FROM summaries WHERE generation = %s AND summary_key = %s),
                              (SELECT generation FROM threads WHERE thread_id = %s)""",
                (generation, summary_key, thread_id),
            )
        # A replay writes its generation before switching to it: both are "current" for jobs.
        return bool(saved), active is not None and generation >= active

    def episode_lines(
        self, thread_id: str, generation: int, episode_id: str, from_seq: int, upto_seq: int
    ) -> list[Line]:
        # Texts as of the range's last message (edits up to it), from the log: the same whenever
        # the job runs, live or in replay.
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""WITH r AS (SELECT m.seq, m.role, m.platform_message_id, m.stream_pos, e.payload,
                                     {wrapped_key_sql("e")} AS wrapped
                              FROM messages m JOIN events e ON e.event_id = m.event_id
                              WHERE m.thread_id = %(t)s AND m.generation = %(g)s AND m.episode_id = %(ep)s
                              AND m.seq BETWEEN %(lo)s AND %(hi)s),
                        upto AS (SELECT max(stream_pos) AS pos FROM r)
                   SELECT r.seq, r.role, r.payload, r.wrapped, ed.payload, {wrapped_key_sql("ed")}
                   FROM r LEFT JOIN LATERAL (
                       SELECT ed.payload FROM events ed, upto WHERE ed.thread_id = %(t)s
                       AND ed.type = 'message_edited' AND ed.stream_pos <= upto.pos
                       AND r.platform_message_id IS NOT NULL
                       AND ed.payload->>'platform_message_id' = r.platform_message_id
                       ORDER BY ed.stream_pos DESC LIMIT 1) ed ON true
                   ORDER BY r.seq""",
                {"t": thread_id, "g": generation, "ep": episode_id, "lo": from_seq, "hi": upto_seq},
            ).fetchall()
        open_ = self.keys.open
        lines = []
        for s, r, p, w, ed, edw in rows:
            message = open_(p, w)
            text = log_text(message, open_(ed, edw) if ed is not None else None)
            lines.append(Line(seq=s, role=r, text=text, name=author_name(message)))
        return lines

    def save_summary(self, record: SummaryRecord, *, archive_episode: bool) -> bool:
        if record.kind in ("running", "chunk"):
            return self._save_partial(record)
        r = record
        with self.pool.connection() as conn:
            active, saved = one(
                conn,
                _SAVE_WHOLE,
                {
                    "key": r.summary_key,
                    "gen": r.generation,
                    "thread": r.thread_id,
                    "episode": r.episode_id,
                    "kind": r.kind,
                    "level": r.level,
                    "from_seq": r.from_seq,
                    "upto_seq": r.upto_seq,
                    "text": r.text,
                    "content": Jsonb(r.content),
                    "sources": list(r.source_keys),
                    "model": r.model,
                    "prompt_version": r.prompt_version,
                    "archive": archive_episode,
                    "topic": r.content.get("topic_label"),
                },
            )
        if active is None or r.generation < active:
            raise StaleGeneration(r.thread_id)
        return saved is not None

    def _save_partial(self, record: SummaryRecord) -> bool:
        """A running or chunk summary: its archiving rules read the rows it is inserted next to."""
        r = record
        with self.pool.connection() as conn, conn.transaction():
            active = conn.execute(
                "SELECT generation FROM threads WHERE thread_id = %s FOR SHARE", (r.thread_id,)
            ).fetchone()
            if active is None or r.generation < active[0]:
                raise StaleGeneration(r.thread_id)
            row = conn.execute(
                """INSERT INTO summaries (summary_key, generation, thread_id, episode_id, kind, level, from_seq,
                                          upto_seq, text, content, source_ids, model, prompt_version)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (generation, summary_key) DO NOTHING RETURNING id""",
                (
                    r.summary_key,
                    r.generation,
                    r.thread_id,
                    r.episode_id,
                    r.kind,
                    r.level,
                    r.from_seq,
                    r.upto_seq,
                    r.text,
                    Jsonb(r.content),
                    [],
                    r.model,
                    r.prompt_version,
                ),
            ).fetchone()
            if row is None:
                return False
            # Whatever order jobs finish in, the end state is the same: only the newest running
            # summary is active, and nothing of an episode whose final summary exists.
            conn.execute(
                """UPDATE summaries s SET is_active = false, archived_at = now()
                   WHERE s.generation = %s AND s.episode_id = %s AND s.kind IN ('running', 'chunk') AND s.is_active
                   AND (EXISTS (SELECT 1 FROM summaries f WHERE f.generation = s.generation
                                AND f.summary_key = s.episode_id || ':final')
                        OR (s.kind = 'running' AND s.upto_seq < (
                            SELECT max(upto_seq) FROM summaries m WHERE m.generation = s.generation
                            AND m.episode_id = s.episode_id AND m.kind = 'running')))""",
                (r.generation, r.episode_id),
            )
            return True

    def embed_summaries(self, thread_id: str, embedder: Embedder, limit: int = 100) -> int:
        """Vectors for this thread's summaries that have none yet. An extract of the offline
        summariser gets the mean of its range's message vectors: its text is sentences of those
        messages, and the model would spend as long on it as on the messages (half of a summarize
        worker's time). Any other summary is embedded by the model, outside any transaction; a
        summary embedded meanwhile by another worker keeps its vector."""
        embedder = concrete(embedder)
        with self.pool.connection() as conn:
            # One statement: the extracts filled from their messages, then what is left to embed
            # (the outer query sees the rows as before the update, so it leaves out those filled).
            rows = conn.execute(
                """WITH filled AS (
                       UPDATE summaries s SET embedding = c.v, embed_model = %(model)s
                       FROM (SELECT x.id, (SELECT avg(m.embedding) FROM messages m
                                           WHERE m.thread_id = x.thread_id AND m.generation = x.generation
                                             AND m.seq BETWEEN x.from_seq AND x.upto_seq AND m.embedding IS NOT NULL
                                             AND vector_dims(m.embedding) = %(dim)s
                                             AND coalesce(m.embed_model, %(model)s) = %(model)s) AS v
                             FROM summaries x
                             WHERE x.thread_id = %(thread)s AND x.embedding IS NULL
                               AND starts_with(x.model, %(offline)s)
                             ORDER BY x.id LIMIT %(n)s) c
                       WHERE s.id = c.id AND c.v IS NOT NULL AND s.embedding IS NULL
                       RETURNING s.id)
                   SELECT id, text FROM summaries
                   WHERE thread_id = %(thread)s AND embedding IS NULL AND id NOT IN (SELECT id FROM filled)
                   ORDER BY id LIMIT %(n)s""",
                {
                    "model": embedder.model,
                    "dim": embedder.dim,
                    "thread": thread_id,
                    "offline": OFFLINE_MODEL,
                    "n": limit,
                },
            ).fetchall()
        if not rows:
            return 0
        vectors = embedder.embed([r[1] for r in rows])
        with self.pool.connection() as conn, conn.cursor() as cur:
            cur.executemany(
                "UPDATE summaries SET embedding = %s, embed_model = %s WHERE id = %s AND embedding IS NULL",
                [(v, embedder.model, r[0]) for r, v in zip(rows, vectors, strict=True)],
            )
        return len(rows)

    def level_indexes(self, thread_id: str, generation: int) -> dict[int, set[int]]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT 1, array_agg(e.ordinal - 1)
                   FROM summaries s JOIN episodes e ON e.episode_id = s.episode_id AND e.generation = s.generation
                   WHERE s.thread_id = %(t)s AND s.generation = %(g)s AND s.kind = 'final'
                   UNION ALL
                   SELECT level, array_agg((content->>'group')::int)
                   FROM summaries WHERE thread_id = %(t)s AND generation = %(g)s AND kind = 'rollup'
                   GROUP BY level""",
                {"t": thread_id, "g": generation},
            ).fetchall()
        return {level: set(indexes) for level, indexes in rows if indexes}

    def level_items(self, thread_id: str, generation: int, level: int, indexes: Sequence[int]) -> list[LevelItem]:
        with self.pool.connection() as conn:
            if level == 1:
                rows = conn.execute(
                    """SELECT s.summary_key, e.ordinal - 1 AS idx, s.from_seq, s.upto_seq, s.text, s.is_active
                       FROM summaries s JOIN episodes e ON e.episode_id = s.episode_id AND e.generation = s.generation
                       WHERE s.thread_id = %s AND s.generation = %s AND s.kind = 'final'
                         AND e.ordinal - 1 = ANY(%s)
                       ORDER BY idx""",
                    (thread_id, generation, list(indexes)),
                ).fetchall()
            else:
                rows = conn.execute(
                    """SELECT summary_key, (content->>'group')::int AS idx, from_seq, upto_seq, text, is_active
                       FROM summaries WHERE thread_id = %s AND generation = %s AND kind = 'rollup' AND level = %s
                         AND (content->>'group')::int = ANY(%s)
                       ORDER BY idx""",
                    (thread_id, generation, level, list(indexes)),
                ).fetchall()
        return [LevelItem(*r) for r in rows]

    def missing_finals(self, limit: int = 500) -> list[tuple[str, int, Job]]:
        """Closed episodes of active generations with no final summary (a lost job)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT e.thread_id, e.generation, e.episode_id, e.start_seq, e.end_seq
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   WHERE e.status = 'closed' AND NOT EXISTS (
                       SELECT 1 FROM summaries s WHERE s.generation = e.generation
                       AND s.summary_key = e.episode_id || ':final')
                   LIMIT %s""",
                (limit,),
            ).fetchall()
        return [(t, g, Job("final", e, s, end)) for t, g, e, s, end in rows]
