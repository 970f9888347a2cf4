"""`chatmem bench train-ranker`: trains the recall ranker shipped as
`memory/ranker_weights.json` (memory/recall.py, `TURN_FEATURES`).

The LoCoMo conversations are processed by the real pipeline (as `bench locomo` does), every
question is asked through `recall`, and each candidate turn of its pool is recorded with its
features and whether it is one of the question's evidence turns. A small network (8 tanh units
plus a linear path) learns a score per turn with a listwise loss: the softmax over a question's
pool should put its mass on the evidence. Five such networks, seeds 0-4, make a bag whose mean
logit ranks: held out, one network's figure moved by up to 0.007 with its seed, and the bag
scored with the best of them. Full-batch Adam: a retrain on the same data writes the same bytes.

Leave-one-conversation-out cross-validation is printed next to the hand-tuned rule, on the same
pools (ranked without the sitting cap), so what the model adds is measured on conversations it
did not see. Held-out judgement uses other conversations."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from chatmem.bench.locomo import QUESTION_CATEGORIES, processed
from chatmem.bench.stats import LEVEL, bootstrap, paired
from chatmem.bootstrap import Container
from chatmem.memory.dates import Period
from chatmem.memory.mlp import Bag, Mlp
from chatmem.memory.ports import Embedder
from chatmem.memory.recall import (
    RANKER_FILE,
    TURN_FEATURES,
    Recall,
    TermStats,
    TurnCandidate,
    linear_scores,
    sittings,
    turn_features,
)
from chatmem.schemas.read import Scope
from chatmem.schemas.settings import Settings

SEED = 0
BAG = 5  # networks in the bag, seeds SEED .. SEED + BAG - 1
HIDDEN = 8
EPOCHS = 600
L2 = 1e-2
LEARNING_RATE = 0.05
K = 10  # the cut the cross-validation reports


@dataclass(frozen=True)
class Pool:
    """One question's candidate turns as recall saw them."""

    sample: str
    category: int
    features: np.ndarray  # (turns, TURN_FEATURES)
    relevant: np.ndarray  # (turns,) bool: an evidence turn
    linear: np.ndarray  # (turns,) the hand-tuned rule's scores
    evidence: int  # evidence turns of the question (some may be missing from the pool)


class _Recorder(Recall):
    """Recall that keeps the last pool it ranked."""

    last: tuple[list[TurnCandidate], np.ndarray, np.ndarray] | None = None

    def _rank_turns(
        self,
        turns: list[TurnCandidate],
        stats: TermStats,
        boost: dict[str, float],
        period: Period | None,
        limit: int,
    ) -> list[tuple[TurnCandidate, float]]:
        if turns:
            groups = sittings(turns, self.params.sitting_gap_s)
            feats = turn_features(turns, stats, self.params, boost, period, groups)
            self.last = (turns, feats, linear_scores(turns, stats, self.params, groups, boost, period))
        return super()._rank_turns(turns, stats, boost, period, limit)


def collect(c: Container, corpus: Sequence[dict], embedder: Embedder) -> list[Pool]:
    """Every scored question's pool (categories 1-4 with evidence, as `bench locomo` scores),
    every search made with `embedder`'s query vector, mem0's too (the model's, or an encoder)."""
    r = c.recall
    recorder = _Recorder(r.store, embedder, r.facts, r.params, ranker=None)
    with c.mem0.searching_with(embedder) if r.facts is not None else nullcontext():
        return _pools(recorder, corpus)


def _pools(recorder: _Recorder, corpus: Sequence[dict]) -> list[Pool]:
    pools: list[Pool] = []
    for sample in corpus:
        sid = sample["sample_id"]
        turn_ids = {t["dia_id"] for v in sample["conversation"].values() if isinstance(v, list) for t in v}
        reader = sample["conversation"]["speaker_a"]
        for qa in sample["qa"]:
            evidence = {e for e in qa.get("evidence", []) if e in turn_ids}
            if qa.get("category") not in QUESTION_CATEGORIES or not evidence:
                continue
            recorder.last = None
            recorder(reader, qa["question"], scope=Scope.ALL, limit=25, thread_id=sid)
            if recorder.last is None:
                continue
            turns, feats, linear = recorder.last
            relevant = np.array([t.platform_message_id in evidence for t in turns])
            pools.append(Pool(sid, int(qa["category"]), feats, relevant, linear, len(evidence)))
    return pools


