"""The jobs the workers run, each one plain function over ports. A Celery task, replay and the
CLI call the same functions; only what happens next differs (a task queues the episode's facts,
replay runs them inline), and that is passed in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from chatmem.memory import fact_jobs
from chatmem.memory.episodes import Job
from chatmem.memory.fact_jobs import FactStore, MemoryStore
from chatmem.memory.ports import LLM, Embedder
from chatmem.memory.summaries import SummaryStore, run_job

# (thread_id, generation, episode_id): extract the facts of a closed episode, now or later.
FactsNext = Callable[[str, int, str], None]


class SummaryVectors(SummaryStore, Protocol):
    def embed_summaries(self, thread_id: str, embedder: Embedder) -> int:
        """Embed the thread's summaries that have no vector yet."""
        ...


class CommandFacts(FactStore, Protocol):
    def command_event(self, event_id: str) -> dict | None:
        """The remember / forget command event: thread_id, user_id, command, args."""
        ...

    def archive_rebuilt(self, thread_id: str, generation: int) -> list[tuple[int, str | None]]:
        """After a replay: archive what the old generations derived and the rebuild did not."""
        ...


@dataclass(frozen=True)
class Jobs:
    summaries: SummaryVectors
    embedder: Embedder
    facts: CommandFacts
    mem0: MemoryStore | None
    fanin: int
    keep: int

    def summarize(self, llm: LLM, thread_id: str, generation: int, job: Job, *, facts_next: FactsNext) -> str:
        """A running, chunk or final summary, then its vector; a saved final hands the episode on
        to fact extraction (keyed, so a repeat does nothing)."""
        outcome = run_job(self.summaries, llm, job, thread_id, generation, fanin=self.fanin, keep=self.keep)
        self.summaries.embed_summaries(thread_id, self.embedder)
        if job.kind == "final" and outcome in ("saved", "duplicate"):
            facts_next(thread_id, generation, job.episode_id)
        return outcome

    def episode_facts(self, llm: LLM, thread_id: str, generation: int, episode_id: str) -> dict:
        return fact_jobs.write_episode_facts(
            self.facts, self.mem0, llm, thread_id=thread_id, generation=generation, episode_id=episode_id
        )

    def fact_command(self, thread_id: str, generation: int, event_id: str) -> str:
        """A remember / forget command event of this thread; ValueError for anything else."""
        cmd = self.facts.command_event(event_id)
        if cmd is None or cmd["thread_id"] != thread_id or cmd["command"] not in ("remember", "forget"):
            raise ValueError(f"fact_command: no remember/forget event {event_id!r} in thread {thread_id!r}")
        handler = fact_jobs.remember if cmd["command"] == "remember" else fact_jobs.forget
        return handler(
            self.facts,
            self.mem0,
            thread_id=thread_id,
            generation=generation,
            event_id=event_id,
            user_id=cmd["user_id"],
            # The wire refuses NUL in arguments; a log written before it did may hold one, which
            # Postgres text cannot.
            text=str((cmd["args"] or {}).get("text", "")).replace("\x00", ""),
        )

    def run_inline(self, llm: LLM, thread_id: str, generation: int, job: Job) -> None:
        """A planned job and everything it leads to, now and in order (replay runs jobs so)."""
        if job.kind in ("remember", "forget"):
            self.fact_command(thread_id, generation, job.event_id or "")
            return
        if job.kind in ("forget_me", "forget_deleted"):
            return  # the live task erases; a replay meets what it erased as tombstones once it has

        def facts_now(t: str, g: int, episode_id: str) -> None:
            self.episode_facts(llm, t, g, episode_id)

        self.summarize(llm, thread_id, generation, job, facts_next=facts_now)

    def retire_rebuilt(self, thread_id: str, generation: int) -> None:
        """After a replay switched generations: archive the facts it did not re-derive, in Postgres
        and in mem0."""
        for _, mem0_id in self.facts.archive_rebuilt(thread_id, generation):
            if mem0_id and self.mem0 is not None:
                self.mem0.delete(mem0_id)
