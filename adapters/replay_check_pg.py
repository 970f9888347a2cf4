"""What `replay --check` reads besides a generation's own tables: the facts and fact ledger of a
generation, and a thread's attachment references, artifacts and blobs (memory/replay_check.py)."""

from __future__ import annotations

import hashlib

from psycopg_pool import ConnectionPool

from chatmem.adapters.attachments_pg import REF_SQL
from chatmem.adapters.blobs import LocalBlobStore
from chatmem.memory.attachments import TEXTS_DIGEST
from chatmem.memory.replay_check import FactRow, StoredArtifact, StoredReference


class PostgresReplayCheck:
    def __init__(self, pool: ConnectionPool, blobs: LocalBlobStore):
        self.pool = pool
        self.blobs = blobs

    def facts(self, thread_id: str, generation: int) -> tuple[list[FactRow], dict[str, dict]]:
        """The facts rows the generation owns (active or archived since) and the ledger entries of
        its operations: each episode's extraction and each remember command."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT user_id, episode_id, category, key, value, source, source_event_ids FROM facts
                   WHERE thread_id = %s AND generation = %s""",
                (thread_id, generation),
            ).fetchall()
            keys = [
                r[0]
                for r in conn.execute(
                    """SELECT episode_id || ':g' || generation || ':facts' FROM episodes
                       WHERE thread_id = %(t)s AND generation = %(g)s
                       UNION ALL
                       SELECT event_id || ':g' || generation || ':remember' FROM commands_applied
                       WHERE thread_id = %(t)s AND generation = %(g)s AND command = 'remember'""",
                    {"t": thread_id, "g": generation},
                )
            ]
            ledger: dict[str, dict] = dict(
                conn.execute("SELECT op_key, result FROM fact_ledger WHERE op_key = ANY(%s)", (keys,)).fetchall()
            )
        facts = [
            FactRow(u, ep, cat, key, value, source, tuple(ids or ())) for u, ep, cat, key, value, source, ids in rows
        ]
        return facts, ledger

    def attachments(self, thread_id: str) -> tuple[list[StoredReference], list[StoredArtifact]]:
        """The thread's attachment references (with their caption rows) and the artifacts they link."""
        with self.pool.connection() as conn:
            refs = conn.execute(
                f"""SELECT a.event_id, a.position, {REF_SQL}, a.status, a.sha256,
                          (SELECT t.text FROM artifact_text t WHERE t.event_id = a.event_id
                           AND t.position = a.position AND t.kind = 'user_caption')
                   FROM attachments a WHERE a.thread_id = %s""",
                (thread_id,),
            ).fetchall()
            shas = sorted({r[4] for r in refs if r[4]})
            artifacts = conn.execute(
                """SELECT sha256, status, description, meta ->> %s FROM artifacts WHERE sha256 = ANY(%s)""",
                (TEXTS_DIGEST, shas),
            ).fetchall()
            texts: dict[str, list[tuple[str, int, str]]] = {}
            for sha, kind, ord_, text in conn.execute(
                "SELECT sha256, kind, ord, text FROM artifact_text WHERE sha256 = ANY(%s)", (shas,)
            ):
                texts.setdefault(sha, []).append((kind, ord_, text))
        return (
            [StoredReference(*r) for r in refs],
            [StoredArtifact(sha, status, desc, digest, texts.get(sha, [])) for sha, status, desc, digest in artifacts],
        )

    def blob_sha256(self, shas: list[str]) -> dict[str, str | None]:
        """The sha256 of each file's stored bytes (None: not in the blob store)."""
        out: dict[str, str | None] = {}
        for sha in shas:
            try:
                out[sha] = hashlib.sha256(self.blobs.get(sha)).hexdigest()
            except FileNotFoundError:
                out[sha] = None
        return out
