"""Postgres side of attachments: references, artifacts, their text, and the message surrogates.

Surrogates are written under a per-thread advisory lock, taken both here and when the thread's
messages are projected: whichever of "message row written" and "artifact finished" commits
second sees the other, so no message keeps a stale placeholder. Lock order is always the
artifact row first, then thread locks in sorted order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from chatmem.adapters.sql import scalar
from chatmem.memory.attachments import TEXTS_DIGEST, Analysis, Heard, Reference, RefState, Sniffed, attachment_lines

# An attachment reference as sent; rows projected before migration 0008 read it from their event
# (logged in clear then).
REF_SQL = """coalesce(a.ref, (SELECT e.payload -> 'attachments' -> a.position FROM events e
                         WHERE e.event_id = a.event_id AND NOT e.payload ? 'sealed'))"""


def lock_threads(conn: psycopg.Connection, thread_ids: Sequence[str]) -> None:
    for thread_id in sorted(set(thread_ids)):
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('chatmem.attachments:' || %s, 0))", (thread_id,))


def add_references(conn: psycopg.Connection, thread_id: str, refs: Sequence[tuple[str, int, str, dict]]) -> None:
    """Record a projected message's attachments (idempotent) and apply any surrogate already known."""
    lock_threads(conn, [thread_id])
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO attachments (event_id, position, thread_id, user_id, ref) VALUES (%s, %s, %s, %s, %s)
               ON CONFLICT (event_id, position) DO UPDATE SET ref = EXCLUDED.ref WHERE attachments.ref IS NULL""",
            [(event_id, position, thread_id, user_id, Jsonb(ref)) for event_id, position, user_id, ref in refs],
        )
    refresh_messages(conn, sorted({event_id for event_id, *_ in refs}))


def refresh_messages(conn: psycopg.Connection, event_ids: Sequence[str]) -> int:
    """Rewrite the attachment lines of these messages (every generation) from their state. A
    message with n attachments always ends with n such lines; what precedes them is kept, so an
    edit of the message's text survives."""
    if not event_ids:
        return 0
    rows = conn.execute(
        f"""SELECT a.event_id, {REF_SQL}, a.position, a.status, a.reason, a.sha256,
                  ar.status, ar.kind, ar.description, ar.reason
           FROM attachments a
           LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
           WHERE a.event_id = ANY(%s) ORDER BY a.event_id, a.position""",
        (list(event_ids),),
    ).fetchall()
    payloads: dict[str, dict] = defaultdict(lambda: {"attachments": []})
    states: dict[str, dict[int, RefState]] = defaultdict(dict)
    for event_id, ref, pos, status, reason, sha, art_status, kind, description, art_reason in rows:
        payloads[event_id]["attachments"].append(ref or {})
        if status == "failed":
            state = RefState(pos, "failed", kind, sha, reason=reason)
        elif art_status in ("done", "failed"):
            state = RefState(pos, art_status, kind, sha, description, art_reason)
        else:
            state = RefState(pos, "pending", kind, sha)
        states[event_id][pos] = state
    changed = 0
    for event_id, payload in payloads.items():
        lines = attachment_lines(payload, states[event_id])
        messages = conn.execute(
            "SELECT thread_id, generation, seq, text FROM messages WHERE event_id = %s", (event_id,)
        ).fetchall()
        for thread_id, generation, seq, text in messages:
            new = with_attachment_lines(text, len(lines), lines)
            if new != text:
                conn.execute(
                    "UPDATE messages SET text = %s WHERE thread_id = %s AND generation = %s AND seq = %s",
                    (new, thread_id, generation, seq),
                )
                changed += 1
    return changed


def with_attachment_lines(text: str, n_old: int, lines: Sequence[str]) -> str:
    """`text` with its last `n_old` lines (the attachment lines) replaced by `lines`."""
    kept = text.split("\n")[:-n_old] if n_old else text.split("\n")
    return "\n".join([*kept, *lines]).strip()


