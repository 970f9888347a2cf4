"""The Postgres side of erasure (`chatmem erase`): which threads a subject touches, the data keys
to destroy, and every row outside the generational projections that holds content derived from
the erased events. The generational projections (messages, episodes, summaries, commands) are
rebuilt by replay over the tombstones, then the old generations are collected."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from psycopg_pool import ConnectionPool

from chatmem.adapters import crypto
from chatmem.adapters.keys_pg import EventKeys, wrapped_key_sql
from chatmem.adapters.llm import input_hash
from chatmem.memory.episodes import texts_to_embed
from chatmem.memory.prompts import file_summary
from chatmem.schemas.events import ERASED
from chatmem.schemas.records import LoggedEvent


@dataclass(frozen=True)
class ErasurePlan:
    """What an erasure covers. `user_id` set: that user's events in `threads`; `whole` are the
    threads whose every event goes (an erased thread, or a user's one-to-one thread with the bot,
    where the bot's replies are about the user too)."""

    user_id: str | None
    threads: list[str]
    whole: list[str]
    text_hashes: set[bytes] = field(default_factory=set)
    mem0_ids: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)  # users whose facts and files go entirely
    llm_inputs: set[bytes] = field(default_factory=set)  # llm_cache input hashes of their files' summaries


def _ours(alias: str = "") -> str:
    """The rows an erasure covers, in a table with thread_id and user_id (`alias` is ours)."""
    return f"({alias}thread_id = ANY(%(whole)s) OR ({alias}user_id = %(u)s AND {alias}thread_id = ANY(%(t)s)))"


