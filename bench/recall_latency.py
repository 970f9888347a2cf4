"""`chatmem bench recall-latency`: recall's latency at LoCoMo scale with the turn search's query
vector taken three ways, interleaved in one process on one database, so the ratios hold on a
machine whose speed moves: the model's vector (encoder off), the query encoder's embedded by the
turn search (in its thread when it runs ahead), and the encoder's started in the background as
recall begins, the last once with the searches one after another on the read's connection and
once with the turn search started beside the summary and fact searches (the shipped path). Every
pass empties the query caches first, so each recall embeds its query."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from chatmem.bench.locomo import QUESTION_CATEGORIES, processed
from chatmem.memory.recall import Recall
from chatmem.schemas.read import Scope
from chatmem.schemas.settings import Settings


class _Inline:
    """The encoder without its background path: embedded when the turn search asks."""

    def __init__(self, inner: Any):
        self._inner, self.model, self.dim = inner, inner.model, inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._inner.embed(texts)


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
        if shipped.turn_embedder is None:
            raise SystemExit("the query encoder is off (CHATMEM_RECALL_QUERY_ENCODER=false): nothing to compare")
        inline = _Inline(shipped.turn_embedder)
        variants: dict[str, Recall] = {
            "the model's (encoder off)": dataclasses.replace(shipped, turn_embedder=None),
            "the encoder's, embedded by the turn search": dataclasses.replace(shipped, turn_embedder=inline),
            "the encoder's, started ahead; searches one after another": dataclasses.replace(shipped, parallel=False),
            "the encoder's, started ahead; turn search beside the others (shipped)": shipped,
        }
        questions = [
            (s["sample_id"], s["conversation"]["speaker_a"], qa["question"])
            for s in corpus
            for qa in s["qa"]
            if qa.get("category") in QUESTION_CATEGORIES
        ]
        for recall in variants.values():
            recall(questions[0][1], "warm up", thread_id=questions[0][0])
        latencies: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, recall in variants.items():
                _clear_query_caches(shipped.embedder, shipped.turn_embedder)
                for sid, who, question in questions:
                    t0 = time.perf_counter()
                    recall(who, question, scope=Scope.ALL, limit=25, thread_id=sid)
                    latencies[name].append(time.perf_counter() - t0)
    table = Table(
        title=f"chatmem bench recall-latency · {data.name} · {len(questions)} questions × {rounds} rounds · "
        f"{platform.machine()} · {os.cpu_count()} cores · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("turn search's query vector", "recall p50", "p95", "p50 vs encoder off"):
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
