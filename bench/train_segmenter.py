"""`chatmem bench train-segmenter`: trains the boundary scorer shipped as
`memory/segmenter_weights.json`.

Data (the development splits, `../shared/eval/topicseg`): TIAGE train, and SuperDialseg
validation split by a hash of the dialogue id into a training part (70%) and a tune part (30%)
that training never sees. TIAGE dev is not read. Synthetic dialogues are added the way
task-oriented segmentation sets are built: 2–5 pieces (one to three consecutive gold segments,
or a dialogue's first segment, i.e. one task) of different dialogues concatenated, each next
piece half the time a near neighbour of the previous one (by mean embedding) so that a change of
task within one domain is seen too. Their rows weigh half as much as natural dialogues' (full
weight made the model lean on the large jumps between pieces and miss TIAGE's subtler shifts).
A second family concatenates whole SuperDialseg conversations, each one segment as a
task-oriented set counts it, most of them ended by a closing exchange ("Thanks, that's all" ·
"Glad I could help"): it teaches that a follow-up within a conversation continues it and that a
request after a closing opens the next one. Their rows weigh a quarter (more weight traded
SuperDialseg's fine segments for fewer splits). A third joins real task dialogues, single-service
conversations of the Schema-Guided Dialogue dataset (bench/task_dialogues.py), 2-5 whole ones of a
fold one after another, each one segment: a bot's user asks follow-ups within a task ("What's the
humidity?") that SuperDialseg would count as new topics. Their rows weigh a quarter (at half,
the task proxy scored 0.012 lower), and they do not choose the bots' bar.

The features are read through the segmenter itself (`feed` with a recording scorer), so training
sees exactly what the workers compute, stage by stage of each candidate's window. The model is a
bag of small MLPs (numpy) trained alike from seeds SEED .. SEED + BAG - 1; the scorer is their
mean probability. Two pairs of threshold and early margin are chosen by 5-fold cross-validation
of the bag over the training material (folds by dialogue; synthetic dialogues are built within a
fold): the pair for people chatting (no assistant in view) maximises TIAGE's Score, then the pair
for conversations with a bot maximises the mean Score of SuperDialseg, the synthetic pieces and
the whole conversations, scored as the workers decide: with the closed-thread bar on
(memory/segmentation.py: once the user has ended a task with a thanks, a shift that follows no
closing needs P(topic continues) below 0.4 too). The Scores without the bar are printed beside.
Then a fresh margin for each, people's first: how much lower the threshold is while the episode
holds a single user turn before the candidate. Out of fold several margins score within a hair of
each other, so the smallest one within `FLAT` of the best is taken: the least change that the
cross-validation cannot tell from the best.

Written next to the cache: the tune part (`superseg_tune.jsonl`), a synthetic task-oriented
set built from it (`taskconcat_tune.jsonl`, first segments of held-apart dialogues, each next
one a near neighbour), the same with each task ended by a closing exchange as often as the
whole conversations are (`taskconcat_closed_tune.jsonl`), its whole conversations joined as the
second family joins the training part's (`conversations_tune.jsonl`), and the in-car template
check (`incar_tasks.jsonl`,
bench/incar_dialogues.py) and the booking template check (`booking_tasks.jsonl`, several things
booked in one conversation; bench/booking_dialogues.py), and the real task dialogues' check
(`sgd_tasks.jsonl`, other SGD dialogues than those trained on; bench/task_dialogues.py), all in
Def-DTS format for `chatmem bench topicseg --data`."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from chatmem.bench import booking_dialogues, incar_dialogues, task_dialogues
from chatmem.bench.topicseg import Dialogue, Scores, evaluate, load
from chatmem.memory.boundary_pair import PairStack
from chatmem.memory.boundary_scorer import (
    FEATURES,
    STAGES,
    WEIGHTS_FILE,
    Bar,
    BoundaryScorer,
    TurnInfo,
    among_people,
    bag_probability,
    closes_conversation,
    features,
    model_input,
    stage_of,
)
from chatmem.memory.mlp import Mlp
from chatmem.memory.ports import Embedder
from chatmem.memory.segmentation import SegmenterConfig, SegTurn, TaskEnds, segment

SEED = 0
BAG = 5  # networks in the bag, seeds SEED .. SEED + BAG - 1
FOLDS = 5
TUNE_SHARE = 30  # percent of SuperDialseg validation held apart
HIDDEN = 8
EPOCHS = 300
LEARNING_RATE = 0.01
L2 = 1e-3
SYNTHETIC_PER_FOLD = 300
SYNTHETIC_WEIGHT = 0.5  # per row, against 1 for natural dialogues: chosen by cross-validation (ties 0.25)
CLOSED_BAR = SegmenterConfig().closed_thread_bar
STACK_L2 = 1.0  # the stacker's six weights: a light pull towards 0
PAIR_FILE = "pair_model.json"  # written by `chatmem bench train-pair` (bench/train_pair.py) in the cache folder
THRESHOLDS = (0.55, 0.6, 0.65, 0.7, 0.75, 0.8)  # on P(topic continues)
MARGINS = (0.0, 0.1, 0.2)
FRESH_MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2)
FLAT = 0.001  # Score: out of fold, fresh margins this close are not told apart
TASK_EVAL_DIALOGUES = 300
CONVERSATIONS_PER_FOLD = 100  # concatenations of whole conversations, each one segment
CONVERSATION_WEIGHT = 0.25  # per row: as 50 at 0.5 (both measured), with more conversations seen
CLOSED_SHARE = 0.7  # of those conversations, the share that ends with a closing exchange
TASK_WEIGHT = 0.25  # per row, for concatenated real task dialogues
# Which cross-validated Scores choose each threshold and margin. People chatting: TIAGE. With an
# assistant: SuperDialseg's sub-questions and task conversations (pieces, and whole ones ended by
# a thanks) weigh alike, as the two ways such conversations are labelled.
PEER_KINDS = ("tiage",)
# The bots' bar is chosen on these; real task dialogues ("tasks") teach the networks but do not
# choose it: with them in the objective the bar moved to fewer splits and SuperDialseg's tune part
# lost 0.07 (docs/benchmarks.md, "Real task dialogues").
BOT_KINDS = ("superseg", "synthetic", "conversations")
# Closing exchanges for whole conversations. Task dialogues end this way and the next task opens
# after them; the development data almost never do (32 of 1,322 SuperDialseg dialogues). Worded
# apart from the in-car check's templates, so that check does not read its own phrases back.
USER_CLOSINGS = (
    "Thank you so much for your help.", "Great, that's everything I needed.", "ok thx", "Cool, thanks for the info.",
    "That answers my question, thanks.", "Alright, goodbye.", "Thanks a bunch!", "awesome thank u",
    "That's all for now, bye!", "I appreciate it, thanks.", "спасибо, это всё", "Понятно, спасибо!",
)  # fmt: skip
AGENT_CLOSINGS = (
    "You are welcome. Have a good day!", "Glad I could help.", "No problem at all.", "My pleasure, goodbye!",
    "You're very welcome.", "Have a nice day!", "Sure thing, take care.", "Пожалуйста, обращайтесь!",
)  # fmt: skip


def hash_percent(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100


def is_tune(dialogue_id: str) -> bool:
    return hash_percent(dialogue_id) < TUNE_SHARE


def fold_of(dialogue_id: str) -> int:
    return hash_percent("fold:" + dialogue_id) % FOLDS


class EmbeddingCache:
    """Vectors by (model, sha256 of text) in one .npz per model, so retraining embeds nothing."""

    def __init__(self, embedder: Embedder, folder: Path) -> None:
        self.embedder = embedder
        self.path = folder / f"embeddings-{hashlib.sha256(embedder.model.encode()).hexdigest()[:12]}.npz"
        self.vectors: dict[str, np.ndarray] = {}
        if self.path.exists():
            with np.load(self.path) as z:
                self.vectors = dict(zip(z["keys"].tolist(), z["vectors"], strict=True))

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        missing = sorted({t for t in texts if self.key(t) not in self.vectors})
        if missing:
            for text, vec in zip(missing, self.embedder.embed(missing), strict=True):
                self.vectors[self.key(text)] = np.asarray(vec, dtype=np.float32)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            keys = sorted(self.vectors)
            np.savez(self.path, keys=np.array(keys), vectors=np.stack([self.vectors[k] for k in keys]))
        return [self.vectors[self.key(t)] for t in texts]


@dataclass(frozen=True)
class Labelled:
    dialogue: Dialogue
    vectors: list[np.ndarray]
    kind: str  # tiage | superseg | synthetic | conversations | tasks
    fold: int


def segments(d: Dialogue) -> list[tuple[int, int]]:
    starts = [0] + [i + 1 for i, e in enumerate(d.ends_segment) if e]
    return list(zip(starts, [*starts[1:], len(d.texts)], strict=True))


def _piece(item: Labelled, start: int, end: int) -> Labelled | None:
    d = item.dialogue
    while start < end and d.roles[start] != "user":  # candidates are user turns: a piece opens with one
        start += 1
    if end - start < 2:
        return None
    ends = list(d.ends_segment[start:end])
    ends[-1] = 0
    piece = Dialogue(d.id, d.roles[start:end], d.texts[start:end], ends)
    return Labelled(piece, item.vectors[start:end], item.kind, item.fold)


def _concat(pieces: list[Labelled], did: str, fold: int) -> Labelled:
    roles: list[str] = []
    texts: list[str] = []
    ends: list[int] = []
    vectors: list[np.ndarray] = []
    for p in pieces:
        if ends:
            ends[-1] = 1
        roles += p.dialogue.roles
        texts += p.dialogue.texts
        ends += p.dialogue.ends_segment
        vectors += p.vectors
    ends[-1] = 0
    return Labelled(Dialogue(did, roles, texts, ends), vectors, "synthetic", fold)


def synthetic(
    source: Sequence[Labelled],
    n: int,
    rng: random.Random,
    *,
    first_only: bool,
    near: float,
    sizes: tuple[int, int],
    prefix: str,
) -> list[Labelled]:
    """Concatenations of pieces of different dialogues (see the module's docstring)."""
    pieces: list[Labelled] = []
    for item in source:
        segs = segments(item.dialogue)
        a = 0 if first_only else rng.randrange(len(segs))
        z = a + 1 if first_only else min(len(segs), a + rng.randint(1, 3))
        piece = _piece(item, segs[a][0], segs[z - 1][1])
        if piece is not None:
            pieces.append(piece)
    if len(pieces) < sizes[1] + 1:
        return []
    means = np.stack([np.mean(p.vectors, axis=0) for p in pieces])
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-9)
    neighbours = np.argsort(-(means @ means.T), axis=1)[:, 1:11]
    out = []
    for k in range(n):
        cur = rng.randrange(len(pieces))
        chosen = [cur]
        for _ in range(rng.randint(*sizes) - 1):
            pool = [int(j) for j in neighbours[cur]] if rng.random() < near else range(len(pieces))
            options = [j for j in pool if j not in chosen and pieces[j].dialogue.id != pieces[cur].dialogue.id]
            if not options:
                break
            cur = rng.choice(options)
            chosen.append(cur)
        out.append(_concat([pieces[j] for j in chosen], f"{prefix}-{k}", pieces[chosen[0]].fold))
    return out


