"""Postgres projections: messages, episodes, summaries and commands per generation, the thread's
processing state, and the summary store."""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from chatmem.adapters.attachments_pg import add_references, edited_text
from chatmem.adapters.postgres import bulk_insert
from chatmem.memory.episodes import Job, OpenEpisode, Plan, ThreadContext
from chatmem.memory.ports import LeaseLost
from chatmem.memory.prompts import Line
from chatmem.memory.segmentation import SegmenterState
from chatmem.memory.summaries import LevelItem, StaleGeneration, SummaryRecord
from chatmem.schemas.records import ThreadLease

# The projected message row as bulk-written (COPY BINARY): columns and their Postgres types.
MESSAGE_COLUMNS = (
    "thread_id",
    "generation",
    "seq",
    "event_id",
    "stream_pos",
    "episode_id",
    "user_id",
    "role",
    "text",
    "platform_message_id",
    "occurred_at",
    "embedding",
)
MESSAGE_TYPES = (
    "text",
    "int4",
    "int4",
    "text",
    "int8",
    "text",
    "text",
    "text",
    "text",
    "text",
    "timestamptz",
    "vector",
)


def _episode_json(ep: OpenEpisode | None) -> Jsonb | None:
    if ep is None:
        return None
    return Jsonb({**ep.__dict__, "started_at": ep.started_at.isoformat()})


def _episode_from(data: dict | None) -> OpenEpisode | None:
    if not data:
        return None
    return OpenEpisode(**{**data, "started_at": datetime.fromisoformat(data["started_at"])})


