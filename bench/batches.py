"""`chatmem bench batches`: what a text costs the ONNX embedder by batch size and thread count,
on real dialogue turns. It decides whether gathering the messages of several threads into one
model call (a bigger batch) would make the segment worker cheaper per message."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from chatmem.adapters.embedders import OnnxMiniLMEmbedder
from chatmem.bench.host import machine
from chatmem.bench.pipeline import real_dialogues
from chatmem.memory.episodes import embed_text

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 480)


def run(console: Console, dialogues: Path, *, texts: int = 480, threads: tuple[int, ...] = (1, 2)) -> dict:
    sample = [embed_text(e.model_dump(mode="json"), e.occurred_at) for e in real_dialogues(dialogues, texts)]
    me = psutil.Process()
    figures: dict[tuple[int, int], tuple[float, float]] = {}
    for n in threads:
        embedder = OnnxMiniLMEmbedder(threads=n)
        embedder.embed(sample[:32])  # load the model before timing
        for bs in BATCHES:
            cpu0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
            for i in range(0, len(sample), bs):
                embedder.embed(sample[i : i + bs])
            wall, cpu = time.perf_counter() - t0, sum(me.cpu_times()[:2]) - cpu0
            figures[(n, bs)] = (len(sample) / wall, 1000 * cpu / len(sample))
    table = Table(title=f"chatmem bench batches · {machine()} · {datetime.now(UTC):%Y-%m-%d}")
    table.add_column("texts per call", justify="right")
    for n in threads:
        table.add_column(f"{n} thread{'s' if n > 1 else ''}: texts/s", justify="right")
        table.add_column("CPU ms / text", justify="right")
    for bs in BATCHES:
        cells = [f"{figures[(n, bs)][i]:,.{0 if i == 0 else 2}f}" for n in threads for i in (0, 1)]
        table.add_row(str(bs), *cells)
    table.caption = f"{len(sample)} LoCoMo turns as the segment worker embeds them (author's name first)"
    console.print(table)
    return figures
