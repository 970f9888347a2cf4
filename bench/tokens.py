"""`chatmem bench tokens`: the token estimate next to tiktoken on dialogue text, per message and
per 40-message block (what a context holds). Needs the encodings on this machine (point
TIKTOKEN_CACHE_DIR at them); prints which ones are missing otherwise. Printed, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from chatmem.memory.tokens import EstimateCounter, _cached_locally

BLOCK = 40


def texts_from(path: Path) -> list[str]:
    """Turn texts from a LoCoMo .json, a Def-DTS .jsonl or a chatmem events .jsonl file."""
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return [t["text"] for s in data for k, v in s["conversation"].items() if isinstance(v, list) for t in v]
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "dialogue" in row:
            out += [u.split(":", 1)[-1] for u in row["dialogue"].split("[NEWLINE]") if "[BOUNDARY]" not in u]
        elif row.get("text"):
            out.append(row["text"])
    return out


def run(console: Console, paths: list[Path]) -> None:
    import tiktoken

    est = EstimateCounter()
    texts = [t for p in paths for t in texts_from(p)]
    table = Table(title=f"token estimate / tiktoken · {len(texts):,} messages from {', '.join(p.name for p in paths)}")
    for col in ("encoding", "per message min", "p1", "median", "max", f"per {BLOCK} messages min", "mean", "max"):
        table.add_column(col)
    for name in ("o200k_base", "cl100k_base"):
        if not _cached_locally(name):
            console.print(f"{name}: not on this machine (set TIKTOKEN_CACHE_DIR to a folder holding it)")
            continue
        enc = tiktoken.get_encoding(name)
        per = np.array([est.count(t) / max(1, len(enc.encode(t))) for t in texts])
        blocks = [" ".join(texts[i : i + BLOCK]) for i in range(0, len(texts), BLOCK)]
        per_block = np.array([est.count(b) / max(1, len(enc.encode(b))) for b in blocks])
        table.add_row(
            name,
            *(f"{x:.2f}" for x in (per.min(), np.percentile(per, 1), np.median(per), per.max())),
            *(f"{x:.2f}" for x in (per_block.min(), per_block.mean(), per_block.max())),
        )
    console.print(table)