class PostgresProjections:
    def __init__(self, pool: ConnectionPool):
        self.pool = pool

    # --- thread state ---------------------------------------------------------------------
    def load_context(self, thread_id: str) -> ThreadContext:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                """SELECT generation, memory_on, config, segmenter_state, current_episode, episode_count,
                          message_count FROM threads WHERE thread_id = %s""",
                (thread_id,),
            ).fetchone()
        return ThreadContext(
            thread_id,
            row["generation"],
            row["memory_on"],
            row["config"] or {},
            SegmenterState.from_json(row["segmenter_state"]),
            _episode_from(row["current_episode"]),
            row["episode_count"],
            row["message_count"],
        )

    def memory_on_ahead(self, thread_id: str, after_pos: int, watermark_key: str) -> bool:
        """A paused thread resumes once a memory_on command is committed after its cursor."""
        with self.pool.connection() as conn:
            return conn.execute(
                """SELECT EXISTS (SELECT 1 FROM events WHERE thread_id = %s AND stream_pos > %s
                   AND type = 'command' AND payload->>'command' = 'memory_on'
                   AND stream_pos < (SELECT coalesce(max(watermark), 0) FROM ingest_state WHERE stream_key = %s))""",
                (thread_id, after_pos, watermark_key),
            ).fetchone()[0]

    def apply(self, plan: Plan, *, lease: ThreadLease | None, advance) -> ThreadLease | None:  # noqa: ANN001
        """Write the plan. Live (lease given): in the same transaction as the cursor move and the
        thread's state. Replay (lease None): projection rows of the new generation only."""
        ctx = plan.context
        assert ctx is not None
        with self.pool.connection() as conn, conn.transaction():
            self._write(conn, plan, ctx.generation)
            if lease is None:
                return None
            if plan.consumed:
                lease = advance(conn, lease, plan.consumed)
            elif not self._lease_held(conn, lease):
                raise LeaseLost(lease.thread_id)
            self.save_state(conn, ctx)
            return lease

    def _lease_held(self, conn: psycopg.Connection, lease: ThreadLease) -> bool:
        return (
            conn.execute(
                "SELECT 1 FROM threads WHERE thread_id = %s AND lease_owner = %s", (lease.thread_id, lease.owner)
            ).fetchone()
            is not None
        )

    def save_state(self, conn: psycopg.Connection, ctx: ThreadContext, *, cursor_pos: int | None = None) -> None:
        conn.execute(
            """UPDATE threads SET memory_on = %s, config = %s, segmenter_state = %s, current_episode = %s,
                      episode_count = %s, message_count = %s, generation = %s,
                      cursor_pos = coalesce(%s, cursor_pos), updated_at = now()
               WHERE thread_id = %s""",
            (
                ctx.memory_on,
                Jsonb(ctx.config),
                Jsonb(ctx.seg_state.to_json()),
                _episode_json(ctx.episode),
                ctx.episode_count,
                ctx.message_count,
                ctx.generation,
                cursor_pos,
                ctx.thread_id,
            ),
        )

    def _write(self, conn: psycopg.Connection, plan: Plan, gen: int) -> None:
        tid = plan.context.thread_id  # type: ignore[union-attr]
        for ep in plan.opened:
            conn.execute(
                """INSERT INTO episodes (episode_id, generation, thread_id, ordinal, start_seq, opened_by, started_at)
                   VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                (ep.episode_id, gen, tid, ep.ordinal, ep.start_seq, ep.opened_by, ep.started_at),
            )
        if plan.messages:
            bulk_insert(
                conn,
                "messages",
                MESSAGE_COLUMNS,
                (
                    (
                        tid,
                        gen,
                        m.seq,
                        m.event_id,
                        m.stream_pos,
                        m.episode_id,
                        m.user_id,
                        m.role,
                        m.text,
                        m.platform_message_id,
                        m.occurred_at,
                        m.embedding,
                    )
                    for m in plan.messages
                ),
                types=MESSAGE_TYPES,
            )
        for mv in plan.moves:
            conn.execute(
                """UPDATE messages SET episode_id = %s
                   WHERE thread_id = %s AND generation = %s AND seq >= %s AND episode_id = %s""",
                (mv.to_episode, tid, gen, mv.from_seq, mv.from_episode),
            )
        for ep in plan.closed:
            conn.execute(
                """UPDATE episodes SET status = 'closed', end_seq = %s, closed_by = %s, ended_at = %s
                   WHERE episode_id = %s AND generation = %s""",
                (ep.end_seq, ep.closed_by, ep.ended_at, ep.episode_id, gen),
            )
        for platform_id, text in plan.edits:
            conn.execute(
                """UPDATE messages SET text = %s WHERE thread_id = %s AND generation = %s
                   AND platform_message_id = %s""",
                (edited_text(conn, tid, gen, platform_id, text), tid, gen, platform_id),
            )
        if plan.attachments:
            add_references(conn, tid, plan.attachments)
        for ack in plan.commands:
            conn.execute(
                """INSERT INTO commands_applied (event_id, generation, thread_id, command, status, detail)
                   VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                (ack.event_id, gen, tid, ack.command, ack.status, ack.detail),
            )

    def next_generation(self, thread_id: str) -> int:
        with self.pool.connection() as conn:
            return conn.execute(
                """SELECT greatest((SELECT generation FROM threads WHERE thread_id = %(t)s),
                                   (SELECT max(generation) FROM episodes WHERE thread_id = %(t)s),
                                   (SELECT max(generation) FROM messages WHERE thread_id = %(t)s)) + 1""",
                {"t": thread_id},
            ).fetchone()[0]

    def switch_generation(self, lease: ThreadLease, ctx: ThreadContext) -> bool:
        """Make the rebuilt generation the thread's active one, atomically, if the lease holds."""
        with self.pool.connection() as conn, conn.transaction():
            if not self._lease_held(conn, lease):
                return False
            self.save_state(conn, ctx, cursor_pos=lease.cursor_pos)
            return True

    def gc(self) -> dict[str, int]:
        """Delete the rows of generations replaced by a replay (asked for explicitly)."""
        removed = {}
        with self.pool.connection() as conn, conn.transaction():
            for table in ("summaries", "messages", "episodes", "commands_applied"):
                removed[table] = conn.execute(
                    f"""DELETE FROM {table} x USING threads t
                        WHERE x.thread_id = t.thread_id AND x.generation < t.generation"""
                ).rowcount
        return removed

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

    # --- summary store --------------------------------------------------------------------
    def has_summary(self, generation: int, summary_key: str) -> bool:
        with self.pool.connection() as conn:
            return (
                conn.execute(
                    "SELECT 1 FROM summaries WHERE generation = %s AND summary_key = %s", (generation, summary_key)
                ).fetchone()
                is not None
            )

    def generation_active(self, thread_id: str, generation: int) -> bool:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT generation FROM threads WHERE thread_id = %s", (thread_id,)).fetchone()
        # A replay writes its generation before switching to it: both are "current" for jobs.
        return row is not None and generation >= row[0]

    def episode_lines(
        self, thread_id: str, generation: int, episode_id: str, from_seq: int, upto_seq: int
    ) -> list[Line]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT seq, role, text FROM messages WHERE thread_id = %s AND generation = %s
                   AND episode_id = %s AND seq BETWEEN %s AND %s ORDER BY seq""",
                (thread_id, generation, episode_id, from_seq, upto_seq),
            ).fetchall()
        return [Line(seq=s, role=r, text=t) for s, r, t in rows]

    def save_summary(self, record: SummaryRecord, *, archive_episode: bool) -> bool:
        r = record
        with self.pool.connection() as conn, conn.transaction():
            active = conn.execute(
                "SELECT generation FROM threads WHERE thread_id = %s FOR SHARE", (r.thread_id,)
            ).fetchone()
            if active is None or r.generation < active[0]:
                raise StaleGeneration(r.thread_id)
            source_ids = []
            if r.source_keys:
                source_ids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT id FROM summaries WHERE generation = %s AND summary_key = ANY(%s) ORDER BY id",
                        (r.generation, list(r.source_keys)),
                    )
                ]
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
                    source_ids,
                    r.model,
                    r.prompt_version,
                ),
            ).fetchone()
            if row is None:
                return False
            if r.kind in ("running", "chunk"):
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
            if source_ids:
                conn.execute(
                    "UPDATE summaries SET is_active = false, archived_at = now() WHERE id = ANY(%s)", (source_ids,)
                )
            if archive_episode:
                conn.execute(
                    """UPDATE summaries SET is_active = false, archived_at = now()
                       WHERE generation = %s AND episode_id = %s AND kind IN ('running', 'chunk') AND is_active""",
                    (r.generation, r.episode_id),
                )
                conn.execute(
                    """UPDATE messages SET is_active = false WHERE thread_id = %s AND generation = %s
                       AND episode_id = %s""",
                    (r.thread_id, r.generation, r.episode_id),
                )
                conn.execute(
                    "UPDATE episodes SET topic_label = %s WHERE episode_id = %s AND generation = %s",
                    (r.content.get("topic_label"), r.episode_id, r.generation),
                )
            return True

    def embed_summaries(self, thread_id: str, embedder, limit: int = 100) -> int:  # noqa: ANN001
        """Embed this thread's summaries that have no vector yet (the model call outside any
        transaction; a summary embedded meanwhile by another worker keeps its vector)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT id, text FROM summaries WHERE thread_id = %s AND embedding IS NULL ORDER BY id LIMIT %s",
                (thread_id, limit),
            ).fetchall()
        if not rows:
            return 0
        vectors = embedder.embed([r[1] for r in rows])
        with self.pool.connection() as conn, conn.cursor() as cur:
            cur.executemany(
                "UPDATE summaries SET embedding = %s WHERE id = %s AND embedding IS NULL",
                [(v, r[0]) for r, v in zip(rows, vectors, strict=True)],
            )
        return len(rows)

    def level_items(self, thread_id: str, generation: int, level: int) -> list[LevelItem]:
        with self.pool.connection() as conn:
            if level == 1:
                rows = conn.execute(
                    """SELECT s.summary_key, e.ordinal - 1, s.from_seq, s.upto_seq, s.text, s.is_active
                       FROM summaries s JOIN episodes e ON e.episode_id = s.episode_id AND e.generation = s.generation
                       WHERE s.thread_id = %s AND s.generation = %s AND s.kind = 'final'""",
                    (thread_id, generation),
                ).fetchall()
            else:
                rows = conn.execute(
                    """SELECT summary_key, (content->>'group')::int, from_seq, upto_seq, text, is_active
                       FROM summaries WHERE thread_id = %s AND generation = %s AND kind = 'rollup' AND level = %s""",
                    (thread_id, generation, level),
                ).fetchall()
        return [LevelItem(*r) for r in rows]
