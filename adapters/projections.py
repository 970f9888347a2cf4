"""Postgres projections: messages, episodes and commands per generation as live apply and replay
write them, the thread's processing state, the generation switch and gc. Summaries are written
by the summary jobs through adapters/summaries_pg.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from chatmem.adapters.attachments_pg import add_references, edited_text
from chatmem.adapters.postgres import bulk_insert
from chatmem.adapters.sql import THREAD_FAMILY, scalar
from chatmem.memory.episodes import OpenEpisode, Plan, ThreadContext
from chatmem.memory.ports import LeaseLost, UnknownThread
from chatmem.memory.segmentation import SegmenterState
from chatmem.schemas.events import ERASED
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
    """The `Projections` of memory/pipeline.py (live apply) and what replay and gc need."""

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
        if row is None:
            raise UnknownThread(thread_id)
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
            row = conn.execute(
                """SELECT EXISTS (SELECT 1 FROM events WHERE thread_id = %s AND stream_pos > %s
                   AND type = 'command' AND payload->>'command' = 'memory_on'
                   AND stream_pos < (SELECT coalesce(max(watermark), 0) FROM ingest_state WHERE stream_key = %s))""",
                (thread_id, after_pos, watermark_key),
            ).fetchone()
        return row is not None and bool(row[0])

    def deletion_ahead(self, thread_id: str, after_pos: int, watermark_key: str) -> bool:
        """A message_deleted event committed after a paused thread's cursor that names one of the
        messages of the thread or its sub-threads (a forum's topics) whose content is still there:
        a shredding to do now. (Usually there is none, and the join reads nothing.)"""
        with self.pool.connection() as conn:
            row = conn.execute(
                f"""WITH gone AS (
                        SELECT jsonb_array_elements_text(payload->'platform_message_ids') AS id FROM events
                        WHERE thread_id = %(t)s AND type = 'message_deleted' AND stream_pos > %(after)s
                          AND stream_pos < (SELECT coalesce(max(watermark), 0) FROM ingest_state
                                            WHERE stream_key = %(key)s)),
                    family AS ({THREAD_FAMILY})
                    SELECT EXISTS (SELECT 1 FROM events e JOIN family USING (thread_id)
                                   JOIN gone ON gone.id = e.payload->>'platform_message_id'
                                   WHERE e.type IN ('message', 'message_edited')
                                     AND NOT coalesce(e.payload->'metadata' ? '{ERASED}', false))""",
                {"t": thread_id, "after": after_pos, "key": watermark_key},
            ).fetchone()
        return row is not None and bool(row[0])

    def deletions_naming(self, thread_id: str, logged: Sequence[tuple[str, int]]) -> list[str]:
        """Of this thread and the chat it is a topic of (`<chat>:<topic>`), those with a
        message_deleted event logged before a message of `logged` (platform id, stream position)
        that it names. A deletion logged after is the planner's, when the thread reaches it. The
        partial index events_deletions reads only deletion events."""
        owners = [thread_id, thread_id.rsplit(":", 1)[0]] if ":" in thread_id else [thread_id]
        ids, positions = [i for i, _ in logged], [p for _, p in logged]
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT DISTINCT d.thread_id FROM events d
                   JOIN unnest(%s::text[], %s::bigint[]) AS m(id, pos)
                     ON d.payload->'platform_message_ids' ? m.id AND d.stream_pos < m.pos
                   WHERE d.thread_id = ANY(%s) AND d.type = 'message_deleted'""",
                (ids, positions, owners),
            ).fetchall()
        return sorted(r[0] for r in rows)

    def apply(self, plan: Plan, *, lease: ThreadLease | None, advance) -> ThreadLease | None:  # noqa: ANN001
        """Write the plan. Live (lease given): in the same transaction as the cursor move and the
        thread's state. Replay (lease None): projection rows of the new generation only."""
        ctx = plan.context
        assert ctx is not None
        with self.pool.connection() as conn, conn.transaction():
            self._write(conn, plan, ctx.thread_id, ctx.generation)
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

    def _write(self, conn: psycopg.Connection, plan: Plan, tid: str, gen: int) -> None:
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
                (*MESSAGE_COLUMNS, "dates", "embed_model"),
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
                        m.dates,
                        plan.embed_model if m.embedding is not None else None,
                    )
                    for m in plan.messages
                ),
                types=(*MESSAGE_TYPES, "text", "text"),
            )
        for mv in plan.moves:
            conn.execute(
                """UPDATE messages SET episode_id = %s
                   WHERE thread_id = %s AND generation = %s AND seq >= %s AND episode_id = %s""",
                (mv.to_episode, tid, gen, mv.from_seq, mv.from_episode),
            )
        for closed in plan.closed:
            conn.execute(
                """UPDATE episodes SET status = 'closed', end_seq = %s, closed_by = %s, ended_at = %s
                   WHERE episode_id = %s AND generation = %s""",
                (closed.end_seq, closed.closed_by, closed.ended_at, closed.episode_id, gen),
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
            row = conn.execute(
                """SELECT greatest((SELECT generation FROM threads WHERE thread_id = %(t)s),
                                   (SELECT max(generation) FROM episodes WHERE thread_id = %(t)s),
                                   (SELECT max(generation) FROM messages WHERE thread_id = %(t)s)) + 1""",
                {"t": thread_id},
            ).fetchone()
        if row is None or row[0] is None:  # no thread row and no projection rows of it
            raise UnknownThread(thread_id)
        return int(row[0])

    def switch_generation(self, lease: ThreadLease, ctx: ThreadContext) -> bool:
        """Make the rebuilt generation the thread's active one, atomically, if the lease holds."""
        with self.pool.connection() as conn, conn.transaction():
            if not self._lease_held(conn, lease):
                return False
            self.save_state(conn, ctx, cursor_pos=lease.cursor_pos)
            return True

    def applied_events(self) -> int:
        with self.pool.connection() as conn:
            return int(scalar(conn, "SELECT coalesce(sum(applied_events), 0) FROM threads"))

    def switch_all(self, built: Sequence[Any], also: Callable[[psycopg.Connection], None]) -> None:
        """Switch every rebuilt thread to its new generation, and do `also`, in one transaction:
        a reader sees all the old generations or all the new ones."""
        with self.pool.connection() as conn, conn.transaction():
            for r in built:
                self.save_state(conn, r.context)
            conn.execute(
                """UPDATE artifact_text SET embedding = embedding_next, embed_model = embed_model_next,
                          embedding_next = NULL, embed_model_next = NULL
                   WHERE embed_model_next IS NOT NULL"""
            )
            also(conn)

    def stage_artifact_vectors(self, embedder: Any, *, in_place: bool = False, batch: int = 256) -> int:
        """The vector of every artifact text under `embedder`, beside the one in use until the
        switch; `in_place` (after the switch): straight into use, for the texts the attachments
        worker wrote meanwhile with the old model."""
        target = "embedding = %s, embed_model = %s" if in_place else "embedding_next = %s, embed_model_next = %s"
        done, last = 0, 0
        while True:
            with self.pool.connection() as conn:
                rows = conn.execute(
                    f"""SELECT id, text FROM artifact_text
                        WHERE id > %s AND {"embed_model" if in_place else "embed_model_next"} IS DISTINCT FROM %s
                        ORDER BY id LIMIT %s""",
                    (last, embedder.model, batch),
                ).fetchall()
            if not rows:
                return done
            vectors = embedder.embed([r[1] for r in rows])
            with self.pool.connection() as conn, conn.cursor() as cur:
                cur.executemany(
                    f"UPDATE artifact_text SET {target} WHERE id = %s",
                    [(v, embedder.model, r[0]) for r, v in zip(rows, vectors, strict=True)],
                )
            done, last = done + len(rows), rows[-1][0]

    def unstage_artifact_vectors(self) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                """UPDATE artifact_text SET embedding_next = NULL, embed_model_next = NULL
                   WHERE embed_model_next IS NOT NULL"""
            )

    def generation_rows(self, thread_id: str, generation: int) -> dict[str, set[tuple]]:
        """What a generation holds, in comparable form (`replay --check`)."""
        queries = {
            "episodes": """SELECT episode_id, ordinal, start_seq, end_seq, status, opened_by, closed_by
                           FROM episodes WHERE thread_id = %s AND generation = %s""",
            "messages": """SELECT seq, event_id, episode_id, role FROM messages
                           WHERE thread_id = %s AND generation = %s""",
            "summaries": """SELECT summary_key, kind, level, from_seq, upto_seq, text, is_active FROM summaries
                            WHERE thread_id = %s AND generation = %s""",
            "commands": """SELECT event_id, command, status FROM commands_applied
                           WHERE thread_id = %s AND generation = %s""",
        }
        with self.pool.connection() as conn:
            return {
                name: {tuple(r) for r in conn.execute(sql, (thread_id, generation)).fetchall()}
                for name, sql in queries.items()
            }

    def drop_generation(self, thread_id: str, generation: int) -> None:
        """Delete a generation that was built and never switched to (a `replay --check`)."""
        with self.pool.connection() as conn, conn.transaction():
            active = conn.execute("SELECT generation FROM threads WHERE thread_id = %s", (thread_id,)).fetchone()
            if active is not None and active[0] == generation:
                raise ValueError(f"generation {generation} of {thread_id} is the active one")
            for table in ("summaries", "messages", "episodes", "commands_applied"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id = %s AND generation = %s", (thread_id, generation))

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
