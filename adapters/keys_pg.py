"""Data keys of the event log (crypto-shredding): one per (user, thread), kept in `event_keys`
wrapped by the key-encryption key. Ingest seals each event's content with its key; every
reader of `events.payload` opens it with the wrapped key fetched in the same query
(`wrapped_key_sql`), so a key destroyed by an erasure takes effect on the next read, in every
process, with no cache to invalidate. An event whose key is gone opens as a tombstone."""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from chatmem.adapters import crypto

KID = "kid"


def wrapped_key_sql(alias: str = "e") -> str:
    """A column expression: the wrapped data key of event row `alias` (NULL when the event is
    not sealed or its key is destroyed). `alias` is ours, never input."""
    return f"(SELECT k.wrapped FROM event_keys k WHERE k.key_id = {alias}.payload->>'{KID}')"


class KekMismatch(RuntimeError):
    pass


class EventKeys:
    def __init__(self, load_kek: Callable[[], bytes], *, seal: bool):
        self._load_kek = load_kek
        self.seal_enabled = seal
        self._kek: bytes | None = None
        self._checked = False
        self._unwrapped: dict[str, bytes] = {}  # key id -> data key; only used with a live wrapped key
        self._lock = threading.Lock()

    @property
    def kek(self) -> bytes:
        with self._lock:
            if self._kek is None:
                self._kek = self._load_kek()
            return self._kek

    def _check_kek(self, conn: psycopg.Connection) -> None:
        """The first KEK used on a database is recorded by fingerprint; another one is refused."""
        if self._checked:
            return
        fingerprint = hashlib.sha256(b"chatmem-kek:" + self.kek).digest()[:16]
        conn.execute("INSERT INTO kek_check (id, fingerprint) VALUES (1, %s) ON CONFLICT DO NOTHING", (fingerprint,))
        row = conn.execute("SELECT fingerprint FROM kek_check WHERE id = 1").fetchone()
        if row is None or bytes(row[0]) != fingerprint:
            raise KekMismatch(
                "this process's key-encryption key is not the one that wrapped the data keys in this "
                "database: set CHATMEM_KEK (or CHATMEM_KEK_FILE) to the same key in every process"
            )
        self._checked = True

    # --- ingest ------------------------------------------------------------------------------
    def seal_payloads(self, conn: psycopg.Connection, events: Sequence[tuple[str, str, str]]) -> list[str]:
        """(user_id, thread_id, payload JSON) -> the payload JSON to log, its content sealed.
        Runs in the caller's transaction: the key rows are locked FOR SHARE, so an erasure of
        these users waits for this batch and then destroys its keys too."""
        if not self.seal_enabled or not events:
            return [p for _, _, p in events]
        self._check_kek(conn)
        pairs = sorted({(u, t) for u, t, _ in events})
        keys = self._live_keys(conn, pairs)
        missing = [p for p in pairs if p not in keys]
        if missing:
            rows = []
            for user_id, thread_id in missing:
                key_id = secrets.token_hex(16)
                rows.append((key_id, user_id, thread_id, crypto.wrap(self.kek, crypto.new_key(), key_id)))
            with conn.cursor() as cur:
                cur.executemany(
                    """INSERT INTO event_keys (key_id, user_id, thread_id, wrapped) VALUES (%s, %s, %s, %s)
                       ON CONFLICT (user_id, thread_id) WHERE wrapped IS NOT NULL DO NOTHING""",
                    rows,
                )
            keys.update(self._live_keys(conn, missing))  # a concurrent consumer's key wins
        out = []
        for user_id, thread_id, payload in events:
            key_id, data_key = keys[(user_id, thread_id)]
            sealed = crypto.seal(json.loads(payload), data_key)
            sealed[KID] = key_id
            out.append(json.dumps(sealed, ensure_ascii=False, separators=(",", ":")))
        return out

    def _live_keys(self, conn: psycopg.Connection, pairs: Sequence[tuple[str, str]]) -> dict:
        rows = conn.execute(
            """SELECT user_id, thread_id, key_id, wrapped FROM event_keys
               WHERE wrapped IS NOT NULL
                 AND (user_id, thread_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
               FOR SHARE""",
            ([u for u, _ in pairs], [t for _, t in pairs]),
        ).fetchall()
        return {(u, t): (key_id, self._data_key(key_id, bytes(w))) for u, t, key_id, w in rows}

    # --- readers -----------------------------------------------------------------------------
    def _data_key(self, key_id: str, wrapped: bytes) -> bytes:
        key = self._unwrapped.get(key_id)
        if key is None:
            key = crypto.unwrap(self.kek, wrapped, key_id)
            if len(self._unwrapped) > 100_000:
                self._unwrapped.clear()
            self._unwrapped[key_id] = key
        return key

    def open(self, payload: dict[str, Any], wrapped: bytes | None) -> dict[str, Any]:
        """The payload as published, from a row read with `wrapped_key_sql`; a tombstone when
        the key is destroyed. An unsealed payload (logged with encryption off) is returned as is."""
        if crypto.SEALED not in payload:
            return payload
        key_id = str(payload.get(KID))
        data_key = None if wrapped is None else self._data_key(key_id, bytes(wrapped))
        return crypto.open_sealed({k: v for k, v in payload.items() if k != KID}, data_key)

    def destroy(self, conn: psycopg.Connection, *, user_id: str | None = None, thread_id: str | None = None) -> int:
        """Destroy the data keys of a user (every thread), of a thread (every user), or of one
        user in one thread. Returns how many keys were destroyed."""
        if user_id is None and thread_id is None:
            raise ValueError("destroy needs a user or a thread")
        return conn.execute(
            """UPDATE event_keys SET wrapped = NULL, destroyed_at = now()
               WHERE wrapped IS NOT NULL AND (%(u)s::text IS NULL OR user_id = %(u)s)
                 AND (%(t)s::text IS NULL OR thread_id = %(t)s)""",
            {"u": user_id, "t": thread_id},
        ).rowcount
