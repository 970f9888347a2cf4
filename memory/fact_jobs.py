"""Fact jobs (queue `facts`): an episode's facts when it closes, and the remember / forget
commands. Each operation is recorded in a ledger, so a retried job writes nothing twice; the
mem0 write is checked against mem0 itself (by the fact's id in its metadata) before adding.

The ledger entry of an extraction or a remember also lists what it derived (`derived`): per fact,
the user, category and key, a digest of the candidate (not its words) and whether the write left
a row of this operation in `facts`. `replay --check` compares a rebuild's derivation with it."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from chatmem.memory import prompts
from chatmem.memory.facts import FactCandidate, from_remember, normalise_key
from chatmem.memory.ports import LLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FactWrite:
    action: str  # insert | replace | same | keep_old
    fact_id: int | None
    replaced: list[tuple[int, str | None]]  # (fact id, mem0 id) archived by this write
    moved: bool = False  # "same" after a rebuild: the old generation's row moved to this one

    @property
    def owns_row(self) -> bool:
        """The write left a row in `facts` that belongs to this operation."""
        return self.action in ("insert", "replace") or self.moved


def candidate_digest(fact: FactCandidate) -> str:
    """What an extraction produced for one fact, as a digest (the ledger holds no words)."""
    data = [fact.category, fact.key, fact.value, fact.text, fact.confidence, fact.importance]
    return hashlib.sha256(json.dumps(data, ensure_ascii=False).encode()).hexdigest()[:16]


def derived_entry(user_id: str, fact: FactCandidate, write: FactWrite) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "category": fact.category,
        "key": fact.key,
        "digest": candidate_digest(fact),
        "action": write.action,
        "row": write.owns_row,
    }


def counts_only(result: dict) -> dict:
    """A ledger result without its derivation list (what a task returns)."""
    return {k: v for k, v in result.items() if k != "derived"}


@dataclass(frozen=True)
class UserLine:
    seq: int
    event_id: str
    user_id: str
    text: str


class FactStore(Protocol):
    def ledger_get(self, op_key: str) -> dict | None: ...

    def ledger_put(self, op_key: str, result: dict) -> None: ...

    def job_state(self, op_key: str, thread_id: str, generation: int) -> tuple[dict | None, bool]:
        """(the ledger entry of `op_key`, the generation is still the thread's current one), read
        together: a rebuild asks once per episode."""
        ...

    def episode_user_lines(self, thread_id: str, generation: int, episode_id: str) -> list[UserLine]: ...

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
    ) -> FactWrite: ...

    def set_mem0_id(self, fact_id: int, mem0_id: str) -> None: ...

    def mem0_id_of(self, fact_id: int) -> str | None: ...

    def forget(self, *, user_id: str, text: str, event_id: str) -> list[tuple[int, str | None]]: ...

    def set_command_detail(self, event_id: str, generation: int, detail: str) -> None: ...


class MemoryStore(Protocol):
    def add(self, text: str, *, user_id: str, run_id: str, metadata: dict[str, Any]) -> list[str]: ...

    def find(self, *, user_id: str, fact_id: int) -> list[str]: ...

    def delete(self, memory_id: str) -> None: ...


PENDING = "pending"  # mem0 write begun: a retry must look in mem0 before adding


def _mem0_write(
    store: FactStore,
    mem: MemoryStore | None,
    write: FactWrite,
    *,
    user_id: str,
    thread_id: str,
    episode_id: str | None,
    fact: FactCandidate,
    event_ids: list[str],
) -> None:
    """Make mem0 hold exactly the active value. The intent is recorded in Postgres first, so only a
    write interrupted by a crash pays for the lookup in mem0."""
    if mem is None:
        return
    for _, old_mem0 in write.replaced:
        if old_mem0 and old_mem0 != PENDING:
            mem.delete(old_mem0)  # mem0 holds the current value only; the history is in Postgres
    if write.fact_id is None or write.action == "keep_old":
        return
    state = store.mem0_id_of(write.fact_id)
    if state and state != PENDING:
        return  # already in mem0
    ids = mem.find(user_id=user_id, fact_id=write.fact_id) if state == PENDING else []
    if not ids:
        store.set_mem0_id(write.fact_id, PENDING)
        ids = mem.add(
            fact.text,
            user_id=user_id,
            run_id=episode_id or thread_id,
            metadata={
                "thread_id": thread_id,
                "episode_id": episode_id or "",
                "category": fact.category,
                "key": fact.key,
                "source_event_ids": event_ids,
                "chatmem_fact_id": str(write.fact_id),
            },
        )
    if ids:
        store.set_mem0_id(write.fact_id, ids[0])


def store_fact(
    store: FactStore,
    mem: MemoryStore | None,
    *,
    user_id: str,
    thread_id: str,
    generation: int,
    episode_id: str | None,
    fact: FactCandidate,
    event_ids: list[str],
    source: str,
) -> FactWrite:
    """Settle the fact in Postgres, then make mem0 match."""
    write = store.apply_fact(
        user_id=user_id,
        thread_id=thread_id,
        generation=generation,
        episode_id=episode_id,
        fact=fact,
        event_ids=event_ids,
        source=source,
    )
    _mem0_write(
        store, mem, write, user_id=user_id, thread_id=thread_id, episode_id=episode_id, fact=fact, event_ids=event_ids
    )
    return write


def write_episode_facts(
    store: FactStore, mem: MemoryStore | None, llm: LLM, *, thread_id: str, generation: int, episode_id: str
) -> dict:
    """The facts the user stated in a closed episode, extracted through the LLM port: patterns
    on the offline provider, the model when one is configured; both answer in one schema."""
    op = f"{episode_id}:g{generation}:facts"
    done, current = store.job_state(op, thread_id, generation)
    if done is not None:
        return {**counts_only(done), "duplicate": True}
    if not current:
        return {"stale": True}
    lines = store.episode_user_lines(thread_id, generation, episode_id)
    if not lines:
        store.ledger_put(op, {"derived": []})
        return {}
    result = llm.complete(
        prompts.extract_facts([prompts.Line(seq=ln.seq, role="user", text=ln.text) for ln in lines]),
        prompts.FactList,
    )
    outcome: dict[str, int] = {}
    derived: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for item in result.facts:
        # The prompt numbers its lines from 1 (prompts.numbered).
        line = lines[item.seq - 1] if 1 <= item.seq <= len(lines) else None
        key = normalise_key(item.key, 6) if item.key != "name" else "name"
        if line is None or not key or not item.value.strip() or (line.user_id, item.category, key) in seen:
            continue  # a fact the model attributed to no user message of this episode
        seen.add((line.user_id, item.category, key))
        fact = FactCandidate(item.category, key, item.value.strip(), item.confidence, item.importance, item.text)
        write = store_fact(
            store,
            mem,
            user_id=line.user_id,
            thread_id=thread_id,
            generation=generation,
            episode_id=episode_id,
            fact=fact,
            event_ids=[line.event_id],
            source="extracted",
        )
        outcome[write.action] = outcome.get(write.action, 0) + 1
        derived.append(derived_entry(line.user_id, fact, write))
    store.ledger_put(op, {**outcome, "derived": derived})
    return outcome


def _command_once(store: FactStore, op: str, event_id: str, generation: int, work: Callable[[], dict]) -> str:
    """Run a remember / forget once: a retried job returns the recorded outcome."""
    if (done := store.ledger_get(op)) is not None:
        return str(done.get("detail"))
    result = work()
    store.set_command_detail(event_id, generation, result["detail"])
    store.ledger_put(op, result)
    return result["detail"]


def remember(
    store: FactStore,
    mem: MemoryStore | None,
    *,
    thread_id: str,
    generation: int,
    event_id: str,
    user_id: str,
    text: str,
) -> str:
    def work() -> dict:
        if not text.strip():
            return {"detail": "remember: nothing to remember (args.text is empty)", "derived": []}
        fact = from_remember(text)
        write = store_fact(
            store,
            mem,
            user_id=user_id,
            thread_id=thread_id,
            generation=generation,
            episode_id=None,
            fact=fact,
            event_ids=[event_id],
            source="remember",
        )
        return {
            "detail": f"remember: {fact.category}/{fact.key} = {fact.value!r} ({write.action})",
            "derived": [derived_entry(user_id, fact, write)],
        }

    return _command_once(store, f"{event_id}:g{generation}:remember", event_id, generation, work)


def forget(
    store: FactStore,
    mem: MemoryStore | None,
    *,
    thread_id: str,
    generation: int,
    event_id: str,
    user_id: str,
    text: str,
) -> str:
    def work() -> dict:
        archived = store.forget(user_id=user_id, text=text, event_id=event_id) if text.strip() else []
        for _, mem0_id in archived:
            if mem is not None and mem0_id and mem0_id != PENDING:
                mem.delete(mem0_id)
        detail = f"forget: archived {len(archived)} fact(s)" if archived else "forget: nothing matched"
        return {"detail": detail, "fact_ids": [f for f, _ in archived]}

    return _command_once(store, f"{event_id}:g{generation}:forget", event_id, generation, work)
