"""Hybrid recall: full-text (scored as BM25) and vector similarity, fused, over messages
(active and archived), summaries of every level and facts. Pure ranking over a read port; the
SQL lives in adapters/recall_pg.py.

Why this shape (measured on the LoCoMo dev split, see docs/read-path.md):
- turns are ranked by a small learned model (a bag of five networks from different seeds, their
  logits averaged) over pool-relative features (`TURN_FEATURES`:
  both signals as z-scores, the neighbours' (answers sit next to their questions), the
  sitting's best, a matching summary's lift, the named day and author, the turn's shape); it
  replaced a hand-tuned linear rule (`linear_scores`, kept for comparison) that had stopped
  improving by hand;
- a matching episode summary brings its episode's best turns into the pool even when they
  matched nothing;
- second hop: the turns the best summaries cover and the turns the matching facts were drawn
  from join the pool and are scored like the others (at scale the first stage may miss them);
- past `episode_cap` turns of one sitting in the answer, each further one pays `cap_decay`,
  so a single long sitting cannot take the whole answer.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from importlib import resources
from typing import Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from chatmem.memory.attachments.surrogates import ATTACHMENT_LINE, label, short_id
from chatmem.memory.dates import Period, query_period, utc_day
from chatmem.memory.mlp import Bag
from chatmem.memory.ports import Embedder
from chatmem.schemas.events import validate_identifier
from chatmem.schemas.read import CONTEXT_CHARS, SNIPPET_CHARS, Citation, RecallHit, RecallResult, Scope, SourceKind

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class NotReadable(Exception):
    """The user may not read this thread (or it does not exist: the two look the same)."""


@dataclass(frozen=True, slots=True)
class TermStats:
    docs: int
    avg_len: float
    df: tuple[int, ...]  # per query lexeme


# The three kinds of candidate are immutable records built by the hundred a recall (a pool of up
# to 200 per list): named tuples are built faster than frozen dataclasses, whose constructor sets
# each field through object.__setattr__ (a recall's candidates in 0.64x the time, with the term
# counts' change; docs/benchmarks.md, "Recall's Python on the critical path").
class TurnCandidate(NamedTuple):
    thread_id: str
    seq: int
    episode_id: str
    event_id: str
    platform_message_id: str | None
    user_id: str
    role: str
    text: str
    occurred_at: datetime
    is_active: bool
    sim: float
    tf: tuple[int, ...]  # per query lexeme
    length: int
    author_named: bool = False  # the query names the turn's author


@dataclass(frozen=True, slots=True)
class Hops:
    """Turns to bring into the candidate pool besides the query's own matches."""

    episodes: tuple[str, ...] = ()  # the best-matching episodes: their closest turns by vector
    ranges: tuple[tuple[str, int, int], ...] = ()  # (thread, from_seq, upto_seq) the best summaries cover
    events: tuple[str, ...] = ()  # the turns matching facts were drawn from


class SummaryCandidate(NamedTuple):
    summary_id: int
    thread_id: str
    episode_id: str | None
    kind: str
    level: int
    from_seq: int
    upto_seq: int
    text: str
    is_active: bool
    sim: float
    tf: tuple[int, ...]
    length: int


@dataclass(frozen=True, slots=True)
class FoundFact:
    """A stored fact that a search found (memory/facts.py FactCandidate is one not stored yet)."""

    fact_id: int
    thread_id: str
    episode_id: str | None
    text: str
    category: str
    rank: float  # full-text rank; 0 when only the vector search found it
    citation: Citation


class ArtifactCandidate(NamedTuple):
    """A text derived from an attachment, with the message (in a readable thread) that sent it."""

    text_id: int
    artifact_id: str | None  # sha256; None for a caption whose file could not be fetched
    artifact_kind: str | None  # image | document
    text_kind: str  # ocr | chunk | file_summary | vision_short | vision_detail | user_caption
    text: str
    meta: dict
    thread_id: str
    episode_id: str
    seq: int
    event_id: str
    position: int
    platform_message_id: str | None
    user_id: str
    role: str
    occurred_at: datetime
    filename: str | None
    sim: float
    tf: tuple[int, ...]
    length: int


class Pending(Protocol[T_co]):
    """Work a store started ahead (`RecallStore.ahead`)."""

    def result(self) -> T_co: ...

    def cancel(self) -> None:
        """Not needed any more: what has not started never starts."""
        ...


