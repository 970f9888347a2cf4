"""API keys: random tokens shown once, stored as sha256 digests, each scoped to a list of
user ids ('*' for all, meant for a bot that serves every user of its platform)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from chatmem.schemas.events import validate_identifier

ALL_USERS = "*"


@dataclass(frozen=True)
class KeyInfo:
    name: str
    user_ids: tuple[str, ...]

    def allows(self, user_id: str) -> bool:
        return ALL_USERS in self.user_ids or user_id in self.user_ids


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, pool: ConnectionPool):
        self.pool = pool

    def create(self, name: str, user_ids: list[str]) -> str:
        users = [u if u == ALL_USERS else validate_identifier(u, "user_id") for u in user_ids]
        if not users:
            raise ValueError("an API key needs at least one user id (or '*')")
        key = "cm_" + secrets.token_urlsafe(32)
        with self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO api_keys (key_hash, name, user_ids) VALUES (%s, %s, %s)", (_digest(key), name, users)
            )
        return key

    def verify(self, key: str) -> KeyInfo | None:
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT name, user_ids FROM api_keys WHERE key_hash = %s AND revoked_at IS NULL", (_digest(key),)
            ).fetchone()
        return KeyInfo(row[0], tuple(row[1])) if row else None

    def revoke(self, name: str) -> bool:
        with self.pool.connection() as conn:
            return (
                conn.execute(
                    "UPDATE api_keys SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL", (name,)
                ).rowcount
                > 0
            )

    def list(self) -> list[tuple[str, list[str], bool]]:
        with self.pool.connection() as conn:
            rows = conn.execute("SELECT name, user_ids, revoked_at IS NOT NULL FROM api_keys ORDER BY name").fetchall()
        return [(r[0], list(r[1]), r[2]) for r in rows]
