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
from bisect import bisect_left
from collections import Counter
from collections.abc import Collection, Sequence
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
    def job_state(self, thread_id: str, generation: int, summary_key: str) -> tuple[bool, bool]:
        """(the summary is saved already, the generation is still the thread's current one),
        read together: a rebuild asks once per episode."""
        ...

    def episode_lines(
        self, thread_id: str, generation: int, episode_id: str, from_seq: int, upto_seq: int
    ) -> list[prompts.Line]: ...

    def save_summary(self, record: SummaryRecord, *, archive_episode: bool) -> bool:
        """Insert unless present (False then); with archive_episode, also archive the episode's
        running and chunk summaries and its messages, and set its topic label. Raises
        StaleGeneration when the generation is no longer active."""
        ...

    def level_indexes(self, thread_id: str, generation: int) -> dict[int, set[int]]:
        """Per level, the indexes of the thread's summaries there (active or archived): episode
        ordinal - 1 of the finals at level 1, the group of the roll-ups above."""
        ...

    def level_items(self, thread_id: str, generation: int, level: int, indexes: Sequence[int]) -> list[LevelItem]:
        """The summaries at `level` with these indexes, by index."""
        ...


class StaleGeneration(Exception):
    """The thread was rebuilt meanwhile; this result belongs to an abandoned generation."""


def job_key(job: Job) -> str:
    if job.kind == "final":
        return f"{job.episode_id}:final"
    return f"{job.episode_id}:{job.kind}:{job.upto_seq}"


def run_job(store: SummaryStore, llm: LLM, job: Job, thread_id: str, generation: int, *, fanin: int, keep: int) -> str:
    key = job_key(job)
    saved, current = store.job_state(thread_id, generation, key)
    if saved:
        return "duplicate"
    if not current:
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


def due_groups(indexes: Collection[int], rolled: Collection[int], *, fanin: int, keep: int) -> list[int]:
    """The groups of one level due for a roll-up, in order: complete (`fanin` items), not rolled
    up yet, and followed by at least `keep` newer items (the newest stay as they are). Sorted
    indexes and a bisection, since a long thread has thousands of items and every final asks."""
    ordered = sorted(indexes)
    due = []
    for group, n in sorted(Counter(i // fanin for i in ordered).items()):
        if n < fanin or group in rolled:
            continue
        if len(ordered) - bisect_left(ordered, (group + 1) * fanin) >= keep:
            due.append(group)
    return due


def rollup(store: SummaryStore, llm: LLM, thread_id: str, generation: int, *, fanin: int, keep: int) -> int:
    made = 0
    # One query for every level's indexes; the texts only of the groups due.
    levels = store.level_indexes(thread_id, generation)
    for level in range(1, MAX_LEVEL):
        indexes = levels.get(level)
        if not indexes:
            break
        above = levels.setdefault(level + 1, set())
        for group in due_groups(indexes, above, fanin=fanin, keep=keep):
            members = store.level_items(thread_id, generation, level, range(group * fanin, (group + 1) * fanin))
            prompt = prompts.rollup_summary([m.text for m in members])
            result = llm.complete(prompt, prompts.RollupSummary)
            record = SummaryRecord(
                f"{thread_id}:L{level + 1}:g{group}",
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
            above.add(group)  # saved now or by a concurrent job: an item of the next level either way
    return made