@dataclass(frozen=True)
class Inline(Generic[T]):
    """Work done when its result is asked for, on the caller's thread."""

    work: Callable[[], T]

    def result(self) -> T:
        return self.work()

    def cancel(self) -> None:
        pass


class RecallStore(Protocol):
    def session(self) -> AbstractContextManager[None]:
        """Group the queries of one read (one connection)."""
        ...

    def readable_threads(self, user_id: str, thread_id: str | None) -> list[str]: ...

    def lexemes(self, text: str) -> list[str]: ...

    def ahead(self, work: Callable[[], T]) -> Pending[T]:
        """Start `work` (calls to this store) beside the read's own queries where the store can;
        `.result()` gives its result."""
        ...

    def turn_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, period: Period | None
    ) -> tuple[list[TurnCandidate], TermStats]:
        """The query's full-text and vector matches, and the closest turns sent within `period`,
        with the scope's collection figures."""
        ...

    def hop_turns(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int, hops: Hops
    ) -> list[TurnCandidate]:
        """The closest turns of what `hops` names."""
        ...

    def neighbours(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """(thread_id, seq) -> 'author: text' of those turns, where they exist."""
        ...

    def summary_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[SummaryCandidate], TermStats]: ...

    def summary_sources(self, summary: SummaryCandidate) -> list[str]:
        """Platform message ids of the turns a summary covers."""
        ...

    def fact_candidates(self, user_id: str, lexemes: Sequence[str], limit: int) -> list[FoundFact]: ...

    def artifact_candidates(
        self, threads: Sequence[str], lexemes: Sequence[str], qvec: np.ndarray, limit: int
    ) -> tuple[list[ArtifactCandidate], TermStats]:
        """Attachment texts shared in these threads (derived text of linked files, captions)."""
        ...

    def facts_by_id(self, user_id: str, fact_ids: Sequence[int]) -> list[FoundFact]: ...


class FactSearch(Protocol):
    """The fact store's own semantic search (mem0), always filtered by one user."""

    def search(self, query: str, *, user_id: str, limit: int = 5) -> list[dict]: ...


@dataclass(frozen=True)
class RankParams:
    k1: float = 0.9
    b: float = 0.4
    lexical_weight: float = 0.5
    neighbour: float = 0.4
    episode_prior: float = 0.8
    episode_top: int = 3
    sitting_gap_s: float = 3600.0
    summary_boost: float = 0.3
    summary_episodes: int = 3
    hop_summaries: int = 3  # the best summaries whose turns join the pool
    date_boost: float = 2.0  # in standard deviations of the pool's scores
    speaker_boost: float = 0.3  # likewise
    episode_cap: int = 8  # turns of one sitting in the answer before the decay applies
    cap_decay: float = 1.0  # per further turn, in standard deviations
    # Candidates per first-stage list (text, vector). On LoCoMo (550-700-turn threads) 150-1000
    # gave the same recall@10 within 0.005; 200 halves the time of the turn query (docs/benchmarks.md).
    pool: int = 200
    fact_weight: float = 0.5
    fact_share: float = 0.25  # at most this share of an `all` answer are facts
    artifact_weight: float = 0.6
    artifact_share: float = 0.25  # likewise for attachment texts
    rrf_k: int = 10


def bm25(tf: Sequence[int], length: int, stats: TermStats, k1: float, b: float) -> float:
    score = 0.0
    norm = k1 * (1 - b + b * length / max(stats.avg_len, 1e-9))
    for f, df in zip(tf, stats.df, strict=True):
        if f and df:
            idf = math.log(1 + (stats.docs - df + 0.5) / (df + 0.5))
            score += idf * f * (k1 + 1) / (f + norm)
    return score


def zscores(values: np.ndarray) -> np.ndarray:
    if len(values) == 0:
        return values
    std = values.std()
    return (values - values.mean()) / std if std > 1e-12 else np.zeros_like(values)


