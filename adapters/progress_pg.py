"""How far processing has come for given threads and events, and what it built: the queries
behind `chatmem demo` (and anything else that waits for the pipeline and shows the result)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg_pool import ConnectionPool

from chatmem.adapters.sql import scalar


class ThreadOverview(NamedTuple):
    thread_id: str
    applied_events: int
    logged_events: int
    first_at: datetime
    last_at: datetime


class ThreadMessage(NamedTuple):
    thread_id: str
    episode_id: str | None
    role: str
    text: str


class EpisodeOverview(NamedTuple):
    thread_id: str
    episode_id: str
    start_seq: int
    end_seq: int | None
    status: str
    opened_by: str
    topic_label: str
    summary_kind: str | None
    summary_text: str | None
    summary_content: dict[str, Any] | None


class AttachmentOverview(NamedTuple):
    message_text: str
    status: str | None
    reason: str
    derived_texts: str | None


class PostgresProgress:
    def __init__(self, pool: ConnectionPool):
        self.pool = pool

    def unprocessed(self, event_ids: Sequence[str], thread_ids: Sequence[str]) -> int:
        """Events not yet stored plus stored events the threads' cursors have not reached."""
        with self.pool.connection() as conn:
            stored = scalar(conn, "SELECT count(*) FROM events WHERE event_id = ANY(%s)", (list(event_ids),))
            behind = scalar(
                conn,
                """SELECT count(*) FROM events e JOIN threads t USING (thread_id)
                   WHERE e.thread_id = ANY(%s) AND e.stream_pos > t.cursor_pos""",
                (list(thread_ids),),
            )
        return len(event_ids) - stored + behind

    def closed_without_final(self, thread_ids: Sequence[str]) -> int:
        with self.pool.connection() as conn:
            return scalar(
                conn,
                """SELECT count(*) FROM episodes e
                   JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   WHERE e.thread_id = ANY(%s) AND e.status = 'closed' AND NOT EXISTS (
                       SELECT 1 FROM summaries s WHERE s.generation = e.generation AND s.episode_id = e.episode_id
                       AND s.kind = 'final')""",
                (list(thread_ids),),
            )

    def fact_work_waiting(self, thread_ids: Sequence[str]) -> int:
        """Closed episodes whose facts job has not run, plus remember/forget commands still queued."""
        with self.pool.connection() as conn:
            return scalar(
                conn,
                """SELECT (SELECT count(*) FROM episodes e JOIN threads t
                             ON t.thread_id = e.thread_id AND t.generation = e.generation
                           WHERE e.thread_id = ANY(%(t)s) AND e.status = 'closed' AND NOT EXISTS (
                               SELECT 1 FROM fact_ledger l
                               WHERE l.op_key = e.episode_id || ':g' || e.generation || ':facts'))
                        + (SELECT count(*) FROM commands_applied WHERE thread_id = ANY(%(t)s)
                           AND command IN ('remember', 'forget') AND detail LIKE '%%queued')""",
                {"t": list(thread_ids)},
            )

    def attachments_waiting(self, event_ids: Sequence[str]) -> int:
        with self.pool.connection() as conn:
            return scalar(
                conn,
                """SELECT count(*) FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                   WHERE a.event_id = ANY(%s) AND a.status <> 'failed'
                     AND coalesce(ar.status, '') NOT IN ('done', 'failed')""",
                (list(event_ids),),
            )

    def threads(self, thread_ids: Sequence[str]) -> list[ThreadOverview]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT t.thread_id, t.applied_events, count(e.id), min(e.occurred_at), max(e.occurred_at)
                   FROM threads t JOIN events e USING (thread_id)
                   WHERE t.thread_id = ANY(%s) GROUP BY t.thread_id, t.applied_events ORDER BY t.thread_id""",
                (list(thread_ids),),
            ).fetchall()
        return [ThreadOverview(*r) for r in rows]

    def messages(self, thread_ids: Sequence[str]) -> list[ThreadMessage]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT m.thread_id, m.episode_id, m.role, coalesce(m.text, '') FROM messages m
                   JOIN threads t ON t.thread_id = m.thread_id AND t.generation = m.generation
                   WHERE m.thread_id = ANY(%s) ORDER BY m.thread_id, m.seq""",
                (list(thread_ids),),
            ).fetchall()
        return [ThreadMessage(*r) for r in rows]

    def episodes(self, thread_ids: Sequence[str]) -> list[EpisodeOverview]:
        """Each episode with its latest summary (the final one once it exists)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT e.thread_id, e.episode_id, e.start_seq, e.end_seq, e.status, e.opened_by,
                          coalesce(e.topic_label, ''), s.kind, s.text, s.content
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   LEFT JOIN LATERAL (
                       SELECT kind, text, content FROM summaries s WHERE s.generation = e.generation
                       AND s.episode_id = e.episode_id AND s.kind IN ('final', 'running')
                       ORDER BY (s.kind = 'final') DESC, s.upto_seq DESC LIMIT 1) s ON true
                   WHERE e.thread_id = ANY(%s) ORDER BY e.thread_id, e.ordinal""",
                (list(thread_ids),),
            ).fetchall()
        return [EpisodeOverview(*r) for r in rows]

    def attachments(self, event_ids: Sequence[str]) -> list[AttachmentOverview]:
        """Each attachment of the events with its status and derived texts."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT m.text, ar.status, coalesce(a.reason, ar.reason, ''),
                          (SELECT string_agg(t.kind || ': ' || t.text, E'\\n' ORDER BY t.kind, t.ord)
                           FROM artifact_text t
                           WHERE t.sha256 = a.sha256 OR (t.event_id = a.event_id AND t.position = a.position))
                   FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                   JOIN messages m ON m.event_id = a.event_id
                   JOIN threads th ON th.thread_id = m.thread_id AND th.generation = m.generation
                   WHERE a.event_id = ANY(%s)""",
                (list(event_ids),),
            ).fetchall()
        return [AttachmentOverview(*r) for r in rows]