def _hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class PostgresErasure:
    def __init__(self, pool: ConnectionPool, keys: EventKeys):
        self.pool = pool
        self.keys = keys

    def plan(self, *, user_id: str | None = None, thread_id: str | None = None) -> ErasurePlan:
        """Read, before any key is destroyed, what the erasure must remove: the threads, and the
        hashes of every text derived from the erased content (the embedding cache is keyed by them)."""
        with self.pool.connection() as conn:
            if thread_id is not None:
                threads, whole = [thread_id], [thread_id]
                users = [r[0] for r in conn.execute(
                    "SELECT DISTINCT user_id FROM events WHERE thread_id = %s", (thread_id,)
                )]  # fmt: skip
                users = [
                    u
                    for u in users
                    if conn.execute(
                        "SELECT 1 FROM events WHERE user_id = %s AND thread_id <> %s LIMIT 1", (u, thread_id)
                    ).fetchone()
                    is None
                ]
            else:
                assert user_id is not None
                threads = [r[0] for r in conn.execute(
                    "SELECT DISTINCT thread_id FROM events WHERE user_id = %s ORDER BY 1", (user_id,)
                )]  # fmt: skip
                # A thread where no other member wrote is the user's own (a DM with the bot).
                whole = [r[0] for r in conn.execute(
                    """SELECT t FROM unnest(%s::text[]) t WHERE NOT EXISTS (
                           SELECT 1 FROM thread_members m WHERE m.thread_id = t AND m.user_id <> %s)""",
                    (threads, user_id),
                )]  # fmt: skip
                users = [user_id]
            rows = conn.execute(
                f"""SELECT stream_pos, event_id, type, thread_id, user_id, occurred_at, payload,
                           {wrapped_key_sql("e")}
                    FROM events e WHERE (thread_id = ANY(%(whole)s) OR (user_id = %(u)s AND thread_id = ANY(%(t)s)))
                      AND type IN ('message', 'message_edited')""",
                {"whole": whole, "u": user_id, "t": threads},
            ).fetchall()
            events = [
                LoggedEvent(pos, eid, typ, tid, uid, at, self.keys.open(payload, wrapped))
                for pos, eid, typ, tid, uid, at, payload, wrapped in rows
            ]
            hashes = {_hash(t) for t in texts_to_embed(events).values()}
            derived = conn.execute(
                """SELECT text FROM messages
                   WHERE thread_id = ANY(%(whole)s) OR (user_id = %(u)s AND thread_id = ANY(%(t)s))
                   UNION ALL SELECT text FROM summaries WHERE thread_id = ANY(%(t)s)
                   UNION ALL SELECT text FROM facts WHERE user_id = ANY(%(users)s) OR thread_id = ANY(%(whole)s)
                   UNION ALL SELECT x.text FROM artifact_text x JOIN attachments a
                       ON x.sha256 = a.sha256 OR (x.event_id = a.event_id AND x.position = a.position)
                   WHERE a.thread_id = ANY(%(whole)s) OR (a.user_id = %(u)s AND a.thread_id = ANY(%(t)s))""",
                {"whole": whole, "u": user_id, "t": threads, "users": users},
            ).fetchall()
            hashes |= {_hash(r[0]) for r in derived}
            # A file's summary is cached by the hash of its prompt, which is rebuilt here from the
            # chunks kept for the file and each name it was sent under.
            files = conn.execute(
                f"""SELECT a.sha256, array_agg(DISTINCT coalesce(a.ref->>'filename', '')),
                           (SELECT array_agg(x.text ORDER BY x.ord) FROM artifact_text x
                            WHERE x.sha256 = a.sha256 AND x.kind = 'chunk')
                    FROM attachments a WHERE a.sha256 IS NOT NULL AND {_ours("a.")} GROUP BY a.sha256""",
                {"whole": whole, "u": user_id, "t": threads},
            ).fetchall()
            llm_inputs = {
                input_hash(file_summary(name or None, list(chunks or [])[:12]))
                for _, names, chunks in files
                for name in names
            }
            mem0_ids = [r[0] for r in conn.execute(
                "SELECT mem0_id FROM facts WHERE mem0_id IS NOT NULL AND (user_id = ANY(%s) OR thread_id = ANY(%s))",
                (users, whole),
            )]  # fmt: skip
        return ErasurePlan(user_id, threads, whole, hashes, mem0_ids, users, llm_inputs)

    def destroy_keys(self, plan: ErasurePlan) -> int:
        with self.pool.connection() as conn, conn.transaction():
            n = sum(self.keys.destroy(conn, thread_id=t) for t in plan.whole)
            if plan.user_id is not None:
                n += self.keys.destroy(conn, user_id=plan.user_id)
            return n

    def purge(self, plan: ErasurePlan) -> tuple[dict[str, int], list[str]]:
        """Delete what is not rebuilt by replay; returns counts per table and the sha256 of blobs
        no longer referenced (for the blob store to delete)."""
        p = {"whole": plan.whole, "u": plan.user_id, "t": plan.threads, "users": plan.users}
        ours = _ours()
        removed: dict[str, int] = {}
        with self.pool.connection() as conn, conn.transaction():
            removed["event_notices"] = conn.execute(
                f"DELETE FROM event_notices WHERE event_id IN (SELECT event_id FROM events WHERE {ours})", p
            ).rowcount
            removed["facts"] = conn.execute(
                "DELETE FROM facts WHERE user_id = ANY(%(users)s) OR thread_id = ANY(%(whole)s)", p
            ).rowcount
            # Ledger entries are keyed by episode (extracted facts) or by command event (remember).
            removed["fact_ledger"] = conn.execute(
                f"""DELETE FROM fact_ledger l
                    WHERE EXISTS (SELECT 1 FROM episodes e WHERE e.thread_id = ANY(%(t)s)
                                  AND starts_with(l.op_key, e.episode_id || ':'))
                       OR EXISTS (SELECT 1 FROM events ev WHERE {_ours("ev.")}
                                  AND ev.type = 'command' AND starts_with(l.op_key, ev.event_id || ':'))""",
                p,
            ).rowcount
            shas = [r[0] for r in conn.execute(
                f"SELECT DISTINCT sha256 FROM attachments WHERE sha256 IS NOT NULL AND {ours}", p
            )]  # fmt: skip
            removed["artifact_text"] = conn.execute(
                f"""DELETE FROM artifact_text WHERE (event_id, position) IN (
                        SELECT event_id, position FROM attachments WHERE {ours})""",
                p,
            ).rowcount
            removed["attachments"] = conn.execute(f"DELETE FROM attachments WHERE {ours}", p).rowcount
            # A file someone else also sent stays: it is theirs too.
            orphans = [r[0] for r in conn.execute(
                """SELECT s FROM unnest(%s::text[]) s
                   WHERE NOT EXISTS (SELECT 1 FROM attachments a WHERE a.sha256 = s)""",
                (shas,),
            )]  # fmt: skip
            removed["artifact_text"] += conn.execute(
                "DELETE FROM artifact_text WHERE sha256 = ANY(%s)", (orphans,)
            ).rowcount
            removed["artifacts"] = conn.execute("DELETE FROM artifacts WHERE sha256 = ANY(%s)", (orphans,)).rowcount
            removed["embedding_cache"] = conn.execute(
                "DELETE FROM embedding_cache WHERE text_hash = ANY(%s)", (list(plan.text_hashes),)
            ).rowcount
            removed["llm_cache"] = conn.execute(
                "DELETE FROM llm_cache WHERE thread_id = ANY(%s) OR input_hash = ANY(%s)",
                (plan.threads, list(plan.llm_inputs)),
            ).rowcount
            # Dead letters are raw bytes that may not even parse: any that names the subject goes.
            names = [f'"{x}"' for x in ([plan.user_id] if plan.user_id else []) + plan.whole]
            removed["dead_letters"] = conn.execute(
                """DELETE FROM dead_letters
                   WHERE EXISTS (SELECT 1 FROM unnest(%s::text[]) n
                                 WHERE position(convert_to(n, 'UTF8') IN raw) > 0)""",
                (names,),
            ).rowcount
            if plan.user_id is not None and plan.whole == plan.threads:
                removed["thread_members"] = conn.execute("DELETE FROM thread_members WHERE user_id = %(u)s", p).rowcount
            elif plan.user_id is not None:
                removed["thread_members"] = conn.execute(
                    "DELETE FROM thread_members WHERE user_id = %(u)s AND thread_id = ANY(%(t)s)", p
                ).rowcount
        return removed, orphans

    def redact_clear(self, plan: ErasurePlan) -> int:
        """Events logged while encryption was off have no key to destroy: their content is
        overwritten by a tombstone, the one change ever made to the log (the append-only trigger
        is lifted for this transaction only)."""
        p = {"whole": plan.whole, "u": plan.user_id, "t": plan.threads}
        with self.pool.connection() as conn, conn.transaction():
            clear = f"""(thread_id = ANY(%(whole)s) OR (user_id = %(u)s AND thread_id = ANY(%(t)s)))
                        AND NOT payload ? '{crypto.SEALED}' AND type IN ('message', 'message_edited', 'command')"""
            if conn.execute(f"SELECT 1 FROM events WHERE {clear} LIMIT 1", p).fetchone() is None:
                return 0
            conn.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
            n = conn.execute(
                f"""UPDATE events SET payload = (payload - 'text' - 'attachments' - 'metadata' - 'args')
                                             || jsonb_build_object('metadata', jsonb_build_object('{ERASED}', true))
                    WHERE {clear}""",
                p,
            ).rowcount
            conn.execute("ALTER TABLE events ENABLE TRIGGER events_append_only")
        return n

    def command_sender(self, thread_id: str, event_id: str) -> str | None:
        """The sender of a forget_me command of this thread, unless an erasure already answered it."""
        with self.pool.connection() as conn:
            row = conn.execute(
                """SELECT user_id FROM events WHERE event_id = %s AND thread_id = %s AND type = 'command'
                   AND payload->>'command' = 'forget_me'
                   AND NOT EXISTS (SELECT 1 FROM erasures WHERE requested_by = 'command:' || %s
                                   AND finished_at IS NOT NULL)""",
                (event_id, thread_id, event_id),
            ).fetchone()
        return row[0] if row else None

    def record(self, scope: str, subject: str, requested_by: str) -> int:
        with self.pool.connection() as conn:
            row = conn.execute(
                "INSERT INTO erasures (scope, subject, requested_by) VALUES (%s, %s, %s) RETURNING id",
                (scope, subject, requested_by),
            ).fetchone()
        assert row is not None
        return int(row[0])

    def finish(self, erasure_id: int, removed: dict[str, int]) -> None:
        from psycopg.types.json import Jsonb

        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE erasures SET removed = %s, finished_at = now() WHERE id = %s", (Jsonb(removed), erasure_id)
            )

    def erased_users(self, user_ids: Sequence[str]) -> set[str]:
        """Of these users, the ones with an erasure on record."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT DISTINCT subject FROM erasures WHERE scope = 'user' AND subject = ANY(%s)", (list(user_ids),)
            ).fetchall()
        return {r[0] for r in rows}