def bm25_all(
    items: Sequence[TurnCandidate | SummaryCandidate | ArtifactCandidate], stats: TermStats, k1: float, b: float
) -> np.ndarray:
    """`bm25` for every candidate at once (the same formula, as array operations)."""
    if not items or not stats.df:
        return np.zeros(len(items))
    tf = np.array([c.tf for c in items], dtype=float)
    lengths = np.array([c.length for c in items], dtype=float)
    df = np.array(stats.df, dtype=float)
    idf = np.where(df > 0, np.log(1 + (stats.docs - df + 0.5) / (df + 0.5)), 0.0)
    norm = k1 * (1 - b + b * lengths / max(stats.avg_len, 1e-9))
    return (idf * tf * (k1 + 1) / (tf + norm[:, None])).sum(axis=1)


def fused(
    items: Sequence[TurnCandidate | SummaryCandidate | ArtifactCandidate], stats: TermStats, p: RankParams
) -> np.ndarray:
    lex = bm25_all(items, stats, p.k1, p.b)
    sim = np.array([c.sim for c in items], dtype=float)
    return p.lexical_weight * zscores(lex) + (1 - p.lexical_weight) * zscores(sim)


# What the learned ranker reads of each candidate turn, all relative to the query's pool (z-scores)
# so a query's scale does not matter: the turn's own match, its neighbours' (the answer sits next to
# the question), its sitting's best, its episode summary's, the day and author the query names,
# and the turn's shape (long statements answer, questions ask; the turn right after a question
# often answers it, though the question's words match the query better).
TURN_FEATURES: tuple[str, ...] = (
    "lexical",
    "vector",
    "prev",
    "next",
    "prev_vector",
    "next_vector",
    "prev_lexical",
    "next_lexical",
    "sitting",
    "summary",
    "named_day",
    "named_author",
    "log_length",
    "question",
    "prev_question",
    "attachment",
)
RANKER_FILE = "ranker_weights.json"


