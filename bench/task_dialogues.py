"""Real task-oriented dialogues for the segmenter: single-service conversations of the
Schema-Guided Dialogue dataset (SGD; Rastogi et al., AAAI 2020; CC BY-SA 4.0), one task each,
from a user's request to the assistant's goodbye, as crowd workers wrote them.

Two files ship next to this module (docs/benchmarks.md, "Real task dialogues"): `sgd_train.jsonl`
(from SGD's train split), whose concatenations `make train-segmenter` learns from, and
`sgd_check.jsonl` (from its dev and test splits, other dialogues), whose concatenations it writes
as a check set (`sgd_tasks.jsonl`), never trained on. Each line keeps a dialogue's id, its service
and its turns' speakers and words; the annotations are dropped. A task-oriented segmentation set
is built this way: whole conversations of different domains one after another, each one segment."""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

from chatmem.bench.incar_dialogues import concatenated
from chatmem.bench.topicseg import Dialogue

TRAIN_FILE = "sgd_train.jsonl"
CHECK_FILE = "sgd_check.jsonl"
SEED = 13
ROLES = {"USER": "user", "SYSTEM": "assistant"}


def packaged(name: str) -> Path:
    return Path(str(resources.files("chatmem.bench").joinpath(name)))


def load(path: Path) -> list[tuple[str, Dialogue]]:
    """(domain, dialogue) per single-service dialogue of an SGD-format JSON-lines file: each
    dialogue is one segment. The domain is the service without its number ("Restaurants_2":
    Restaurants)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        services = row["services"]
        turns = [(ROLES[t["speaker"]], " ".join(t["utterance"].split())) for t in row["turns"]]
        if len(services) != 1 or len(turns) < 2:
            continue
        roles, texts = [r for r, _ in turns], [t for _, t in turns]
        out.append((services[0].split("_")[0], Dialogue(f"sgd-{row['dialogue_id']}", roles, texts, [0] * len(texts))))
    return out


def check_set(path: Path, seed: int = SEED) -> list[Dialogue]:
    """Every dialogue of the file used once: concatenations of 2-5, each next one of another domain."""
    rng = random.Random(seed)
    pool = load(path)
    rng.shuffle(pool)
    out: list[Dialogue] = []
    while len(pool) >= 2:
        chosen = [pool.pop()]
        for _ in range(rng.randint(2, 5) - 1):
            other = next((i for i in range(len(pool) - 1, -1, -1) if pool[i][0] != chosen[-1][0]), None)
            if other is None:
                break
            chosen.append(pool.pop(other))
        if len(chosen) < 2:
            break
        tasks = [list(zip(d.roles, d.texts, strict=True)) for _, d in chosen]
        out.append(concatenated(f"sgd-{len(out)}", tasks))
    return out
