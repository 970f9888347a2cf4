"""`chatmem bench recall-latency`: recall's latency at LoCoMo scale, interleaved in one process on
one database so the ratios hold on a machine whose speed moves: the query embedded by the model
for every search (the encoder off), and by the query encoder with the searches one after another
on the read's connection or with the turn search started beside the summary and fact searches
(shipped), and the shipped way again with the heap frozen as chatmem's servers freeze it at start
(`ready_to_serve`), where a full garbage collection has little to walk. Every pass empties the
query caches first, so each recall embeds its query."""

from __future__ import annotations

import dataclasses
import gc
import time
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chatmem.bench.host import machine
from chatmem.bench.locomo import QUESTION_CATEGORIES, processed
from chatmem.memory.ports import Embedder, concrete
from chatmem.memory.recall import Recall
from chatmem.schemas.read import Scope
from chatmem.schemas.settings import Settings
from chatmem.serving import ready_to_serve


def _clear_query_caches(*embedders: Any) -> None:
    for e in embedders:
        current = e.current() if hasattr(e, "current") else e
        if hasattr(current, "cache_clear"):
            current.cache_clear()


def run(
    settings: Settings, console: Console, data: Path, keep: Path | None = None, rounds: int = 3
) -> dict[str, tuple[float, float]]:
    with processed(settings, data, None, keep) as (c, corpus, done):
        console.print(done)
        t0 = time.perf_counter()
        c.warm_up()  # what a server does before its first request, which would otherwise wait for it
        console.print(f"Container.warm_up, the first read in this process: {(time.perf_counter() - t0) * 1e3:,.0f} ms")
        shipped = c.recall
        model = c.query_embedder
        if concrete(shipped.embedder) is concrete(model):
            raise SystemExit("the query encoder is off (CHATMEM_RECALL_QUERY_ENCODER=false): nothing to compare")
        # Each way with the embedder its fact search uses too (mem0 embeds the query itself).
        variants: dict[str, tuple[Recall, Embedder]] = {
            "the model's (encoder off)": (dataclasses.replace(shipped, embedder=model), model),
            "the encoder's; searches one after another": (
                dataclasses.replace(shipped, store=c.recall_reader.serial()),
                shipped.embedder,
            ),
            "the encoder's; turn search beside the others (shipped)": (shipped, shipped.embedder),
            "shipped, heap frozen after warm-up (chatmem api, MCP over HTTP)": (shipped, shipped.embedder),
        }
        frozen = {name for name in variants if "frozen" in name}
        questions = [
            (s["sample_id"], s["conversation"]["speaker_a"], qa["question"])
            for s in corpus
            for qa in s["qa"]
            if qa.get("category") in QUESTION_CATEGORIES
        ]

        def searching(embedder: Embedder) -> AbstractContextManager[None]:
            return c.mem0.searching_with(embedder) if shipped.facts is not None else nullcontext()

        for recall, embedder in variants.values():
            with searching(embedder):
                recall(questions[0][1], "warm up", thread_id=questions[0][0])
        latencies: dict[str, list[float]] = {name: [] for name in variants}
        # Full collections during each way's recalls (not the one ready_to_serve makes before them).
        full: dict[str, list[float]] = {name: [] for name in variants}
        now: dict[str, Any] = {"way": None, "started": 0.0}

        def timed_collection(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                now["started"] = time.perf_counter()
            elif info["generation"] == 2 and now["way"] is not None:
                full[now["way"]].append(time.perf_counter() - now["started"])

        gc.callbacks.append(timed_collection)
        try:
            for _ in range(rounds):
                for name, (recall, embedder) in variants.items():
                    _clear_query_caches(model, shipped.embedder)
                    if name in frozen:
                        ready_to_serve(c)
                    now["way"] = name
                    with searching(embedder):
                        for sid, who, question in questions:
                            t0 = time.perf_counter()
                            recall(who, question, scope=Scope.ALL, limit=25, thread_id=sid)
                            latencies[name].append(time.perf_counter() - t0)
                    now["way"] = None
                    gc.unfreeze()  # the next way runs with the collector as a bot's process has it
        finally:
            gc.callbacks.remove(timed_collection)
    table = Table(
        title=f"chatmem bench recall-latency · {data.name} · {len(questions)} questions × {rounds} rounds · "
        f"{machine()} · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("query vector", "recall p50", "p95", "slowest", "p50 vs encoder off", "full collections"):
        table.add_column(col)
    out: dict[str, tuple[float, float]] = {}
    for name, xs in latencies.items():
        xs.sort()
        out[name] = (xs[len(xs) // 2] * 1e3, xs[int(len(xs) * 0.95)] * 1e3)
    base = next(iter(out.values()))
    for name, (p50, p95) in out.items():
        ts = full[name]
        table.add_row(
            name,
            f"{p50:.1f} ms",
            f"{p95:.1f} ms",
            f"{latencies[name][-1] * 1e3:.1f} ms",
            f"{p50 / base[0]:.2f}×",
            f"{len(ts)}, longest {max(ts) * 1e3:.1f} ms" if ts else "0",
        )
    console.print(table)
    return out
