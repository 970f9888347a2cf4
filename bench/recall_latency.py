"""`chatmem bench recall-latency`: recall's latency at LoCoMo scale, interleaved in one process on
one database so the ratios hold on a machine whose speed moves: the query embedded by the model
for every search (the encoder off), and by the query encoder with the searches one after another
on the read's connection or with the turn search started beside the summary and fact searches
(shipped). Every pass empties the query caches first, so each recall embeds its query."""

from __future__ import annotations

import dataclasses
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
        }
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
        for _ in range(rounds):
            for name, (recall, embedder) in variants.items():
                _clear_query_caches(model, shipped.embedder)
                with searching(embedder):
                    for sid, who, question in questions:
                        t0 = time.perf_counter()
                        recall(who, question, scope=Scope.ALL, limit=25, thread_id=sid)
                        latencies[name].append(time.perf_counter() - t0)
    table = Table(
        title=f"chatmem bench recall-latency · {data.name} · {len(questions)} questions × {rounds} rounds · "
        f"{machine()} · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("query vector", "recall p50", "p95", "p50 vs encoder off"):
        table.add_column(col)
    out: dict[str, tuple[float, float]] = {}
    for name, xs in latencies.items():
        xs.sort()
        out[name] = (xs[len(xs) // 2] * 1e3, xs[int(len(xs) * 0.95)] * 1e3)
    base = next(iter(out.values()))
    for name, (p50, p95) in out.items():
        table.add_row(name, f"{p50:.1f} ms", f"{p95:.1f} ms", f"{p50 / base[0]:.2f}×")
    console.print(table)
    return out
