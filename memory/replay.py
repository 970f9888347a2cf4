"""Replay: rebuild a thread's projections from the event log into a new generation, then switch
to it in one transaction. The thread's lease is held throughout, so live processing of the
thread waits (its events stay in the log) and readers, who read the active generation only,
never see a half-built one. With warm caches the rebuild reproduces the same episodes and
summaries and costs no LLM calls; `refresh` asks the LLM again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from chatmem.memory.boundary_llm import AssistFactory, for_batch
from chatmem.memory.episodes import Job, SummaryPolicy, ThreadContext, plan_batch
from chatmem.memory.pipeline import embed_batch
from chatmem.memory.ports import Embedder, LeaseLost, ThreadLog, concrete
from chatmem.memory.segmentation import Scorer, SegmenterConfig, SegmenterState, thread_scorer

log = logging.getLogger(__name__)


Rows = dict[str, set[tuple]]


def diff_generations(live: Rows, rebuilt: Rows) -> dict[str, tuple[list[tuple], list[tuple]]]:
    """Per projection, the rows only live has and the rows only the rebuild has (empty when
    replay reproduced it exactly)."""
    return {
        name: (sorted(live.get(name, set()) - rebuilt.get(name, set()), key=repr),
               sorted(rebuilt.get(name, set()) - live.get(name, set()), key=repr))
        for name in sorted(set(live) | set(rebuilt))
    }  # fmt: skip


@dataclass(frozen=True)
class ReplayResult:
    thread_id: str
    generation: int
    events: int
    episodes: int
    seconds: float
    context: ThreadContext | None = None  # where the rebuild ended (to switch to it later)


@dataclass(frozen=True)
class ReplayFailed:
    """A thread whose rebuild raised an error that is not an outage: its memory is left as it
    was (the generation it had stays active), and the other threads are rebuilt."""

    thread_id: str
    error: Exception


def replay_thread(
    thread_id: str,
    *,
    threads: ThreadLog,
    projections,  # noqa: ANN001 - PostgresProjections-like: load_context, apply, next_generation, switch
    embedder: Embedder,
    run: Callable[[Job, int], None],
    seg_cfg: SegmenterConfig,
    policy: SummaryPolicy,
    owner: str,
    lease_s: int,
    batch_size: int,
    after_switch: Callable[[int], None] | None = None,
    wait_s: float = 60.0,
    on_progress: Callable[[int], None] | None = None,
    switch: bool = True,
    assist: AssistFactory | None = None,
    scorer: Scorer | None = None,
) -> ReplayResult:
    """`switch=False` builds the generation and leaves the active one in place (`replay --check`
    compares the two, then drops the scratch one). `assist` must be what live processing used
    (memory/boundary_llm.py): its cached answers then place the same boundaries; `scorer` too."""
    started = time.monotonic()
    embedder = concrete(embedder)  # one model for the whole rebuild
    lease = None
    while lease is None:
        lease = threads.acquire_lease(thread_id, owner, lease_s)
        if lease is None:
            if time.monotonic() - started > wait_s:
                raise TimeoutError(f"thread {thread_id} stayed busy for {wait_s:.0f}s")
            time.sleep(0.2)
    try:
        generation = projections.next_generation(thread_id)
        held = lease
        seg_assist = for_batch(assist, thread_id, lambda: threads.renew_lease(held), lease_s)
        seg_scorer = thread_scorer(scorer, thread_id)
        ctx = ThreadContext(thread_id, generation, True, {}, SegmenterState(), None, 0, 0)
        pos, applied = 0, 0
        while True:
            batch = [e for e in threads.pending_events(thread_id, pos, batch_size) if e.stream_pos <= lease.cursor_pos]
            if not batch:
                break
            if not ctx.memory_on:
                # As live: paused until a memory_on, which the live cursor has passed if we are here.
                ctx = replace(ctx, memory_on=True)
            plan = plan_batch(ctx, batch, embed_batch(embedder, batch), seg_cfg, policy, seg_assist, seg_scorer)
            plan.embed_model = embedder.model
            projections.apply(plan, lease=None, advance=None)
            for job in plan.jobs:  # inline and in order: the same summaries and facts as live
                run(job, generation)
            assert plan.context is not None  # plan_batch always returns the context it ends with
            ctx = plan.context
            pos = plan.consumed[-1].stream_pos
            applied += len(plan.consumed)
            threads.renew_lease(lease)
            if on_progress:
                on_progress(applied)
        if switch:
            if not projections.switch_generation(lease, ctx):
                raise LeaseLost(thread_id)
            if after_switch is not None:
                after_switch(generation)
        return ReplayResult(thread_id, generation, applied, ctx.episode_count, time.monotonic() - started, ctx)
    finally:
        threads.release_lease(thread_id, owner)