@dataclass(frozen=True)
class Closings:
    """The closing exchanges with their vectors (embedded by the caller's embedder)."""

    user: Sequence[tuple[str, np.ndarray]]
    agent: Sequence[tuple[str, np.ndarray]]


def closings_of(embed: Callable[[Sequence[str]], list[np.ndarray]]) -> Closings:
    return Closings(
        tuple(zip(USER_CLOSINGS, embed(USER_CLOSINGS), strict=True)),
        tuple(zip(AGENT_CLOSINGS, embed(AGENT_CLOSINGS), strict=True)),
    )


def conversation(item: Labelled, rng: random.Random, closings: Closings | None) -> Labelled:
    """The whole dialogue as one segment, as a task-oriented set counts it, ended by a closing
    exchange CLOSED_SHARE of the time (after the agent's last answer: a last user turn is dropped)."""
    d = item.dialogue
    roles, texts, vectors = list(d.roles), list(d.texts), list(item.vectors)
    if closings is not None and rng.random() < CLOSED_SHARE:
        if roles[-1] == "user" and len(roles) > 2:
            roles, texts, vectors = roles[:-1], texts[:-1], vectors[:-1]
        (u, uv), (a, av) = rng.choice(closings.user), rng.choice(closings.agent)
        roles, texts, vectors = [*roles, "user", "assistant"], [*texts, u, a], [*vectors, uv, av]
    return Labelled(Dialogue(d.id, roles, texts, [0] * len(texts)), vectors, item.kind, item.fold)