def turn_features(
    turns: Sequence[TurnCandidate],
    stats: TermStats,
    p: RankParams,
    episode_boost: dict[str, float] | None = None,
    period: Period | None = None,
    groups: dict[tuple[str, int], list[int]] | None = None,
) -> np.ndarray:
    """One row of TURN_FEATURES per candidate (`groups`: their sittings, when already known)."""
    n = len(turns)
    lex = zscores(bm25_all(turns, stats, p.k1, p.b))
    vec = zscores(np.array([t.sim for t in turns], dtype=float))
    base = p.lexical_weight * lex + (1 - p.lexical_weight) * vec
    at = {(t.thread_id, t.seq): i for i, t in enumerate(turns)}
    prev = np.array([at.get((t.thread_id, t.seq - 1), -1) for t in turns])
    nxt = np.array([at.get((t.thread_id, t.seq + 1), -1) for t in turns])

    def of(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
        # A neighbour outside the pool matched nothing: it counts as the weakest candidate.
        return np.where(idx >= 0, values[idx], values.min())

    # The sender's words end where the first attachment line the pipeline appends begins (a
    # picture's caption is not theirs): a question is read from the words alone.
    lines = [ATTACHMENT_LINE.search(t.text) for t in turns]
    words = [t.text[: m.start()] if m else t.text for t, m in zip(turns, lines, strict=True)]
    question = np.array([w.rstrip().endswith("?") for w in words], dtype=float)

    sitting = np.zeros(n)
    for idx in (groups if groups is not None else sittings(turns, p.sitting_gap_s)).values():
        sitting[idx] = float(np.sort(base[idx])[::-1][: p.episode_top].mean())
    boost = episode_boost or {}
    return np.column_stack(
        [
            lex,
            vec,
            of(base, prev),
            of(base, nxt),
            of(vec, prev),
            of(vec, nxt),
            of(lex, prev),
            of(lex, nxt),
            sitting,
            [boost.get(t.episode_id, 0.0) for t in turns],
            [period is not None and period.first <= utc_day(t.occurred_at) <= period.last for t in turns],
            [t.author_named for t in turns],
            np.log1p([t.length for t in turns]),
            question,
            np.where(prev >= 0, question[prev], 0.0),  # a turn before outside the pool asked nothing
            [m is not None for m in lines],
        ]
    ).astype(float)


def load_ranker(text: str) -> Bag:
    data = json.loads(text)
    if list(data["features"]) != list(TURN_FEATURES):
        raise ValueError("ranker weights were trained on other features; retrain with `make train-ranker`")
    return Bag.from_json(data["mlps"])


@lru_cache(maxsize=1)
def shipped_ranker() -> Bag:
    """The model trained by `chatmem bench train-ranker` (bench/train_ranker.py), package data."""
    return load_ranker(resources.files("chatmem.memory").joinpath(RANKER_FILE).read_text(encoding="utf-8"))


def rank_turns(
    turns: Sequence[TurnCandidate],
    stats: TermStats,
    p: RankParams,
    episode_boost: dict[str, float] | None = None,
    period: Period | None = None,
    limit: int | None = None,
    ranker: Bag | None = None,
) -> list[tuple[TurnCandidate, float]]:
    """Candidates best first; the sitting cap orders the first `limit` (all when None). With a
    `ranker` its score over `turn_features` decides; without, the hand-tuned linear rule."""
    if not turns:
        return []
    groups = sittings(turns, p.sitting_gap_s)
    if ranker is not None:
        final = ranker.logit(turn_features(turns, stats, p, episode_boost, period, groups))
    else:
        final = linear_scores(turns, stats, p, groups, episode_boost, period)
    sitting = [0] * len(turns)
    for n, idx in enumerate(groups.values()):
        for i in idx:
            sitting[i] = n
    spread = float(final.std()) or 1.0
    order = capped(final, sitting, p.episode_cap, p.cap_decay * spread, turns, limit)
    return [(turns[i], float(final[i])) for i in order]


def linear_scores(
    turns: Sequence[TurnCandidate],
    stats: TermStats,
    p: RankParams,
    groups: dict[tuple[str, int], list[int]],
    episode_boost: dict[str, float] | None = None,
    period: Period | None = None,
) -> np.ndarray:
    """The rule the learned ranker replaced (kept for comparison: `bench locomo --linear`)."""
    base = fused(turns, stats, p)
    at = {(t.thread_id, t.seq): i for i, t in enumerate(turns)}
    floor = float(base.min())
    smoothed = base.copy()
    for i, t in enumerate(turns):
        near = [base[j] for j in (at.get((t.thread_id, t.seq - 1)), at.get((t.thread_id, t.seq + 1))) if j is not None]
        # A neighbour outside the pool matched nothing: it counts as the weakest candidate.
        smoothed[i] += p.neighbour * (max(near) if near else floor)
    final = smoothed.copy()
    for idx in groups.values():
        top = np.sort(smoothed[idx])[::-1][: p.episode_top]
        final[idx] += p.episode_prior * float(top.mean())
    for i, t in enumerate(turns):
        final[i] += (episode_boost or {}).get(t.episode_id, 0.0)
    # Lifts in units of the pool's spread weigh the same whatever the query's score scale.
    spread = float(final.std()) or 1.0
    if period is not None:
        final += (
            p.date_boost * spread * np.array([period.first <= utc_day(t.occurred_at) <= period.last for t in turns])
        )
    final += p.speaker_boost * spread * np.array([t.author_named for t in turns])
    return final


def capped(
    scores: np.ndarray,
    group: Sequence[int],
    cap: int,
    decay: float,
    turns: Sequence[TurnCandidate],
    limit: int | None = None,
) -> list[int]:
    """Indexes best first, where each turn of a group past the first `cap` chosen loses `decay`
    per turn over the cap (greedy; lazily re-scored, since a penalty only grows). Only the first
    `limit` are chosen so; the rest follow by score."""
    chosen: dict[int, int] = defaultdict(int)
    heap = [(-float(scores[i]), turns[i].thread_id, turns[i].seq, i, 0) for i in range(len(turns))]
    heapq.heapify(heap)
    order: list[int] = []
    while heap and (limit is None or len(order) < limit):
        neg, thread, seq, i, seen = heapq.heappop(heap)
        g = group[i]
        if seen != chosen[g]:
            penalty = decay * max(0, chosen[g] - cap + 1)
            heapq.heappush(heap, (-(float(scores[i]) - penalty), thread, seq, i, chosen[g]))
            continue
        order.append(i)
        chosen[g] += 1
    rest = sorted(heap, key=lambda h: (-float(scores[h[3]]), h[1], h[2]))
    return order + [h[3] for h in rest]


def sittings(turns: Sequence[TurnCandidate], gap_s: float) -> dict[tuple[str, int], list[int]]:
    """Group candidates into sittings: runs of a thread without a pause longer than `gap_s`.
    Topic episodes can be a few turns long; a sitting is the unit people remember."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    order = sorted(range(len(turns)), key=lambda i: (turns[i].thread_id, turns[i].seq))
    sitting, prev = 0, None
    for i in order:
        t = turns[i]
        if prev is not None and (
            prev.thread_id != t.thread_id or (t.occurred_at - prev.occurred_at).total_seconds() > gap_s
        ):
            sitting += 1
        groups[(t.thread_id, sitting)].append(i)
        prev = t
    return groups


def author(user_id: str, role: str) -> str:
    """Who said it, as shown next to a snippet: the user's id, or the bot's role."""
    return user_id if role == "user" else role


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


@dataclass
class Recall:
    """recall(user, query, scope, limit[, thread]) over a read port, the embedder and mem0."""

    store: RecallStore
    # Embeds the query, once, for every search: the composition root gives the query encoder
    # fine-tuned for recall where the stored vectors are the model it was tuned from
    # (bench/train_query.py), else the model itself. `facts` searches with the same vector.
    embedder: Embedder
    facts: FactSearch | None = None
    params: RankParams = field(default_factory=RankParams)
    ranker: Bag | None = field(default_factory=shipped_ranker)  # None: the hand-tuned linear rule

    def __call__(
        self,
        user_id: str,
        query: str,
        *,
        scope: Scope = Scope.ALL,
        limit: int = 10,
        thread_id: str | None = None,
    ) -> RecallResult:
        with self.store.session():
            return self._recall(user_id, query, Scope(scope), limit, thread_id)

    def _recall(self, user_id: str, query: str, scope: Scope, limit: int, thread_id: str | None) -> RecallResult:
        # Client ids reach no query unchecked (mem0 would read '*' as a wildcard).
        user_id = validate_identifier(user_id, "user_id")
        thread_id = None if thread_id is None else validate_identifier(thread_id)
        # Facts belong to the user, not to threads: that scope needs no thread list.
        threads = self.store.readable_threads(user_id, thread_id) if scope is not Scope.FACTS else []
        if thread_id is not None and scope is not Scope.FACTS and not threads:
            raise NotReadable(thread_id)
        query = query.replace("\x00", "").strip()  # NUL means nothing in a query, and Postgres refuses it
        if not query or limit <= 0:
            return RecallResult(query=query, scope=scope, hits=[])
        lexemes = self.store.lexemes(query)
        qvec = self.embedder.embed([query])[0]
        p = self.params
        first: Pending[tuple[list[TurnCandidate], TermStats]] | None = None
        period: Period | None = None
        if scope in (Scope.ALL, Scope.MESSAGES) and threads:
            # The turn search's first stage needs nothing the summaries or facts find: it starts
            # now, beside them (half of a recall's time was the two searches one after the other).
            period = query_period(query)

            def search() -> tuple[list[TurnCandidate], TermStats]:
                return self.store.turn_candidates(threads, lexemes, qvec, p.pool, period)

            first = self.store.ahead(search)  # beside them where the store can (`recall_parallel`)
        try:
            return self._answer(user_id, query, scope, limit, threads, lexemes, qvec, first, period)
        finally:
            if first is not None:
                first.cancel()  # a no-op once taken; a read that failed leaves nothing running

    def _answer(
        self,
        user_id: str,
        query: str,
        scope: Scope,
        limit: int,
        threads: list[str],
        lexemes: list[str],
        qvec: np.ndarray,
        first: Pending[tuple[list[TurnCandidate], TermStats]] | None,
        period: Period | None,
    ) -> RecallResult:
        p = self.params
        hits: list[RecallHit] = []
        # Facts first in an `all` answer: the turns they were drawn from are a second hop for the turns.
        facts = (
            self._fact_hits(user_id, query, lexemes, max(1, int(limit * p.fact_share))) if scope is Scope.ALL else []
        )
        artifacts: list[RecallHit] = []
        if scope in (Scope.ALL, Scope.MESSAGES, Scope.SUMMARIES) and threads:
            summaries, sstats = self.store.summary_candidates(threads, lexemes, qvec, p.pool)
            ranked_summaries = self._rank_summaries(summaries, sstats)
            if scope is Scope.SUMMARIES:
                hits = [self._summary_hit(s, score) for s, score in ranked_summaries[:limit]]
            else:
                if scope is Scope.ALL:  # searched while the turn search may still run beside
                    artifacts = self._artifact_hits(threads, lexemes, qvec, max(1, int(limit * p.artifact_share)))
                sources = tuple(f.citation.event_id for f in facts if f.citation.event_id)
                assert first is not None  # started for these scopes
                hits = self._turn_hits(threads, lexemes, qvec, first, period, ranked_summaries, sources, limit)
        if scope is Scope.FACTS:
            hits = self._fact_hits(user_id, query, lexemes, limit)
        elif scope is Scope.ALL:
            hits = _interleave(hits, facts, p.fact_weight, p, limit)
            hits = _interleave(hits, artifacts, p.artifact_weight, p, limit)
        if scope is Scope.ARTIFACTS and threads:
            hits = self._artifact_hits(threads, lexemes, qvec, limit)
        return RecallResult(query=query, scope=scope, hits=hits[:limit])

    def _artifact_hits(self, threads: list[str], lexemes: list[str], qvec: np.ndarray, limit: int) -> list[RecallHit]:
        """The best text of each attachment (one hit per file and message), ranked like turns."""
        items, stats = self.store.artifact_candidates(threads, lexemes, qvec, self.params.pool)
        if not items:
            return []
        scores = fused(items, stats, self.params)
        order = sorted(range(len(items)), key=lambda i: (-scores[i], items[i].text_id))
        seen: set[tuple[str | None, str, int]] = set()
        hits: list[RecallHit] = []
        for i in order:
            a = items[i]
            key = (a.artifact_id, a.event_id, a.position)
            if key in seen:
                continue
            seen.add(key)
            hits.append(self._artifact_hit(a, float(scores[i])))
            if len(hits) >= limit:
                break
        return hits

    def _artifact_hit(self, a: ArtifactCandidate, score: float) -> RecallHit:
        tag = label(a.artifact_kind) + (f"#{short_id(a.artifact_id)}" if a.artifact_id else "")
        where = f", p. {a.meta['page']}" if "page" in a.meta else ""
        name = f" {a.filename}" if a.filename else ""
        return RecallHit(
            kind="artifact",
            score=round(score, 4),
            snippet=clip(f"[{tag}{name}, {a.text_kind}{where}] {a.text}", SNIPPET_CHARS),
            author=author(a.user_id, a.role),
            citation=_message_citation("artifact", a, artifact_id=a.artifact_id, artifact_text=a.text_kind),
        )

    def _rank_summaries(
        self, summaries: list[SummaryCandidate], stats: TermStats
    ) -> list[tuple[SummaryCandidate, float]]:
        if not summaries:
            return []
        scores = fused(summaries, stats, self.params)
        order = sorted(range(len(summaries)), key=lambda i: (-scores[i], summaries[i].summary_id))
        return [(summaries[i], float(scores[i])) for i in order]

    def _turn_hits(
        self,
        threads: list[str],
        lexemes: list[str],
        qvec: np.ndarray,
        first: Pending[tuple[list[TurnCandidate], TermStats]],
        period: Period | None,
        ranked_summaries: list[tuple[SummaryCandidate, float]],
        fact_sources: tuple[str, ...],
        limit: int,
    ) -> list[RecallHit]:
        """The first stage's turns (`first`) with the second hop's, ranked. The second hop is
        searched before the first stage is taken (it may still be running beside it); a turn both
        found counts once."""
        p = self.params
        boost: dict[str, float] = {}
        for s, score in ranked_summaries:
            if s.episode_id and score > 0:
                boost[s.episode_id] = max(boost.get(s.episode_id, 0.0), p.summary_boost * score)
        best = [s for s, score in ranked_summaries[: p.hop_summaries] if score > 0]
        hops = Hops(
            episodes=tuple(e for e, _ in sorted(boost.items(), key=lambda kv: -kv[1])[: p.summary_episodes]),
            ranges=tuple((s.thread_id, s.from_seq, s.upto_seq) for s in best),
            events=fact_sources,
        )
        hopped = self.store.hop_turns(threads, lexemes, qvec, p.pool, hops)
        turns, stats = first.result()
        seen = {(t.thread_id, t.seq) for t in turns}
        turns += [t for t in hopped if (t.thread_id, t.seq) not in seen]
        ranked = self._rank_turns(turns, stats, boost, period, limit)
        keys = [(t.thread_id, t.seq + d) for t, _ in ranked for d in (-1, 1)]
        context = self.store.neighbours(keys)
        return [self._turn_hit(t, score, context) for t, score in ranked]

    def _rank_turns(
        self,
        turns: list[TurnCandidate],
        stats: TermStats,
        boost: dict[str, float],
        period: Period | None,
        limit: int,
    ) -> list[tuple[TurnCandidate, float]]:
        return rank_turns(turns, stats, self.params, boost, period, limit, self.ranker)[:limit]

    def _turn_hit(self, t: TurnCandidate, score: float, context: dict[tuple[str, int], str]) -> RecallHit:
        before = context.get((t.thread_id, t.seq - 1))
        after = context.get((t.thread_id, t.seq + 1))
        return RecallHit(
            kind="message",
            score=round(score, 4),
            snippet=clip(t.text, SNIPPET_CHARS),
            before=clip(before, CONTEXT_CHARS) if before else None,
            after=clip(after, CONTEXT_CHARS) if after else None,
            archived=not t.is_active,
            author=author(t.user_id, t.role),
            citation=_message_citation("message", t),
        )

    def _summary_hit(self, s: SummaryCandidate, score: float) -> RecallHit:
        return RecallHit(
            kind="summary",
            score=round(score, 4),
            snippet=clip(s.text, SNIPPET_CHARS),
            archived=not s.is_active,
            citation=Citation(
                source="summary",
                thread_id=s.thread_id,
                episode_id=s.episode_id,
                seq=s.from_seq,
                upto_seq=s.upto_seq,
                source_ids=self.store.summary_sources(s),
            ),
        )

    def _fact_hits(self, user_id: str, query: str, lexemes: list[str], limit: int) -> list[RecallHit]:
        lexical = self.store.fact_candidates(user_id, lexemes, limit)
        semantic: list[FoundFact] = []
        if self.facts is not None:
            found = self.facts.search(query, user_id=user_id, limit=limit)
            ids = [
                int(m["metadata"]["chatmem_fact_id"]) for m in found if "chatmem_fact_id" in (m.get("metadata") or {})
            ]
            by_id = {f.fact_id: f for f in self.store.facts_by_id(user_id, ids)}
            semantic = [by_id[i] for i in ids if i in by_id]  # only active facts of this user
        scores: dict[int, float] = defaultdict(float)
        facts: dict[int, FoundFact] = {}
        for ranking in (lexical, semantic):
            for rank, f in enumerate(ranking):
                scores[f.fact_id] += 1.0 / (self.params.rrf_k + rank + 1)
                facts[f.fact_id] = f
        order = sorted(scores, key=lambda i: (-scores[i], i))[:limit]
        return [
            RecallHit(
                kind="fact",
                score=round(scores[i], 4),
                snippet=clip(facts[i].text, SNIPPET_CHARS),
                citation=facts[i].citation,
            )
            for i in order
        ]


def _message_citation(source: SourceKind, m: TurnCandidate | ArtifactCandidate, **extra: str | None) -> Citation:
    """A citation of the message a hit came from (the turn itself, or the one that sent a file)."""
    return Citation(
        source=source,
        thread_id=m.thread_id,
        episode_id=m.episode_id,
        seq=m.seq,
        platform_message_id=m.platform_message_id,
        event_id=m.event_id,
        occurred_at=m.occurred_at,
        **extra,
    )


def _interleave(
    turns: list[RecallHit], facts: list[RecallHit], weight: float, p: RankParams, limit: int
) -> list[RecallHit]:
    """One list from turns and facts (or attachment texts): a fact goes just before the turn it
    was drawn from when that turn ranked; the others by weighted reciprocal rank."""
    at = {h.citation.event_id: n for n, h in enumerate(turns) if h.citation.event_id}
    before: dict[int, list[RecallHit]] = defaultdict(list)
    loose: list[RecallHit] = []
    for f in facts:
        n = at.get(f.citation.event_id) if f.citation.event_id else None
        if n is None:
            loose.append(f)
        else:
            before[n].append(f)
    merged = [h for n, t in enumerate(turns) for h in (*before.get(n, ()), t)]
    scored = [(1.0 / (p.rrf_k + r + 1), 0, r, h) for r, h in enumerate(merged)]
    scored += [(weight / (p.rrf_k + r + 1), 1, r, h) for r, h in enumerate(loose)]
    scored.sort(key=lambda x: (-x[0], x[1], x[2]))
    return [h for *_, h in scored[:limit]]
