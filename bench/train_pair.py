"""`chatmem bench train-pair`: the segmenter's pair model among people, all-MiniLM-L6-v2 fine-tuned
as a classifier of "the topic changes at this turn", reading the turns before the candidate and
the candidate together (memory/boundary_pair.py builds the input). Every input of the bag of MLPs
is a cosine of whole-turn vectors or a cue read from words; this model reads the words of both
sides at once (docs/benchmarks.md, "A cross-encoder that reads the turns themselves").

Data: TIAGE train (people chatting; the development splits, `../shared/eval/topicseg`). Every turn
after the first is a candidate; the label is TIAGE's. All layers learn, with a linear head on the
mean of the token embeddings: AdamW, EPOCHS epochs, batch BATCH, cross-entropy weighted so the
positives weigh as much as the negatives, no dropout, fixed seed and thread count, so a retrain
on one machine writes the same files. Another CPU (another instruction set or vendor) sums the
floats in another order, and the weights differ in their last bits (docs/benchmarks.md, "Real
task dialogues").

Written:
- the model trained on all of TIAGE train, as the shipped embedder's ONNX file is made
  (bench/export_onnx.py), to `adapters/models/all-MiniLM-L6-v2.boundary-pair.onnx`;
- `pair_model.json` in the cache folder: its head, the file's sha256, and the logits of every
  candidate out of fold (by the segmenter trainer's folds: a model that never saw the dialogue).
  `chatmem bench train-segmenter` fits the stacker on those, beside the bag's own out-of-fold
  probabilities, and writes head and stacker into the segmenter's weights.

Needs the training tools: `pip install -e '.[export]'`. The workers need none of them."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatmem.adapters.boundary_pair import word_pieces
from chatmem.bench.topicseg import Dialogue, load
from chatmem.bench.train_query import THREADS, _base, _quiet, export
from chatmem.bench.train_segmenter import FOLDS, PAIR_FILE, SEED, fold_of
from chatmem.memory.boundary_pair import candidate_text, context_text, pair_ids

EPOCHS = 3
LEARNING_RATE = 3e-5
WEIGHT_DECAY = 0.01
BATCH = 16
PREDICT_BATCH = 64


@dataclass(frozen=True)
class Candidate:
    dialogue: str
    seq: int
    ids: list[int]
    types: list[int]
    label: float


def candidates(dialogues: Sequence[Dialogue], encode: Callable[[str], list[int]]) -> list[Candidate]:
    """Every user turn with text after the first, with the turns before it (any speaker)."""
    out: list[Candidate] = []
    for d in dialogues:
        for seq in range(1, len(d.texts)):
            if d.roles[seq] != "user" or not d.texts[seq].strip():
                continue
            ids, types = pair_ids(encode(context_text(d.texts[:seq])), encode(candidate_text(d.texts[seq])))
            out.append(Candidate(d.id, seq, ids, types, float(d.ends_segment[seq - 1])))
    return out


class PairModel:
    """BERT, the mean of its token embeddings over the mask, and a linear head."""

    def __init__(self) -> None:
        import torch

        self.bert, _ = _base()
        self.head = torch.nn.Linear(self.bert.config.hidden_size, 1)

    def parameters(self) -> list[Any]:
        return [*self.bert.parameters(), *self.head.parameters()]

    def logits(self, batch: Sequence[Candidate]) -> Any:
        import torch

        width = max(len(c.ids) for c in batch)
        ids = torch.tensor([c.ids + [0] * (width - len(c.ids)) for c in batch], dtype=torch.int64)
        types = torch.tensor([c.types + [0] * (width - len(c.types)) for c in batch], dtype=torch.int64)
        mask = (torch.arange(width)[None, :] < torch.tensor([len(c.ids) for c in batch])[:, None]).to(torch.int64)
        hidden = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return self.head(pooled).squeeze(-1)


def fit(items: Sequence[Candidate], seed: int = SEED, epochs: int = EPOCHS) -> PairModel:
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    model = PairModel()
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    positives = sum(c.label for c in items)
    pos_weight = torch.tensor((len(items) - positives) / max(positives, 1.0))
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    order = list(range(len(items)))
    rng = random.Random(seed)
    for _ in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), BATCH):
            batch = [items[i] for i in order[start : start + BATCH]]
            loss = loss_fn(model.logits(batch), torch.tensor([c.label for c in batch]))
            loss.backward()
            optimiser.step()
            optimiser.zero_grad()
    return model


def predict(model: PairModel, items: Sequence[Candidate]) -> np.ndarray:
    import torch

    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(items), PREDICT_BATCH):
            out += model.logits(items[start : start + PREDICT_BATCH]).tolist()
    return np.asarray(out)


def auc(y: np.ndarray, s: np.ndarray) -> float:
    """Area under the ROC curve (ties count half)."""
    pos, neg = s[y > 0.5], s[y <= 0.5]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def model_path() -> Path:
    from chatmem.adapters.embedders import PAIR_ONNX_FILE

    return PAIR_ONNX_FILE


def run(
    data_dir: Path,
    cache_dir: Path,
    say: Callable[[str], None],
    out: Path | None = None,
    seed: int = SEED,
    epochs: int = EPOCHS,
    limit: int | None = None,
) -> dict[str, Any]:
    """Out-of-fold logits, then the model on everything; `limit` dialogues (a quick check)."""
    dialogues = load(data_dir / "anno_train.json")[:limit]
    items = candidates(dialogues, word_pieces)
    folds = np.array([fold_of(c.dialogue) for c in items])
    y = np.array([c.label for c in items])
    say(f"pair model: {len(items)} candidates of {len(dialogues)} TIAGE dialogues, {int(y.sum())} shifts")
    oof = np.zeros(len(items))
    with _quiet():
        for fold in range(FOLDS):
            held = folds == fold
            if not held.any() or held.all():
                continue
            model = fit([c for c, h in zip(items, held, strict=True) if not h], seed, epochs)
            oof[held] = predict(model, [c for c, h in zip(items, held, strict=True) if h])
            say(f"  fold {fold}: {int(held.sum())} candidates, AUC {auc(y[held], oof[held]):.3f}")
        model = fit(items, seed, epochs)
    say(f"  out of fold: AUC {auc(y, oof):.3f}")
    out = out or model_path()
    export(model.bert, out)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    logits: dict[str, dict[str, float]] = {}
    for c, z in zip(items, oof, strict=True):
        logits.setdefault(c.dialogue, {})[str(c.seq)] = round(float(z), 5)
    result = {
        "model_sha256": digest,
        "head": [round(float(w), 7) for w in model.head.weight.detach().numpy().ravel()],
        "bias": float(model.head.bias.detach().numpy()[0]),
        "oof": logits,
        "trained": {"seed": seed, "epochs": epochs, "dialogues": len(dialogues), "candidates": len(items),
                    "oof_auc": round(auc(y, oof), 4)},
    }  # fmt: skip
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / PAIR_FILE).write_text(json.dumps(result) + "\n", encoding="utf-8")
    say(f"wrote {out} ({out.stat().st_size:,} bytes) and {cache_dir / PAIR_FILE}")
    return result