class Recorder:
    """A scorer that never splits and keeps every feature row the segmenter asked it about."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, bool, np.ndarray]] = []

    def bar(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> Bar:
        return Bar(1.0, 0.0)  # shifts on (windows open), yet P(continues) = 1 is never below it

    def boundary_probability(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> float:
        stage = stage_of(window)
        self.rows.append((window[0].seq, stage, among_people(left, window), model_input(stage, features(left, window))))
        return 0.0


def turns_of(d: Dialogue, vectors: Sequence[np.ndarray]) -> list[SegTurn]:
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    return [
        SegTurn(i, role, text, t0 + timedelta(seconds=i), vec)
        for i, (role, text, vec) in enumerate(zip(d.roles, d.texts, vectors, strict=True))
    ]


@dataclass
class Rows:
    """Feature rows of every stage of every candidate: x, label, and where they came from."""

    x: np.ndarray
    y: np.ndarray
    item: np.ndarray  # index of the dialogue in the list the rows were read from
    seq: np.ndarray  # the candidate turn
    closed: np.ndarray  # the row is a closed window (the others are decided early or not at all)
    peer: np.ndarray  # no assistant in view: the peers' threshold and margin apply


def read_rows(items: Sequence[Labelled]) -> Rows:
    xs, ys, its, seqs, closed, peer = [], [], [], [], [], []
    for k, item in enumerate(items):
        rec = Recorder()
        # every candidate, a closing too (the workers skip a user's closing in a bot's conversation)
        segment(turns_of(item.dialogue, item.vectors), SegmenterConfig(closed_thread_bar=None), scorer=rec)
        for seq, stage, people, x in rec.rows:
            xs.append(x)
            ys.append(float(item.dialogue.ends_segment[seq - 1]))
            its.append(k)
            seqs.append(seq)
            closed.append(stage == "closed")
            peer.append(people)
    width = len(FEATURES) + len(STAGES) - 1
    return Rows(
        np.asarray(xs, dtype=np.float64).reshape(-1, width),
        np.asarray(ys),
        np.asarray(its, dtype=np.int64),
        np.asarray(seqs, dtype=np.int64),
        np.asarray(closed, dtype=bool),
        np.asarray(peer, dtype=bool),
    )


def fit_mlp(x: np.ndarray, y: np.ndarray, weights: np.ndarray, seed: int) -> Mlp:
    """Full-batch Adam on the row-weighted logistic loss with L2; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    weights = weights / weights.mean()
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    z = (x - mean) / scale
    n, k = z.shape
    params = [
        rng.normal(0.0, 1.0 / np.sqrt(k), (k, HIDDEN)),
        np.zeros(HIDDEN),
        rng.normal(0.0, 1.0 / np.sqrt(HIDDEN), HIDDEN),
        np.zeros(1),
    ]
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    for t in range(1, EPOCHS + 1):
        hidden = np.tanh(z @ params[0] + params[1])
        p = 1.0 / (1.0 + np.exp(-(hidden @ params[2] + params[3][0])))
        g = weights * (p - y) / n
        d_hidden = np.outer(g, params[2]) * (1.0 - hidden**2)
        grads = [
            z.T @ d_hidden + L2 * params[0],
            d_hidden.sum(axis=0),
            hidden.T @ g + L2 * params[2],
            np.array([g.sum()]),
        ]
        for i, grad in enumerate(grads):
            m1[i] = 0.9 * m1[i] + 0.1 * grad
            m2[i] = 0.999 * m2[i] + 0.001 * grad**2
            params[i] = params[i] - LEARNING_RATE * (m1[i] / (1 - 0.9**t)) / (np.sqrt(m2[i] / (1 - 0.999**t)) + 1e-8)
    return Mlp(mean, scale, params[0], params[1], params[2], float(params[3][0]))


