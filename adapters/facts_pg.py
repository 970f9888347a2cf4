"""Facts in Postgres: one active value per (user, category, key), history kept, and the ledger."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from chatmem.adapters.keys_pg import EventKeys, wrapped_key_sql
from chatmem.adapters.sql import one, scalar
from chatmem.memory.fact_jobs import FactWrite, UserLine
from chatmem.memory.facts import FactCandidate, resolve
from chatmem.memory.text import TYPO_APOSTROPHES


class PostgresFactStore:
    def __init__(self, pool: ConnectionPool, keys: EventKeys):
        self.pool = pool
        self.keys = keys

    def ledger_get(self, op_key: str) -> dict | None:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT result FROM fact_ledger WHERE op_key = %s", (op_key,)).fetchone()
        return row[0] if row else None

    def ledger_put(self, op_key: str, result: dict) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO fact_ledger (op_key, result) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (op_key, Jsonb(result)),
            )

    def missing_facts(self, older_than_s: float, limit: int = 500) -> list[tuple[str, int, str]]:
        """Closed episodes of active generations with a final summary older than `older_than_s`
        and no facts entry in the ledger (a lost job), for the sweeper to re-queue."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT e.thread_id, e.generation, e.episode_id
                   FROM episodes e JOIN threads t ON t.thread_id = e.thread_id AND t.generation = e.generation
                   JOIN summaries s ON s.generation = e.generation AND s.summary_key = e.episode_id || ':final'
                   WHERE e.status = 'closed' AND s.created_at < now() - make_interval(secs => %s)
                     AND NOT EXISTS (SELECT 1 FROM fact_ledger l
                                     WHERE l.op_key = e.episode_id || ':g' || e.generation || ':facts')
                   ORDER BY s.created_at LIMIT %s""",
                (older_than_s, limit),
            ).fetchall()
        return [(t, int(g), e) for t, g, e in rows]

    def job_state(self, op_key: str, thread_id: str, generation: int) -> tuple[dict | None, bool]:
        with self.pool.connection() as conn:
            done, active = one(
                conn,
                """SELECT (SELECT result FROM fact_ledger WHERE op_key = %s),
                              (SELECT generation FROM threads WHERE thread_id = %s)""",
                (op_key, thread_id),
            )
        return done, active is not None and generation >= active

    def episode_user_lines(self, thread_id: str, generation: int, episode_id: str) -> list[UserLine]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                # By the episode index alone (the episode id carries its thread): with the thread
                # too, the planner walked the whole thread of a generation still being rebuilt.
                """SELECT seq, event_id, user_id, text FROM messages WHERE episode_id = %s AND generation = %s
                   AND role = 'user' ORDER BY seq""",
                (episode_id, generation),
            ).fetchall()
        return [UserLine(*r) for r in rows]

    def apply_fact(
        self,
        *,
        user_id: str,
        thread_id: str,
        generation: int,
        episode_id: str | None,
        fact: FactCandidate,
        event_ids: list[str],
        source: str,
    ) -> FactWrite:
        for _attempt in range(3):  # two writers racing for the same key: the loser re-reads
            try:
                return self._apply(user_id, thread_id, generation, episode_id, fact, event_ids, source)
            except psycopg.errors.UniqueViolation:
                continue
        raise RuntimeError(f"could not settle fact {fact.category}/{fact.key} for {user_id}")

    def _apply(self, user_id, thread_id, generation, episode_id, fact, event_ids, source) -> FactWrite:  # noqa: ANN001
        with self.pool.connection() as conn, conn.transaction():
            active = conn.execute(
                """SELECT id, value, confidence, thread_id, generation, mem0_id FROM facts
                   WHERE user_id = %s AND category = %s AND key = %s AND is_active FOR UPDATE""",
                (user_id, fact.category, fact.key),
            ).fetchone()
            rebuilt = active is not None and active[3] == thread_id and active[4] < generation
            if active is not None and rebuilt and active[1].lower() == fact.value.lower():
                # Re-derived unchanged by a rebuild: the row (and its mem0 entry) moves to the new
                # generation instead of being churned.
                conn.execute(
                    """UPDATE facts SET generation = %s, episode_id = %s, source_event_ids = %s, text = %s
                       WHERE id = %s""",
                    (generation, episode_id, event_ids, fact.text, active[0]),
                )
                return FactWrite("same", active[0], [], moved=True)
            if rebuilt:
                decision_action = "replace"  # a rebuild of this thread supersedes its old generation
            else:
                decision = resolve(
                    fact.confidence,
                    active[2] if active else None,
                    active is not None and active[1].lower() == fact.value.lower(),
                )
                decision_action = decision.action
            if decision_action in ("same", "keep_old"):
                return FactWrite(decision_action, active[0] if active else None, [])
            replaced: list[tuple[int, str | None]] = []
            if active is not None:
                conn.execute(
                    """UPDATE facts SET is_active = false, archived_at = now(), archived_reason = 'replaced'
                       WHERE id = %s""",
                    (active[0],),
                )
                replaced.append((active[0], active[5]))
            new_id = scalar(
                conn,
                """INSERT INTO facts (user_id, thread_id, generation, episode_id, category, key, value, text,
                                      confidence, importance, source, source_event_ids)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
                (
                    user_id,
                    thread_id,
                    generation,
                    episode_id,
                    fact.category,
                    fact.key,
                    fact.value,
                    fact.text,
                    fact.confidence,
                    fact.importance,
                    source,
                    event_ids,
                ),
            )
            if replaced:
                conn.execute("UPDATE facts SET archived_by = %s WHERE id = %s", (str(new_id), replaced[0][0]))
            return FactWrite("insert" if active is None else "replace", new_id, replaced)

    def set_mem0_id(self, fact_id: int, mem0_id: str) -> None:
        with self.pool.connection() as conn:
            conn.execute("UPDATE facts SET mem0_id = %s WHERE id = %s", (mem0_id, fact_id))

    def mem0_id_of(self, fact_id: int) -> str | None:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT mem0_id FROM facts WHERE id = %s", (fact_id,)).fetchone()
        return row[0] if row else None

    def forget(self, *, user_id: str, text: str, event_id: str) -> list[tuple[int, str | None]]:
        # position(), not LIKE: the text is the user's, and % or _ must not act as wildcards.
        # Apostrophes are compared plain on both sides: a phone types "Peter’s", the pattern
        # extractor stores "Peter's", and a model may write either.
        with self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                """WITH q AS (SELECT translate(lower(%(text)s), %(typo)s, %(plain)s) AS t)
                   UPDATE facts SET is_active = false, archived_at = now(), archived_reason = 'forgotten',
                          archived_by = %(event)s
                   FROM q
                   WHERE user_id = %(user)s AND is_active AND (
                         position(translate(lower(value), %(typo)s, %(plain)s) IN q.t) > 0
                      OR position(q.t IN translate(lower(value), %(typo)s, %(plain)s)) > 0
                      OR (length(key) > 2 AND position(translate(lower(key), %(typo)s, %(plain)s) IN q.t) > 0))
                   RETURNING id, mem0_id""",
                {
                    "event": event_id,
                    "user": user_id,
                    "text": text.strip(),
                    "typo": TYPO_APOSTROPHES,
                    "plain": "'" * len(TYPO_APOSTROPHES),
                },
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def command_event(self, event_id: str) -> dict | None:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                f"""SELECT thread_id, user_id, payload, {wrapped_key_sql("events")} AS wrapped
                   FROM events WHERE event_id = %s AND type = 'command'""",
                (event_id,),
            ).fetchone()
        if row is None:
            return None
        payload = self.keys.open(row.pop("payload"), row.pop("wrapped"))
        return {**row, "command": payload.get("command"), "args": payload.get("args") or {}}

    def set_command_detail(self, event_id: str, generation: int, detail: str) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE commands_applied SET detail = %s WHERE event_id = %s AND generation = %s",
                (detail, event_id, generation),
            )

    def archive_rebuilt(self, thread_id: str, generation: int) -> list[tuple[int, str | None]]:
        """After a replay switched to `generation`: the facts the old generations derived and the
        rebuild did not re-derive are archived (this thread's only)."""
        with self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                """UPDATE facts SET is_active = false, archived_at = now(), archived_reason = 'rebuilt'
                   WHERE thread_id = %s AND generation < %s AND is_active RETURNING id, mem0_id""",
                (thread_id, generation),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def user_facts(self, user_id: str, *, include_history: bool = False) -> list[dict]:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                f"""SELECT id, category, key, value, confidence, is_active, archived_reason, thread_id, episode_id,
                           source, source_event_ids, mem0_id, created_at FROM facts
                    WHERE user_id = %s {"" if include_history else "AND is_active"}
                    ORDER BY category, key, id""",
                (user_id,),
            ).fetchall()
