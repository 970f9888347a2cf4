"""The Postgres side of erasure (`chatmem erase`): which threads a subject touches, the data keys
to destroy, and every row outside the generational projections that holds content derived from
the erased events. The generational projections (messages, episodes, summaries, commands) are
rebuilt by replay over the tombstones, then the old generations are collected."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

import psycopg
from psycopg_pool import ConnectionPool

from chatmem.adapters import crypto
from chatmem.adapters.cache_uses import Used
from chatmem.adapters.keys_pg import KID, EventKeys, wrapped_key_sql
from chatmem.adapters.llm import input_hash
from chatmem.adapters.sql import THREAD_FAMILY
from chatmem.memory.episodes import author_name, message_text, texts_to_embed
from chatmem.memory.prompts import file_summary, named_text
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
    event_ids: list[str] | None = None  # set: exactly these events (retention), not a subject

    @property
    def params(self) -> dict:
        return {"whole": self.whole, "u": self.user_id, "t": self.threads, "users": self.users, "ids": self.event_ids}

    def rows(self, alias: str = "") -> str:
        """The covered rows of a table with event_id, thread_id and user_id (`alias` is ours)."""
        if self.event_ids is not None:
            return f"{alias}event_id = ANY(%(ids)s)"
        return _ours(alias)

    @property
    def facts(self) -> str:
        """The covered facts: derived from the covered events, or all of the subject's."""
        if self.event_ids is not None:
            return "source_event_ids && %(ids)s::text[]"
        return "(user_id = ANY(%(users)s) OR thread_id = ANY(%(whole)s))"


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
        return self._derived(ErasurePlan(user_id, threads, whole, users=users))

    def plan_events(self, event_ids: Sequence[str]) -> ErasurePlan:
        """A plan for exactly these events (retention): their threads are rebuilt, nothing else."""
        with self.pool.connection() as conn:
            threads = [r[0] for r in conn.execute(
                "SELECT DISTINCT thread_id FROM events WHERE event_id = ANY(%s) ORDER BY 1", (list(event_ids),)
            )]  # fmt: skip
        return self._derived(ErasurePlan(None, threads, [], event_ids=list(event_ids)))

    def _derived(self, plan: ErasurePlan) -> ErasurePlan:
        """What must be found before the content is gone: hashes of every text derived from it
        (the embedding cache is keyed by them), its files' summary prompts (the LLM cache) and
        the mem0 memories of the facts it yields."""
        p = plan.params
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT stream_pos, event_id, type, thread_id, user_id, occurred_at, payload,
                           {wrapped_key_sql("e")}
                    FROM events e WHERE {plan.rows("e.")} AND type IN ('message', 'message_edited')""",
                p,
            ).fetchall()
            events = [
                LoggedEvent(pos, eid, typ, tid, uid, at, self.keys.open(payload, wrapped))
                for pos, eid, typ, tid, uid, at, payload, wrapped in rows
            ]
            hashes = {_hash(t) for t in texts_to_embed(events).values()}
            # Summaries embed a message as its author's name and its text as of the summary
            # (see Line.embedding_text): the logged text and the projection's latest one.
            names = {e.event_id: n for e in events if e.type == "message" and (n := author_name(e.payload))}
            hashes |= {
                _hash(named_text(names[e.event_id], message_text(e.payload))) for e in events if e.event_id in names
            }
            for event_id, text in conn.execute(
                "SELECT event_id, text FROM messages WHERE event_id = ANY(%s)", (list(names),)
            ).fetchall():
                hashes.add(_hash(named_text(names[event_id], text)))
            derived = conn.execute(
                f"""SELECT text FROM messages WHERE {plan.rows()}
                    UNION ALL SELECT text FROM summaries WHERE thread_id = ANY(%(t)s)
                    UNION ALL SELECT text FROM facts WHERE {plan.facts}
                    UNION ALL SELECT x.text FROM artifact_text x JOIN attachments a
                        ON x.sha256 = a.sha256 OR (x.event_id = a.event_id AND x.position = a.position)
                    WHERE {plan.rows("a.")}""",
                p,
            ).fetchall()
            hashes |= {_hash(r[0]) for r in derived}
            # A file's summary is cached by the hash of its prompt, which is rebuilt here from the
            # chunks kept for the file and each name it was sent under.
            files = conn.execute(
                f"""SELECT a.sha256, array_agg(DISTINCT coalesce(a.ref->>'filename', '')),
                           (SELECT array_agg(x.text ORDER BY x.ord) FROM artifact_text x
                            WHERE x.sha256 = a.sha256 AND x.kind = 'chunk')
                    FROM attachments a WHERE a.sha256 IS NOT NULL AND {plan.rows("a.")} GROUP BY a.sha256""",
                p,
            ).fetchall()
            llm_inputs = {
                input_hash(file_summary(name or None, list(chunks or [])[:12]))
                for _, names, chunks in files
                for name in names
            }
            mem0_ids = [r[0] for r in conn.execute(
                f"SELECT mem0_id FROM facts WHERE mem0_id IS NOT NULL AND {plan.facts}", p
            )]  # fmt: skip
        return replace(plan, text_hashes=hashes, mem0_ids=mem0_ids, llm_inputs=llm_inputs)

    def destroy_keys(self, plan: ErasurePlan) -> int:
        with self.pool.connection() as conn, conn.transaction():
            n = sum(self.keys.destroy(conn, thread_id=t) for t in plan.whole)
            if plan.user_id is not None:
                n += self.keys.destroy(conn, user_id=plan.user_id)
            return n

    def purge(self, plan: ErasurePlan) -> tuple[dict[str, int], list[str]]:
        """Delete what is not rebuilt by replay; returns counts per table and the sha256 of blobs
        no longer referenced (for the blob store to delete)."""
        p = plan.params
        ours = plan.rows()
        removed: dict[str, int] = {}
        with self.pool.connection() as conn, conn.transaction():
            removed["event_notices"] = conn.execute(
                f"DELETE FROM event_notices WHERE event_id IN (SELECT event_id FROM events WHERE {ours})", p
            ).rowcount
            removed["facts"] = conn.execute(f"DELETE FROM facts WHERE {plan.facts}", p).rowcount
            # Ledger entries are keyed by episode (extracted facts) or by command event (remember).
            removed["fact_ledger"] = conn.execute(
                f"""DELETE FROM fact_ledger l
                    WHERE EXISTS (SELECT 1 FROM episodes e WHERE e.thread_id = ANY(%(t)s)
                                  AND starts_with(l.op_key, e.episode_id || ':'))
                       OR EXISTS (SELECT 1 FROM events ev WHERE {plan.rows("ev.")}
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
            # The threads' other model answers (LLM outputs, pair model logits, which read several
            # turns, no single message's) are swept after the rebuild: sweep_answers.
            removed["llm_cache"] = conn.execute(
                "DELETE FROM llm_cache WHERE input_hash = ANY(%s)", (list(plan.llm_inputs),)
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

    def sweep_answers(self, threads: Sequence[str], used: Used) -> dict[str, int]:
        """Delete the threads' LLM outputs and pair model answers that their rebuild did not use
        (adapters/cache_uses.py): every answer computed from the removed events is among them."""
        llm, pairs = sorted(used.llm), sorted(used.pairs)
        with self.pool.connection() as conn, conn.transaction():
            outputs = conn.execute(
                """DELETE FROM llm_cache c WHERE c.thread_id = ANY(%s) AND NOT EXISTS (
                       SELECT 1 FROM unnest(%s::text[], %s::text[], %s::bytea[]) u(model, version, hash)
                       WHERE u.model = c.model AND u.version = c.prompt_version AND u.hash = c.input_hash)""",
                (list(threads), [k[0] for k in llm], [k[1] for k in llm], [k[2] for k in llm]),
            ).rowcount
            answers = conn.execute(
                """DELETE FROM pair_cache c WHERE c.thread_id = ANY(%s) AND NOT EXISTS (
                       SELECT 1 FROM unnest(%s::text[], %s::bytea[]) u(model, hash)
                       WHERE u.model = c.model AND u.hash = c.input_hash)""",
                (list(threads), [k[0] for k in pairs], [k[1] for k in pairs]),
            ).rowcount
        return {"llm_cache": outputs, "pair_cache": answers}

    def redact(self, plan: ErasurePlan, *, clear_only: bool) -> int:
        """Overwrite the content of the covered events with a tombstone, in the log itself: the
        one change ever made to it (the append-only trigger is lifted for this transaction only).
        An erasure needs it only for events logged in clear (with encryption off), which have no
        key to destroy; retention removes expired content, sealed or not, while the key lives on."""
        p = plan.params
        sealed = f"AND NOT payload ? '{crypto.SEALED}'" if clear_only else ""
        with self.pool.connection() as conn, conn.transaction():
            clear = f"""{plan.rows()} {sealed} AND type IN ('message', 'message_edited', 'command')
                        AND NOT coalesce(payload->'metadata' ? '{ERASED}', false)"""
            if conn.execute(f"SELECT 1 FROM events WHERE {clear} LIMIT 1", p).fetchone() is None:
                return 0
            conn.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
            n = conn.execute(
                f"""UPDATE events SET payload = (payload - 'text' - 'attachments' - 'metadata' - 'args'
                                                     - '{crypto.SEALED}' - '{KID}')
                                             || jsonb_build_object('metadata', jsonb_build_object('{ERASED}', true))
                    WHERE {clear}""",
                p,
            ).rowcount
            conn.execute("ALTER TABLE events ENABLE TRIGGER events_append_only")
        return n

    def expired(self, now: datetime, days: float | None, days_by: dict[str, float], limit: int = 10_000) -> list[str]:
        """Events past their retention at `now`, content not yet removed: a thread's own period
        wins over its platform's, which wins over the global one; 0 keeps forever."""
        threads = {k.split(":", 1)[1]: v for k, v in days_by.items() if k.startswith("thread:")}
        platforms = {k.split(":", 1)[1]: v for k, v in days_by.items() if k.startswith("platform:")}
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""WITH policy AS (
                        SELECT e.event_id, e.occurred_at, coalesce(t.days, p.days, %(days)s::float8) AS days
                        FROM events e
                        LEFT JOIN unnest(%(tids)s::text[], %(tdays)s::float8[]) t(thread_id, days)
                            ON t.thread_id = e.thread_id
                        LEFT JOIN unnest(%(pnames)s::text[], %(pdays)s::float8[]) p(platform, days)
                            ON p.platform = e.payload->>'platform'
                        WHERE e.type IN ('message', 'message_edited', 'command')
                          AND NOT coalesce(e.payload->'metadata' ? '{ERASED}', false))
                    SELECT event_id FROM policy
                    WHERE days > 0 AND occurred_at < %(now)s - make_interval(secs => days * 86400)
                    ORDER BY occurred_at LIMIT %(n)s""",
                {
                    "days": days,
                    "tids": list(threads),
                    "tdays": list(threads.values()),
                    "pnames": list(platforms),
                    "pdays": list(platforms.values()),
                    "now": now,
                    "n": limit,
                },
            ).fetchall()
        return [r[0] for r in rows]

    def deleted(self, thread_id: str, *, shredded_too: bool = False) -> list[str]:
        """The messages, and their edits, that a message_deleted event of the thread names and
        whose content is still there (or, `shredded_too`, whether or not it is): in the thread or
        in its sub-threads (`<thread>:<topic>`), since a chat's deletion does not say which forum
        topic the message was in."""
        still = "" if shredded_too else f"AND NOT coalesce(e.payload->'metadata' ? '{ERASED}', false)"
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""WITH gone AS (
                        SELECT DISTINCT jsonb_array_elements_text(payload->'platform_message_ids') AS id
                        FROM events WHERE thread_id = %(t)s AND type = 'message_deleted'),
                    family AS ({THREAD_FAMILY})
                    SELECT e.event_id FROM events e
                    JOIN family USING (thread_id)
                    JOIN gone ON gone.id = e.payload->>'platform_message_id'
                    WHERE e.type IN ('message', 'message_edited') {still}
                    ORDER BY e.stream_pos""",
                {"t": thread_id},
            ).fetchall()
        return [r[0] for r in rows]

    def expire_dead_letters(self, before: datetime) -> int:
        with self.pool.connection() as conn:
            return conn.execute("DELETE FROM dead_letters WHERE last_seen < %s", (before,)).rowcount

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

    @contextmanager
    def one_run(self, name: str) -> Iterator[None]:
        """Runs of one name one after another: a session lock on a connection of its own, which
        closing releases, also when the process dies. A run that then finds an unfinished record
        knows that run stopped, not that it is still going."""
        info = self.pool.conninfo
        with psycopg.connect(info if isinstance(info, str) else info(), autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"chatmem.{name}",))
            yield

    def unfinished(self, scope: str, subject: str | None = None) -> list[tuple[int, list[str]]]:
        """Runs of the scope (and subject) recorded and never finished, oldest first, with the
        threads each had yet to rebuild (note_pending)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT id, coalesce(removed->'pending_threads', '[]') FROM erasures
                   WHERE scope = %s AND (%s::text IS NULL OR subject = %s) AND finished_at IS NULL
                   ORDER BY id""",
                (scope, subject, subject),
            ).fetchall()
        return [(int(i), [str(t) for t in pending]) for i, pending in rows]

    def note_pending(self, erasure_id: int, threads: Sequence[str]) -> None:
        """The threads a run must rebuild, kept until it finishes (finish replaces them)."""
        from psycopg.types.json import Jsonb

        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE erasures SET removed = %s WHERE id = %s",
                (Jsonb({"pending_threads": list(threads)}), erasure_id),
            )

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
