"""A tiny network for the learned scorers (topic boundaries, recall ranking): one hidden tanh
layer over standardised inputs, plus an optional linear path straight from the inputs. Weights
ship as JSON package data; numpy is all it needs at run time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Mlp:
    mean: np.ndarray
    scale: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: float
    skip: np.ndarray | None = None  # input weights added to the output (None: no linear path)

    def logit(self, inputs: np.ndarray) -> np.ndarray:
        z = (inputs - self.mean) / self.scale
        out = np.tanh(z @ self.w1 + self.b1) @ self.w2 + self.b2
        return out if self.skip is None else out + z @ self.skip

    def probability(self, inputs: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logit(inputs)))

    def to_json(self) -> dict[str, Any]:
        r = lambda a: np.round(np.asarray(a, dtype=np.float64), 6).tolist()  # noqa: E731
        data: dict[str, Any] = {
            "mean": r(self.mean),
            "scale": r(self.scale),
            "w1": r(self.w1),
            "b1": r(self.b1),
            "w2": r(self.w2),
            "b2": round(float(self.b2), 6),
        }
        if self.skip is not None:
            data["skip"] = r(self.skip)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Mlp:
        a = lambda k: np.asarray(data[k], dtype=np.float64)  # noqa: E731
        skip = a("skip") if "skip" in data else None
        return cls(a("mean"), a("scale"), a("w1"), a("b1"), a("w2"), float(data["b2"]), skip)


@dataclass(frozen=True)
class Bag:
    """Networks trained alike from different seeds, read as one: the mean of their logits (the
    recall ranker's bag; the boundary scorer averages its networks' probabilities instead). One
    network's ranking hangs on its seed; the mean does not."""

    members: tuple[Mlp, ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a bag needs at least one network")

    def logit(self, inputs: np.ndarray) -> np.ndarray:
        return np.mean([m.logit(inputs) for m in self.members], axis=0)

    def to_json(self) -> list[dict[str, Any]]:
        return [m.to_json() for m in self.members]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> Bag:
        return cls(tuple(Mlp.from_json(m) for m in data))