def fit_ranker(pools: Sequence[Pool], seed: int = SEED, epochs: int = EPOCHS) -> Mlp:
    """Full-batch Adam on the listwise softmax loss (target: the evidence turns, equally), with L2;
    deterministic for a seed. Pools without evidence in them teach nothing and are left out."""
    used = [p for p in pools if p.relevant.any()]
    if not used:
        raise ValueError("no question has an evidence turn among its candidates")
    x = np.concatenate([p.features for p in used])
    target = np.concatenate([p.relevant / p.relevant.sum() for p in used])
    starts = np.cumsum([0] + [len(p.relevant) for p in used[:-1]])
    sizes = np.array([len(p.relevant) for p in used])
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    z = (x - mean) / scale
    rng = np.random.default_rng(seed)
    k = z.shape[1]
    params = [
        rng.normal(0.0, 1.0 / np.sqrt(k), (k, HIDDEN)),
        np.zeros(HIDDEN),
        rng.normal(0.0, 1.0 / np.sqrt(HIDDEN), HIDDEN),
        np.zeros(k),  # the linear path
    ]
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    n = len(used)
    for t in range(1, epochs + 1):
        hidden = np.tanh(z @ params[0] + params[1])
        s = hidden @ params[2] + z @ params[3]
        s = s - np.repeat(np.maximum.reduceat(s, starts), sizes)
        e = np.exp(s)
        g = (e / np.repeat(np.add.reduceat(e, starts), sizes) - target) / n  # d loss / d score
        d_hidden = np.outer(g, params[2]) * (1.0 - hidden**2)
        grads = [
            z.T @ d_hidden + L2 * params[0],
            d_hidden.sum(axis=0),
            hidden.T @ g + L2 * params[2],
            z.T @ g + L2 * params[3],
        ]
        for i, grad in enumerate(grads):
            m1[i] = 0.9 * m1[i] + 0.1 * grad
            m2[i] = 0.999 * m2[i] + 0.001 * grad**2
            params[i] = params[i] - LEARNING_RATE * (m1[i] / (1 - 0.9**t)) / (np.sqrt(m2[i] / (1 - 0.999**t)) + 1e-8)
    return Mlp(mean, scale, params[0], params[1], params[2], 0.0, params[3])


def fit_bag(pools: Sequence[Pool], seed: int = SEED, epochs: int = EPOCHS, bag: int = BAG) -> Bag:
    """`bag` networks fitted alike from seeds `seed` .. `seed + bag - 1`."""
    return Bag(tuple(fit_ranker(pools, seed + k, epochs) for k in range(bag)))


def recall_at(pool: Pool, scores: np.ndarray, k: int = K) -> float:
    top = np.argsort(-scores, kind="stable")[:k]
    return float(pool.relevant[top].sum()) / pool.evidence


def cross_validate(
    pools: Sequence[Pool], seed: int = SEED, epochs: int = EPOCHS, bag: int = BAG
) -> dict[str, dict[str, float]]:
    """Recall@K over all questions, per category and per conversation, the hand-tuned rule against a
    bag trained without the question's conversation (leave one conversation out; NaN when there
    is no other conversation to train on)."""
    learned: dict[int, float] = {}
    for held in sorted({p.sample for p in pools}):
        rest = [p for p in pools if p.sample != held]
        model = fit_bag(rest, seed, epochs, bag) if any(p.relevant.any() for p in rest) else None
        for i, p in enumerate(pools):
            if p.sample == held:
                learned[i] = recall_at(p, model.logit(p.features)) if model is not None else math.nan
    out: dict[str, dict[str, float]] = {}
    # Per held-out conversation too: the intervals resample questions, and how far one
    # conversation's figure lies from another's is the spread a new conversation can bring.
    groups = (
        {"all": list(range(len(pools)))}
        | {name: [i for i, p in enumerate(pools) if p.category == cat] for cat, name in QUESTION_CATEGORIES.items()}
        | {
            f"conversation {s}": [i for i, p in enumerate(pools) if p.sample == s]
            for s in sorted({p.sample for p in pools})
        }
    )
    for name, idx in groups.items():
        if idx:
            linear = [recall_at(pools[i], pools[i].linear) for i in idx]
            out[name] = {
                "questions": len(idx),
                "linear": float(np.mean(linear)),
                "learned": float(np.mean([learned[i] for i in idx])),
            }
            if not math.isnan(out[name]["learned"]):
                # How sure the figure is, and the lead over the rule on the same questions.
                ci = bootstrap([learned[i] for i in idx])
                lead = paired([learned[i] for i in idx], linear)
                out[name] |= {
                    "learned_low": ci.low,
                    "learned_high": ci.high,
                    "lead_low": lead.low,
                    "lead_high": lead.high,
                }
    return out


def _shown(fig: dict[str, float]) -> str:
    if math.isnan(fig["learned"]):
        return "– (one conversation)"
    return f"{fig['learned']:.3f} ({fig['learned_low']:.3f}–{fig['learned_high']:.3f})"


def weights_json(model: Bag, trained: dict[str, Any]) -> str:
    return json.dumps({"features": list(TURN_FEATURES), "mlps": model.to_json(), "trained": trained}, indent=None)


