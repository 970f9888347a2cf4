"""Which embedder is in use (`embedding_state`): the configured one until `chatmem reembed`
switches models, then the one it built. Also the pause that holds live projection while a
re-embedding builds, so the generations it switches to are complete."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg_pool import ConnectionPool


@dataclass(frozen=True)
class EmbedderSpec:
    provider: str  # minilm | openai | hashing
    model: str
    dim: int


class EmbeddingState:
    def __init__(self, pool: ConnectionPool, configured: EmbedderSpec):
        self.pool = pool
        self.configured = configured

    def spec(self) -> EmbedderSpec:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT provider, model, dim FROM embedding_state WHERE id = 1").fetchone()
        return EmbedderSpec(*row) if row else self.configured

    def paused(self) -> bool:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT paused FROM embedding_state WHERE id = 1").fetchone()
        return bool(row and row[0])

    def begin(self, target: EmbedderSpec) -> EmbedderSpec:
        """Pause live projection for a re-embedding to `target`; returns the model in use."""
        current = self.spec()
        with self.pool.connection() as conn:
            row = conn.execute(
                """INSERT INTO embedding_state (id, provider, model, dim, paused, building)
                   VALUES (1, %s, %s, %s, true, %s)
                   ON CONFLICT (id) DO UPDATE SET paused = true, building = EXCLUDED.building
                   WHERE NOT embedding_state.paused
                   RETURNING 1""",
                (current.provider, current.model, current.dim, target.model),
            ).fetchone()
        if row is None:
            raise RuntimeError("a re-embedding is already running (embedding_state.paused)")
        return current

    def switch(self, conn: psycopg.Connection, target: EmbedderSpec) -> None:
        """In the caller's transaction (the one that switches the generations): the new model
        is in use and live projection resumes."""
        conn.execute(
            """UPDATE embedding_state SET provider = %s, model = %s, dim = %s, paused = false, building = NULL,
                      switched_at = now() WHERE id = 1""",
            (target.provider, target.model, target.dim),
        )

    def abort(self) -> None:
        with self.pool.connection() as conn:
            conn.execute("UPDATE embedding_state SET paused = false, building = NULL WHERE id = 1")
