"""Summary jobs: running, chunk and final summaries of an episode, and hierarchical roll-ups.

Each job is keyed (episode, kind, upto_seq), so a duplicate does nothing. The LLM is called with
no transaction open; the result is stored only if the generation it was computed for is still
the thread's active one. A final summary archives the episode's running and chunk summaries and
its messages (archived, never deleted); a failed job changes nothing and is retried.

Roll-ups are deterministic whatever order jobs run in: level-1 summaries (one per episode) are
indexed by episode ordinal, grouped `fanin` at a time, and a complete group is merged into a
level-2 summary once `keep` newer level-1 summaries exist; the same again up to level 3."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from chatmem.memory import prompts
from chatmem.memory.episodes import Job
from chatmem.memory.ports import LLM

log = logging.getLogger(__name__)

MAX_LEVEL = 3
RUNNING_WINDOW = 60  # messages a running summary looks at


@dataclass(frozen=True)
class SummaryRecord:
    summary_key: str
    generation: int
    thread_id: str
    episode_id: str | None
    kind: str
    level: int
    from_seq: int
    upto_seq: int
    text: str
    content: dict[str, Any]
    source_keys: tuple[str, ...]
    model: str
    prompt_version: str


@dataclass(frozen=True)
class LevelItem:
    summary_key: str
    index: int  # episode ordinal - 1 at level 1, group number above
    from_seq: int
    upto_seq: int
    text: str
    is_active: bool


class SummaryStore(Protocol):
    def has_summary(self, generation: int, summary_key: str) -> bool: ...

    def summary_keys(self, thread_id: str, generation: int, level: int) -> set[str]:
        """Keys of the thread's summaries at `level` (active or archived) in the generation."""
        ...

    def generation_active(self, thread_id: str, generation: int) -> bool: ...

    def episode_lines(
        self, thread_id: str, generation: int, episode_id: str, from_seq: int, upto_seq: int
    ) -> list[prompts.Line]: ...

    def save_summary(self, record: SummaryRecord, *, archive_episode: bool) -> bool:
        """Insert unless present (False then); with archive_episode, also archive the episode's
        running and chunk summaries and its messages, and set its topic label. Raises
        StaleGeneration when the generation is no longer active."""
        ...

    def level_items(self, thread_id: str, generation: int, level: int) -> list[LevelItem]: ...


class StaleGeneration(Exception):
    """The thread was rebuilt meanwhile; this result belongs to an abandoned generation."""


def job_key(job: Job) -> str:
    if job.kind == "final":
        return f"{job.episode_id}:final"
    return f"{job.episode_id}:{job.kind}:{job.upto_seq}"


def run_job(store: SummaryStore, llm: LLM, job: Job, thread_id: str, generation: int, *, fanin: int, keep: int) -> str:
    key = job_key(job)
    if store.has_summary(generation, key):
        return "duplicate"
    if not store.generation_active(thread_id, generation):
        return "stale"
    if job.kind == "running":
        # From the episode's own recent lines only, never from the previous running summary:
        # jobs may finish in any order, and replay must reproduce the same text.
        start = max(job.from_seq, job.upto_seq - RUNNING_WINDOW + 1)
        lines = store.episode_lines(thread_id, generation, job.episode_id, start, job.upto_seq)
        prompt = prompts.running_summary(lines)
        result = llm.complete(prompt, prompts.RunningSummary)
        record = _record(job, key, thread_id, generation, 0, result.summary, result.model_dump(), llm, prompt)
    elif job.kind == "chunk":
        lines = store.episode_lines(thread_id, generation, job.episode_id, job.from_seq, job.upto_seq)
        prompt = prompts.chunk_summary(lines)
        result = llm.complete(prompt, prompts.RunningSummary)
        record = _record(job, key, thread_id, generation, 0, result.summary, result.model_dump(), llm, prompt)
    elif job.kind == "final":
        lines = store.episode_lines(thread_id, generation, job.episode_id, job.from_seq, job.upto_seq)
        prompt = prompts.final_summary(lines)
        final = llm.complete(prompt, prompts.FinalSummary)
        record = _record(
            job, key, thread_id, generation, 1, final.summary or final.topic, final.model_dump(), llm, prompt
        )
    else:
        raise ValueError(f"unknown summary job kind {job.kind!r}")
    try:
        saved = store.save_summary(record, archive_episode=job.kind == "final")
    except StaleGeneration:
        return "stale"
    if job.kind == "final":
        rollup(store, llm, thread_id, generation, fanin=fanin, keep=keep)
    return "saved" if saved else "duplicate"


def _record(
    job: Job,
    key: str,
    thread_id: str,
    generation: int,
    level: int,
    text: str,
    content: dict,
    llm: LLM,
    prompt: prompts.Prompt,
) -> SummaryRecord:
    return SummaryRecord(
        key,
        generation,
        thread_id,
        job.episode_id,
        job.kind,
        level,
        job.from_seq,
        job.upto_seq,
        text,
        content,
        (),
        llm.model,
        prompt.version,
    )


def rollup(store: SummaryStore, llm: LLM, thread_id: str, generation: int, *, fanin: int, keep: int) -> int:
    made = 0
    for level in range(1, MAX_LEVEL):
        items = {i.index: i for i in store.level_items(thread_id, generation, level)}
        if not items:
            break
        top = max(items)
        # One query per level, not one per group: a long thread has hundreds of groups, and
        # every final summary walks them all.
        have = store.summary_keys(thread_id, generation, level + 1)
        for group in range(0, top // fanin + 1):
            found = [items.get(group * fanin + j) for j in range(fanin)]
            newer = sum(1 for idx in items if idx >= (group + 1) * fanin)
            members = [m for m in found if m is not None]
            if len(members) < fanin or newer < keep:
                continue
            key = f"{thread_id}:L{level + 1}:g{group}"
            if key in have:
                continue
            prompt = prompts.rollup_summary([m.text for m in members])
            result = llm.complete(prompt, prompts.RollupSummary)
            record = SummaryRecord(
                key,
                generation,
                thread_id,
                None,
                "rollup",
                level + 1,
                members[0].from_seq,
                members[-1].upto_seq,
                result.summary,
                {**result.model_dump(), "group": group},
                tuple(m.summary_key for m in members),
                llm.model,
                prompt.version,
            )
            try:
                if store.save_summary(record, archive_episode=False):
                    made += 1
            except StaleGeneration:
                return made
    return made