def edited_text(conn: psycopg.Connection, thread_id: str, generation: int, platform_id: str, text: str) -> str:
    """An edit replaces what was said and keeps the message's attachment lines."""
    row = conn.execute(
        """SELECT m.text, (SELECT count(*) FROM attachments a WHERE a.event_id = m.event_id) FROM messages m
           WHERE m.thread_id = %s AND m.generation = %s AND m.platform_message_id = %s LIMIT 1""",
        (thread_id, generation, platform_id),
    ).fetchone()
    if row is None or not row[1]:
        return text
    return "\n".join([text, *row[0].split("\n")[-row[1] :]]).strip()


class PostgresAttachmentStore:
    def __init__(self, pool: ConnectionPool):
        self.pool = pool

    def reference(self, event_id: str, position: int) -> Reference | None:
        with self.pool.connection() as conn:
            row = conn.execute(
                f"""SELECT a.thread_id, a.user_id, a.status, {REF_SQL},
                          a.sha256, ar.status, ar.mime_type, ar.kind
                   FROM attachments a
                   LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                   WHERE a.event_id = %s AND a.position = %s""",
                (event_id, position),
            ).fetchone()
        if row is None:
            return None
        thread_id, user_id, status, attachment, sha, art_status, mime, kind = row
        return Reference(event_id, position, thread_id, user_id, status, attachment or {}, sha, art_status, mime, kind)

    def fail_reference(self, event_id: str, position: int, reason: str) -> None:
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                "SELECT thread_id FROM attachments WHERE event_id = %s AND position = %s", (event_id, position)
            ).fetchone()
            if row is None:
                return
            lock_threads(conn, [row[0]])
            conn.execute(
                """UPDATE attachments SET status = 'failed', reason = %s, attempts = attempts + 1, updated_at = now()
                   WHERE event_id = %s AND position = %s""",
                (reason[:1000], event_id, position),
            )
            refresh_messages(conn, [event_id])

    def link(self, ref: Reference, sha256: str, sniffed: Sniffed, size: int) -> str:
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(
                """INSERT INTO artifacts (sha256, mime_type, kind, size_bytes) VALUES (%s, %s, %s, %s)
                   ON CONFLICT DO NOTHING""",
                (sha256, sniffed.mime, sniffed.kind, size),
            )
            # The row lock orders this link against `finish`: either finish sees this reference,
            # or this sees the final status and refreshes the message itself.
            status = scalar(conn, "SELECT status FROM artifacts WHERE sha256 = %s FOR UPDATE", (sha256,))
            lock_threads(conn, [ref.thread_id])
            conn.execute(
                """UPDATE attachments SET sha256 = %s, status = 'linked', updated_at = now()
                   WHERE event_id = %s AND position = %s""",
                (sha256, ref.event_id, ref.position),
            )
            refresh_messages(conn, [ref.event_id])
            return status

    def save_caption(self, ref: Reference, text: str, vector: np.ndarray, model: str | None = None) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                """INSERT INTO artifact_text (event_id, position, kind, ord, text, embedding, embed_model)
                   VALUES (%s, %s, 'user_caption', 0, %s, %s, %s)
                   ON CONFLICT (event_id, position, kind) WHERE event_id IS NOT NULL DO NOTHING""",
                (ref.event_id, ref.position, text, vector, model),
            )

    def claim(self, sha256: str, claim_s: int) -> bool:
        with self.pool.connection() as conn:
            return (
                conn.execute(
                    """UPDATE artifacts SET status = 'processing', attempts = attempts + 1,
                              claimed_until = now() + make_interval(secs => %s)
                       WHERE sha256 = %s
                         AND (status = 'pending' OR (status = 'processing' AND claimed_until < now()))
                       RETURNING 1""",
                    (claim_s, sha256),
                ).fetchone()
                is not None
            )

    def release(self, sha256: str) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                """UPDATE artifacts SET status = 'pending', claimed_until = NULL
                   WHERE sha256 = %s AND status = 'processing'""",
                (sha256,),
            )

    def finish(self, sha256: str, analysis: Analysis, vectors: np.ndarray, model: str | None = None) -> None:
        with self.pool.connection() as conn, conn.transaction():
            if not self._unsettled(conn, sha256):
                return  # a worker that took over an expired claim got there first
            with conn.cursor() as cur:
                cur.executemany(
                    """INSERT INTO artifact_text (sha256, kind, ord, text, meta, embedding, embed_model)
                       VALUES (%s, %s, %s, %s, %s, %s, %s)
                       ON CONFLICT (sha256, kind, ord) WHERE sha256 IS NOT NULL DO NOTHING""",
                    [
                        (sha256, t.kind, t.ord, t.text, Jsonb(t.meta), vectors[i], model)
                        for i, t in enumerate(analysis.texts)
                    ],
                )
            meta = {**analysis.meta, TEXTS_DIGEST: analysis.digest()}
            self._settle(conn, sha256, "done", None, analysis.description, meta)

    def analysed(self) -> list[tuple[str, str, str, str | None]]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT ar.sha256, ar.mime_type, ar.kind,
                          (SELECT a.ref->>'filename' FROM attachments a WHERE a.sha256 = ar.sha256
                           AND a.ref ? 'filename' LIMIT 1)
                   FROM artifacts ar WHERE ar.status = 'done' ORDER BY ar.sha256"""
            ).fetchall()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def replace_analysis(self, sha256: str, analysis: Analysis, vectors: np.ndarray, model: str | None = None) -> None:
        with self.pool.connection() as conn, conn.transaction():
            if conn.execute("SELECT 1 FROM artifacts WHERE sha256 = %s FOR UPDATE", (sha256,)).fetchone() is None:
                return  # erased meanwhile
            conn.execute("DELETE FROM artifact_text WHERE sha256 = %s", (sha256,))  # captions stay
            with conn.cursor() as cur:
                cur.executemany(
                    """INSERT INTO artifact_text (sha256, kind, ord, text, meta, embedding, embed_model)
                       VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                    [
                        (sha256, t.kind, t.ord, t.text, Jsonb(t.meta), vectors[i], model)
                        for i, t in enumerate(analysis.texts)
                    ],
                )
            meta = {**analysis.meta, TEXTS_DIGEST: analysis.digest()}
            self._settle(conn, sha256, "done", None, analysis.description, meta)

    def heard(self, sha256: str) -> Heard:
        with self.pool.connection() as conn:
            row = conn.execute(
                """SELECT meta ->> 'transcription_model', meta ->> 'speech',
                          (SELECT string_agg(t.text, ' ' ORDER BY t.ord) FROM artifact_text t
                           WHERE t.sha256 = ar.sha256 AND t.kind = 'transcript')
                   FROM artifacts ar WHERE ar.sha256 = %s""",
                (sha256,),
            ).fetchone()
        return Heard(row[2] or "", row[0], row[1]) if row else Heard("", None, None)

    def fail_artifact(self, sha256: str, reason: str) -> None:
        with self.pool.connection() as conn, conn.transaction():
            if self._unsettled(conn, sha256):
                self._settle(conn, sha256, "failed", reason[:1000], None, {})

    def _unsettled(self, conn: psycopg.Connection, sha256: str) -> bool:
        """Lock the artifact row; true while it is neither done nor failed."""
        row = conn.execute("SELECT status FROM artifacts WHERE sha256 = %s FOR UPDATE", (sha256,)).fetchone()
        return row is not None and row[0] not in ("done", "failed")

    def _settle(
        self,
        conn: psycopg.Connection,
        sha256: str,
        status: str,
        reason: str | None,
        description: str | None,
        meta: dict,
    ) -> None:
        conn.execute(
            """UPDATE artifacts SET status = %s, reason = %s, description = %s, meta = meta || %s,
                      claimed_until = NULL, processed_at = now()
               WHERE sha256 = %s""",
            (status, reason, description, Jsonb(meta), sha256),
        )
        refs = conn.execute("SELECT event_id, thread_id FROM attachments WHERE sha256 = %s", (sha256,)).fetchall()
        lock_threads(conn, [t for _, t in refs])
        refresh_messages(conn, sorted({e for e, _ in refs}))

    def stale_references(self, older_than_s: int, limit: int = 500) -> list[tuple[str, int]]:
        """References still unprocessed after a while (a lost job), and at once those whose file's
        processing claim has expired (its worker died mid-job: the redelivered job found the
        claim still held and stopped): for the sweeper to re-queue."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT a.event_id, a.position FROM attachments a
                   LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                   WHERE ((a.status = 'pending' OR (a.status = 'linked' AND ar.status IN ('pending', 'processing')))
                          AND a.updated_at < now() - make_interval(secs => %s))
                      OR (a.status = 'linked' AND ar.status = 'processing' AND ar.claimed_until < now())
                   ORDER BY a.updated_at LIMIT %s""",
                (older_than_s, limit),
            ).fetchall()
        return [(e, int(p)) for e, p in rows]

    def status_counts(self) -> dict[str, int]:
        """Attachments by effective status, for `chatmem status`."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT CASE WHEN a.status = 'failed' OR ar.status = 'failed' THEN 'failed'
                               WHEN ar.status = 'done' THEN 'done' ELSE 'pending' END AS s, count(*)
                   FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256 GROUP BY 1"""
            ).fetchall()
        return {s: int(n) for s, n in rows}

    def listing(self, status: str | None = None, thread_id: str | None = None, limit: int = 50) -> list[dict]:
        """Attachments with their effective status and reason, newest first (for ops)."""
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                """SELECT * FROM (
                       SELECT a.event_id, a.position, a.thread_id, a.user_id, a.sha256, ar.mime_type, ar.size_bytes,
                              CASE WHEN a.status = 'failed' OR ar.status = 'failed' THEN 'failed'
                                   WHEN ar.status = 'done' THEN 'done' ELSE 'pending' END AS status,
                              coalesce(a.reason, ar.reason) AS reason, ar.description, a.updated_at
                       FROM attachments a LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                       WHERE (%(t)s::text IS NULL OR a.thread_id = %(t)s)) x
                   WHERE %(s)s::text IS NULL OR x.status = %(s)s
                   ORDER BY x.updated_at DESC LIMIT %(n)s""",
                {"t": thread_id, "s": status, "n": limit},
            ).fetchall()

    def reset_failed(self, thread_id: str | None = None) -> list[tuple[str, int]]:
        """Make failed attachments pending again (a URL that is back, a limit raised); return
        the references to queue. Their messages get their placeholders back until then."""
        with self.pool.connection() as conn, conn.transaction():
            refs = conn.execute(
                """SELECT a.event_id, a.position, a.thread_id, a.sha256, a.status FROM attachments a
                   LEFT JOIN artifacts ar ON ar.sha256 = a.sha256
                   WHERE (a.status = 'failed' OR ar.status = 'failed')
                     AND (%(t)s::text IS NULL OR a.thread_id = %(t)s)""",
                {"t": thread_id},
            ).fetchall()
            shas = sorted({sha for _, _, _, sha, status in refs if sha and status != "failed"})
            for sha in shas:
                conn.execute("SELECT 1 FROM artifacts WHERE sha256 = %s FOR UPDATE", (sha,))
            lock_threads(conn, [t for _, _, t, _, _ in refs])
            conn.execute(
                """UPDATE artifacts SET status = 'pending', reason = NULL, claimed_until = NULL
                   WHERE sha256 = ANY(%s) AND status = 'failed'""",
                (shas,),
            )
            for event_id, position, _, _, status in refs:
                if status == "failed":
                    conn.execute(
                        """UPDATE attachments SET status = 'pending', reason = NULL, sha256 = NULL, updated_at = now()
                           WHERE event_id = %s AND position = %s""",
                        (event_id, position),
                    )
            refresh_messages(conn, sorted({e for e, _, _, _, _ in refs}))
        return [(e, int(p)) for e, p, _, _, _ in refs]