def fit_bag(x: np.ndarray, y: np.ndarray, weights: np.ndarray, seed: int, bag: int = BAG) -> tuple[Mlp, ...]:
    return tuple(fit_mlp(x, y, weights, seed + i) for i in range(bag))


Pair = tuple[float, float]  # (threshold, early margin)


def decide(
    items: Sequence[Labelled],
    rows: Rows,
    p: np.ndarray,
    bots: Pair,
    peers: Pair,
    closed_bar: float | None = CLOSED_BAR,
    fresh: tuple[float, float] = (0.0, 0.0),  # margins: the bots', the peers'
) -> list[list[int]]:
    """What the segmenter decides from these probabilities: a candidate is a boundary when its
    closed window, or any earlier stage by the margin, falls below the threshold (the peers' pair
    where no assistant is in view), capped at `closed_bar` with a bot in view once the user has
    ended a task with a thanks and not since the last boundary, and lower by the fresh margin (the
    bots', the peers') while the episode holds a single user turn; with the bar on, a user's closing
    in a bot's conversation is no candidate. Features do not depend on earlier decisions, so this
    equals running `feed` with the model; only the cap and the episode's user turns are read turn
    by turn."""
    skip_closings = SegmenterConfig(closed_thread_bar=closed_bar).thanks_rules
    threshold = np.where(rows.peer, peers[0], bots[0])
    margin = np.where(rows.peer, peers[1], bots[1])
    lower = np.where(rows.peer, fresh[1], fresh[0])
    capped = threshold if closed_bar is None else np.where(rows.peer, threshold, np.minimum(threshold, closed_bar))
    pc = 1.0 - p

    def below(bar: np.ndarray) -> np.ndarray:
        return pc < np.where(rows.closed, bar, bar - margin)

    hit = {  # by (fresh, capped)
        (f, c): below((capped if c else threshold) - (lower if f else 0.0))
        for f in (False, True)
        for c in (False, True)
    }
    by_candidate: dict[tuple[int, int], list[int]] = {}
    for r, key in enumerate(zip(rows.item.tolist(), rows.seq.tolist(), strict=True)):
        by_candidate.setdefault(key, []).append(r)
    hyps = []
    for k, it in enumerate(items):
        d = it.dialogue
        h, ends, users = [0] * len(d.texts), TaskEnds(), 0  # users: in the episode, before this turn
        for seq, (role, text) in enumerate(zip(d.roles, d.texts, strict=True)):
            turn = TurnInfo.of(seq, role, text, None)
            rs = by_candidate.get((k, seq))
            if rs is not None and skip_closings and not rows.peer[rs[0]] and closes_conversation(turn):
                rs = None
            boundary = seq == 0 or (rs is not None and bool(hit[users == 1, ends.gates][rs].any()))
            if boundary:
                users = 0
                if seq:
                    h[seq - 1] = 1
            if role == "user":
                ends = ends.after(turn, boundary)
                users += 1
        h[-1] = 0
        hyps.append(h)
    return hyps