def encoder_pools(c: Container, corpus: Sequence[dict], query_out: Path, console: Console) -> list[Pool]:
    """Trains the query encoder (bench/train_query.py) and writes it to `query_out`; returns the
    pools the ranker learns from. Each conversation's pools are searched with an encoder trained
    without it (leave one out), so the ranker learns how far a held-out query's vector can be
    trusted; with one conversation only, with the final encoder (in-sample)."""
    from chatmem.adapters.embedders import TOKENIZER_FILE, OnnxMiniLMEmbedder, QueryEmbedder
    from chatmem.bench import train_query

    items = train_query.questions(c, corpus, train_query.CATEGORIES)
    console.print(f"query encoder: {len(items)} questions, {train_query.EPOCHS} epochs, seed {train_query.SEED}")

    def encoder(path: Path) -> Embedder:
        return QueryEmbedder(OnnxMiniLMEmbedder(model_file=path, tokenizer_file=TOKENIZER_FILE))

    samples = [s["sample_id"] for s in corpus]
    pools: list[Pool] = []
    with tempfile.TemporaryDirectory() as tmp:
        if len(samples) > 1:
            for held in samples:
                path = Path(tmp) / f"without-{held}.onnx"
                train_query.export(train_query.fine_tune([q for q in items if q.sample != held]), path)
                pools += collect(c, [s for s in corpus if s["sample_id"] == held], encoder(path))
                console.print(f"  encoder without {held}: pools collected")
    # The shipped encoder runs in int8. The ranker still learns from the fp16-stored encoders'
    # pools: held out, that lost 0.0004 of recall@10 against 0.0035 when refitted on int8 pools
    # (docs/benchmarks.md, "The query encoder in int8").
    train_query.export(train_query.fine_tune(items), query_out, int8=True)
    console.print(f"wrote {query_out} ({query_out.stat().st_size / 1e6:.1f} MB)")
    return pools if pools else collect(c, corpus, encoder(query_out))


def run(
    settings: Settings,
    console: Console,
    data: Path,
    out: Path,
    keep: Path | None = None,
    samples: set[str] | None = None,
    epochs: int = EPOCHS,
    query_out: Path | None = None,
) -> dict[str, dict[str, float]]:
    """Trains the ranker and, with `query_out`, the query encoder first (then the ranker learns
    from the turns the encoder's queries find; the table compares both)."""
    with processed(settings, data, samples, keep) as (c, corpus, done):
        console.print(done)
        pools = collect(c, corpus, c.query_embedder)  # the model's query vector
        encoded = encoder_pools(c, corpus, query_out, console) if query_out is not None else None
    cv = cross_validate(pools, SEED, epochs)
    cv_encoded = cross_validate(encoded, SEED, epochs) if encoded is not None else None
    table = Table(
        title=f"recall ranker · {data.name} · leave one conversation out · recall@{K} of the candidate pool, "
        f"no sitting cap · {datetime.now(UTC):%Y-%m-%d}"
    )
    columns = ["category", "questions", "hand-tuned rule", "learned", *(["learned + query encoder"] if encoded else [])]
    for col in columns:
        table.add_column(col)
    for name, fig in cv.items():
        row = [name, str(fig["questions"]), f"{fig['linear']:.3f}", _shown(fig)]
        table.add_row(*row, *([_shown(cv_encoded[name])] if cv_encoded else []))
    console.print(table)
    final = (cv_encoded or cv)["all"]
    if "lead_low" in final:
        console.print(
            f"all questions: the shipped way {final['learned']:.3f} against the hand-tuned rule's "
            f"{final['linear']:.3f} on the same pools, a lead of {final['learned'] - final['linear']:+.3f} "
            f"({LEVEL:.0%} CI {final['lead_low']:+.3f} to {final['lead_high']:+.3f}, paired); intervals resample "
            "questions, and those of one conversation are not independent, so the spread across conversations is wider"
        )
    final_pools, final_cv = (encoded, cv_encoded) if encoded is not None and cv_encoded is not None else (pools, cv)
    model = fit_bag(final_pools, SEED, epochs)
    trained = {
        "data": data.name,
        "conversations": len({p.sample for p in final_pools}),
        "questions": len(final_pools),
        "seeds": [SEED + k for k in range(BAG)],
        "hidden": HIDDEN,
        "epochs": epochs,
        "query_encoder": encoded is not None,
        "cross_validated_recall_at_10": {
            name: None if math.isnan(fig["learned"]) else round(fig["learned"], 4) for name, fig in final_cv.items()
        },
    }
    out.write_text(weights_json(model, trained) + "\n", encoding="utf-8")
    console.print(f"wrote {out}")
    return final_cv


def default_out() -> Path:
    return Path(str(resources.files("chatmem.memory").joinpath(RANKER_FILE)))
