"""The pair model's input and output: all-MiniLM-L6-v2 fine-tuned as a classifier that reads the
turns before a candidate and the candidate together (bench/train_pair.py trains it; the ONNX file
runs in adapters/boundary_pair.py). Pure: token ids in, token ids out, so the trainer and the
runtime build exactly the same input.

The input is `[CLS] context [SEP] candidate [SEP]`, the context being up to `CONTEXT_TURNS` turns
before the candidate joined by spaces. What is cut to `MAX_TOKENS` is the context's oldest words:
the turn just before the candidate tells most about whether it continues."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONTEXT_TURNS = 3
TEXT_CHARS = 1000  # of each turn: what the segmenter's state keeps (memory/segmentation.py)
MAX_TOKENS = 160
MAX_CANDIDATE_TOKENS = 64  # a long candidate leaves the context at least MAX_TOKENS - 64 - 3 tokens
CLS_ID, SEP_ID = 101, 102  # all-MiniLM-L6-v2's vocabulary (BERT uncased)


def context_text(before: Sequence[str]) -> str:
    """The turns before the candidate as the model reads them: the last CONTEXT_TURNS, oldest first."""
    return " ".join(t[:TEXT_CHARS].strip() for t in before[-CONTEXT_TURNS:] if t and t.strip())


def candidate_text(text: str) -> str:
    return text[:TEXT_CHARS].strip()


def pair_ids(context: Sequence[int], candidate: Sequence[int]) -> tuple[list[int], list[int]]:
    """Token ids and token types of the pair, from the two texts' word-piece ids (no special
    tokens): the candidate's start kept up to MAX_CANDIDATE_TOKENS, the context's end up to what is
    left."""
    cand = list(candidate[:MAX_CANDIDATE_TOKENS])
    room = MAX_TOKENS - 3 - len(cand)
    ctx = list(context[-room:]) if room > 0 else []
    ids = [CLS_ID, *ctx, SEP_ID, *cand, SEP_ID]
    types = [0] * (len(ctx) + 2) + [1] * (len(cand) + 1)
    return ids, types


def stacked_logit(weights: Sequence[float], bag_probability: float, pair_logit: float, closed: bool) -> float:
    """The stacker's logit of a topic shift: a logistic model over the bag's logit, the pair
    model's, both again on a closed window, that flag and a constant (the window's stage changes
    what the bag knows, not what the pair model reads)."""
    p = min(max(bag_probability, 1e-6), 1 - 1e-6)
    bag = math.log(p / (1 - p))
    c = float(closed)
    x = (bag, pair_logit, c * bag, c * pair_logit, c, 1.0)
    return float(sum(w * v for w, v in zip(weights, x, strict=True)))


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True)
class PairStack:
    """What `chatmem bench train-segmenter` learned about the pair model: its head, the stacker
    over it and the bag, and the peers' bar for the stacked probability (chosen by cross-validated
    TIAGE Score, as the bag's own peers' bar is)."""

    head: np.ndarray  # (hidden,) float64
    bias: float
    stack: tuple[float, ...]  # six weights, as `stacked_logit` reads them
    threshold: float
    early_margin: float
    fresh_margin: float
    model_sha256: str  # the ONNX file it was trained with

    def logit(self, pooled: np.ndarray) -> float:
        return float(np.asarray(pooled, dtype=np.float64) @ self.head + self.bias)

    def probability(self, bag_probability: float, pair_logit: float, closed: bool) -> float:
        return sigmoid(stacked_logit(self.stack, bag_probability, pair_logit, closed))

    def to_json(self) -> dict[str, Any]:
        return {
            "head": [round(float(w), 7) for w in self.head],
            "bias": self.bias,
            "stack": list(self.stack),
            "threshold": self.threshold,
            "early_margin": self.early_margin,
            "fresh_margin": self.fresh_margin,
            "model_sha256": self.model_sha256,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairStack:
        return cls(
            np.asarray(data["head"], dtype=np.float64),
            float(data["bias"]),
            tuple(float(w) for w in data["stack"]),
            float(data["threshold"]),
            float(data["early_margin"]),
            float(data["fresh_margin"]),
            str(data["model_sha256"]),
        )