def scores_by_kind(
    items: Sequence[Labelled],
    rows: Rows,
    p: np.ndarray,
    bots: Pair,
    peers: Pair,
    closed_bar: float | None = None,
    fresh: tuple[float, float] = (0.0, 0.0),  # margins: the bots', the peers'
) -> dict:
    """Scores per kind of dialogue; without the closed-thread bar unless given, without fresh margins
    unless given (the bots', the peers')."""
    hyps = decide(items, rows, p, bots, peers, closed_bar, fresh)
    out: dict[str, Scores] = {}
    for kind in sorted({it.kind for it in items}):
        ks = [k for k, it in enumerate(items) if it.kind == kind]
        out[kind] = evaluate([items[k].dialogue.ends_segment for k in ks], [hyps[k] for k in ks])
    return out


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = STACK_L2, weights: np.ndarray | None = None) -> np.ndarray:
    """Logistic regression by Newton's method (a handful of weights), L2 on all but the last
    column (the constant); `weights`, if given, weigh the rows."""
    w = np.zeros(x.shape[1])
    rw = np.ones(len(y)) if weights is None else weights
    penalty = np.full(x.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))
        grad = x.T @ (rw * (p - y)) + penalty * w
        hess = (x * (rw * p * (1 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    return w


def stack_inputs(p_bag: np.ndarray, z: np.ndarray, closed: np.ndarray) -> np.ndarray:
    """The stacker's inputs, as memory/boundary_pair.py `stacked_logit` reads them."""
    p = np.clip(p_bag, 1e-6, 1 - 1e-6)
    bag = np.log(p / (1 - p))
    c = closed.astype(np.float64)
    return np.column_stack([bag, z, c * bag, c * z, c, np.ones_like(bag)])


def fit_pair(
    items: Sequence[Labelled],
    rows: Rows,
    oof: np.ndarray,
    folds: np.ndarray,
    pair: dict[str, Any],
    bots: Pair,
    peers: Pair,
    fresh: float,
) -> tuple[PairStack, dict[str, Any]]:
    """The stacker over the bag's and the pair model's out-of-fold figures on TIAGE's rows, and the
    peers' bar for it, chosen as the bag's is: the pair by cross-validated TIAGE Score, then the
    least fresh margin within FLAT of the best. The stacker's own figures are out of fold too."""
    use = rows.peer & np.array([items[k].kind in PEER_KINDS for k in rows.item])
    z = np.zeros(len(rows.y))
    for r in np.flatnonzero(use):
        did, seq = items[rows.item[r]].dialogue.id, str(rows.seq[r])
        if seq not in pair["oof"].get(did, {}):
            raise ValueError(f"the pair model's logits lack candidate {seq} of {did}: rerun `chatmem bench train-pair`")
        z[r] = pair["oof"][did][seq]
    x = stack_inputs(oof, z, rows.closed)
    stacked = oof.copy()
    for fold in range(FOLDS):
        fit_rows, held = use & (folds != fold), use & (folds == fold)
        if fit_rows.any() and held.any():
            stacked[held] = 1.0 / (1.0 + np.exp(-(x[held] @ fit_logistic(x[fit_rows], rows.y[fit_rows]))))
    pairs = [(t, m) for t in THRESHOLDS for m in MARGINS if t - m > 0]
    by_pair = {tm: scores_by_kind(items, rows, stacked, bots, tm) for tm in pairs}
    chosen = _best(pairs, lambda tm: _mean_score(by_pair[tm], PEER_KINDS))
    by_fresh = {f: scores_by_kind(items, rows, stacked, bots, chosen, CLOSED_BAR, (fresh, f)) for f in FRESH_MARGINS}
    chosen_fresh = _least(FRESH_MARGINS, lambda f: _mean_score(by_fresh[f], PEER_KINDS))
    weights = fit_logistic(x[use], rows.y[use])
    stack = PairStack(
        np.asarray(pair["head"], dtype=np.float64),
        float(pair["bias"]),
        tuple(round(float(w), 6) for w in weights),
        *chosen,
        chosen_fresh,
        str(pair["model_sha256"]),
    )
    summary = {
        kind: {"pk": round(sc.pk, 4), "wd": round(sc.wd, 4), "f1": round(sc.f1, 4), "score": round(sc.score, 4)}
        for kind, sc in by_fresh[chosen_fresh].items()
        if kind in PEER_KINDS
    }
    return stack, {"pair_model": pair.get("trained", {}), "cross_validated": summary}


@dataclass(frozen=True)
class Trained:
    scorer: BoundaryScorer
    summary: dict[str, Any]
    without_closed_bar: dict[str, Scores]  # cross-validated with the closed-thread bar off (not in the weights file)


def train(
    tiage: Sequence[Labelled],
    superseg: Sequence[Labelled],
    seed: int = SEED,
    bag: int = BAG,
    closings: Closings | None = None,
    pair: dict[str, Any] | None = None,
    tasks: Sequence[Labelled] = (),
) -> Trained:
    rng = random.Random(seed)
    task_rng = random.Random(seed + 7)  # its own draws: the other families stay as they were
    base = [*tiage, *superseg]
    synth: list[Labelled] = []
    for fold in range(FOLDS):
        members = [it for it in base if it.fold == fold]
        for first_only in (False, True):
            synth += synthetic(
                members,
                min(SYNTHETIC_PER_FOLD // 2, len(members)),
                rng,
                first_only=first_only,
                near=0.5,
                sizes=(2, 5),
                prefix=f"synthetic-{fold}-{'first' if first_only else 'any'}",
            )
        whole = [conversation(it, rng, closings) for it in superseg if it.fold == fold]
        joined = synthetic(
            whole,
            min(CONVERSATIONS_PER_FOLD, len(whole)),
            rng,
            first_only=False,
            near=0.5,
            sizes=(2, 5),
            prefix=f"conversations-{fold}",
        )
        synth += [replace(it, kind="conversations") for it in joined]
        own = [it for it in tasks if it.fold == fold]
        joined = synthetic(own, len(own), task_rng, first_only=True, near=0.5, sizes=(2, 5), prefix=f"tasks-{fold}")
        synth += [replace(it, kind="tasks") for it in joined]
    items = [*base, *synth]
    rows = read_rows(items)
    folds = np.array([items[k].fold for k in rows.item])
    weight_of = {"synthetic": SYNTHETIC_WEIGHT, "conversations": CONVERSATION_WEIGHT, "tasks": TASK_WEIGHT}
    weights = np.array([weight_of.get(items[k].kind, 1.0) for k in rows.item])
    oof = np.zeros(len(rows.y))
    for fold in range(FOLDS):
        train_rows = folds != fold
        if train_rows.all() or not train_rows.any():
            continue
        models = fit_bag(rows.x[train_rows], rows.y[train_rows], weights[train_rows], seed, bag)
        oof[~train_rows] = bag_probability(models, rows.x[~train_rows])
    pairs = [(t, m) for t in THRESHOLDS for m in MARGINS if t - m > 0]
    # The peers' pair first: their kinds are read with it alone (no assistant in any window).
    by_peers = {tm: scores_by_kind(items, rows, oof, tm, tm) for tm in pairs}
    peers = _best(pairs, lambda tm: _mean_score(by_peers[tm], PEER_KINDS))
    # The bots' pair is chosen as the workers decide, with the closed-thread bar on. With it off,
    # a bot's conversations were scored as no worker decides them by default, and a scorer that
    # reads whom it talks to was sent to the fewest splits (docs/benchmarks.md, "One bag that knows
    # whom it reads").
    grid = {tm: scores_by_kind(items, rows, oof, tm, peers, CLOSED_BAR) for tm in pairs}
    bots = _best(pairs, lambda tm: _mean_score(grid[tm], BOT_KINDS))
    by_peer_fresh = {f: scores_by_kind(items, rows, oof, bots, peers, CLOSED_BAR, (0.0, f)) for f in FRESH_MARGINS}
    peer_fresh = _least(FRESH_MARGINS, lambda f: _mean_score(by_peer_fresh[f], PEER_KINDS))
    by_fresh = {f: scores_by_kind(items, rows, oof, bots, peers, CLOSED_BAR, (f, peer_fresh)) for f in FRESH_MARGINS}
    fresh = _least(FRESH_MARGINS, lambda f: _mean_score(by_fresh[f], BOT_KINDS))
    without_bar = scores_by_kind(items, rows, oof, bots, peers, None, (fresh, peer_fresh))
    mlps = fit_bag(rows.x, rows.y, weights, seed, bag)
    stack, pair_summary = (None, None) if pair is None else fit_pair(items, rows, oof, folds, pair, bots, peers, fresh)
    summary = {
        "seed": seed,
        "bag": bag,
        "dialogues": {kind: sum(it.kind == kind for it in items) for kind in (*PEER_KINDS, *BOT_KINDS, "tasks")},
        "rows": len(rows.y),
        "cross_validated": {
            kind: {"pk": round(s.pk, 4), "wd": round(s.wd, 4), "f1": round(s.f1, 4), "score": round(s.score, 4)}
            for kind, s in by_fresh[fresh].items()
        },
        **({"pair": pair_summary} if pair_summary is not None else {}),
    }
    return Trained(BoundaryScorer(mlps, *bots, *peers, fresh, peer_fresh, stack), summary, without_bar)


def _mean_score(scores: dict[str, Scores], kinds: Sequence[str]) -> float:
    return float(np.mean([scores[k].score for k in kinds if k in scores]))


def _best(pairs: Sequence[Pair], objective: Callable[[Pair], float]) -> Pair:
    """The pair with the best objective; ties go to the higher threshold, then the smaller margin."""
    return max(pairs, key=lambda tm: (objective(tm), tm[0], -tm[1]))


def _least(margins: Sequence[float], objective: Callable[[float], float]) -> float:
    """The smallest margin whose objective is within `FLAT` of the best."""
    scores = {m: objective(m) for m in margins}
    top = max(scores.values())
    return min(m for m, score in scores.items() if score >= top - FLAT)


def labelled(dialogues: Sequence[Dialogue], cache: EmbeddingCache, kind: str) -> list[Labelled]:
    vectors = cache.embed([t for d in dialogues for t in d.texts])
    out, pos = [], 0
    for d in dialogues:
        out.append(Labelled(d, vectors[pos : pos + len(d.texts)], kind, fold_of(d.id)))
        pos += len(d.texts)
    return out


def write_defdts(path: Path, dialogues: Sequence[Dialogue]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for d in dialogues:
            lines: list[str] = []
            for role, text, end in zip(d.roles, d.texts, d.ends_segment, strict=True):
                lines.append(f"{'user' if role == 'user' else 'agent'}: {text}")
                if end:
                    lines.append("[BOUNDARY]")
            fh.write(json.dumps({"id": d.id, "dialogue": "[NEWLINE]".join(lines)}) + "\n")


def shipped_weights_path() -> Path:
    return Path(str(resources.files("chatmem.memory").joinpath(WEIGHTS_FILE)))


def run(
    data_dir: Path,
    cache_dir: Path,
    out: Path | None,
    embedder: Embedder,
    say: Callable[[str], None],
    seed: int = SEED,
    tasks_file: Path | None = None,
) -> Trained:
    """Train, write the weights to `out` (default: the package's), and write the held-out sets.
    `tasks_file`: the real task dialogues learned from (default: the package's)."""
    out = out or shipped_weights_path()
    cache = EmbeddingCache(embedder, cache_dir)
    tiage = labelled(load(data_dir / "anno_train.json"), cache, "tiage")
    superseg_all = load(data_dir / "superseg_validation.defdts.jsonl")
    superseg = labelled([d for d in superseg_all if not is_tune(d.id)], cache, "superseg")
    tune = [d for d in superseg_all if is_tune(d.id)]
    sgd = task_dialogues.load(tasks_file or task_dialogues.packaged(task_dialogues.TRAIN_FILE))
    tasks = labelled([d for _, d in sgd], cache, "tasks")
    say(
        f"training on {len(tiage)} TIAGE and {len(superseg)} SuperDialseg dialogues and {len(tasks)} task "
        "dialogues (+ synthetic)"
    )
    closings = closings_of(cache.embed)
    pair_file = cache_dir / PAIR_FILE
    pair = json.loads(pair_file.read_text(encoding="utf-8")) if pair_file.exists() else None
    if pair is None:
        say(f"no {pair_file}: the bag alone, with no pair model among people (`chatmem bench train-pair` writes it)")
    trained = train(tiage, superseg, seed, closings=closings, pair=pair, tasks=tasks)
    out.write_text(json.dumps(trained.scorer.to_json(trained.summary), separators=(",", ":")) + "\n", encoding="utf-8")
    say(
        f"wrote {out} ({out.stat().st_size:,} bytes): shift_threshold {trained.scorer.threshold}, "
        f"early margin {trained.scorer.early_margin} (with an assistant in view); "
        f"{trained.scorer.peer_threshold} and {trained.scorer.peer_margin} among people; fresh margin "
        f"{trained.scorer.fresh_margin} and {trained.scorer.peer_fresh_margin} among people"
    )
    for kind, s in trained.summary["cross_validated"].items():
        say(f"  cross-validated {kind}: Pk {s['pk']} · WD {s['wd']} · F1 {s['f1']} · Score {s['score']}")
    stack = trained.scorer.pair
    if stack is not None:
        say(
            f"  with the pair model among people: threshold {stack.threshold}, early margin {stack.early_margin}, "
            f"fresh margin {stack.fresh_margin}, stacker {list(stack.stack)}"
        )
        for kind, s in trained.summary["pair"]["cross_validated"].items():
            say(f"  cross-validated {kind} with it: Pk {s['pk']} · WD {s['wd']} · F1 {s['f1']} · Score {s['score']}")
    say(
        "  the same without the closed-thread bar: "
        + ", ".join(f"{kind} {s.score:.4f}" for kind, s in trained.without_closed_bar.items())
    )
    write_defdts(cache_dir / "superseg_tune.jsonl", tune)
    held = labelled(tune, cache, "superseg")
    task = synthetic(
        held,
        min(TASK_EVAL_DIALOGUES, len(held)),
        random.Random(seed + 1),
        first_only=True,
        near=1.0,
        sizes=(3, 6),
        prefix="task",
    )
    write_defdts(cache_dir / "taskconcat_tune.jsonl", [t.dialogue for t in task])
    rng = random.Random(seed + 2)
    whole = [conversation(it, rng, closings) for it in held]
    joined = synthetic(
        whole, min(TASK_EVAL_DIALOGUES, len(whole)), rng, first_only=False, near=0.5, sizes=(2, 5), prefix="conv"
    )
    write_defdts(cache_dir / "conversations_tune.jsonl", [t.dialogue for t in joined])
    # The task proxy again, its tasks ended by a closing exchange as often as the conversations'.
    rng = random.Random(seed + 3)
    firsts = [p for it in held if (p := _piece(it, *segments(it.dialogue)[0])) is not None]
    closed = synthetic(
        [conversation(p, rng, closings) for p in firsts],
        min(TASK_EVAL_DIALOGUES, len(firsts)),
        rng,
        first_only=False,
        near=1.0,
        sizes=(3, 6),
        prefix="task-closed",
    )
    write_defdts(cache_dir / "taskconcat_closed_tune.jsonl", [t.dialogue for t in closed])
    incar = incar_dialogues.dialogues()
    write_defdts(cache_dir / "incar_tasks.jsonl", incar)
    booking = booking_dialogues.dialogues()
    write_defdts(cache_dir / "booking_tasks.jsonl", booking)
    checks = task_dialogues.check_set(task_dialogues.packaged(task_dialogues.CHECK_FILE))
    write_defdts(cache_dir / "sgd_tasks.jsonl", checks)
    say(
        f"held-out sets for `chatmem bench topicseg --data`: {cache_dir / 'superseg_tune.jsonl'} ({len(tune)}), "
        f"{cache_dir / 'taskconcat_tune.jsonl'} ({len(task)}), "
        f"{cache_dir / 'conversations_tune.jsonl'} ({len(joined)}, whole conversations), "
        f"{cache_dir / 'taskconcat_closed_tune.jsonl'} ({len(closed)}, tasks ended by a thanks), "
        f"{cache_dir / 'incar_tasks.jsonl'} ({len(incar)}, templates), "
        f"{cache_dir / 'booking_tasks.jsonl'} ({len(booking)}, templates), "
        f"{cache_dir / 'sgd_tasks.jsonl'} ({len(checks)}, real task dialogues)"
    )
    return trained
