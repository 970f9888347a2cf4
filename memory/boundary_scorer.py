"""The learned boundary scorer: features of a candidate topic boundary and a bag of tiny MLPs over
them.

A candidate is a user turn; the segmenter asks for the probability that it opens a new topic
at up to three moments, each seeing more of the turns after it (the streaming window):

- `open`: the candidate has just arrived (left context + the candidate);
- `reply`: replies to it have arrived (+ the non-user turns after it);
- `closed`: the next user turn has arrived, the window is complete.

Features never look further right than that window. They are similarities of the candidate
and the window to the left context at several widths, TextTiling depth scores, and dialogue
cues (questions and answers, speaker, length, greetings, closings, continuation words, follow-ups
leaning on a pronoun or an ellipsis, a question that opens on the partner or hands one back), and
whether an assistant is in view at all: one bag reads people chatting and a bot's users alike.
The weights ship as package data (`segmenter_weights.json`), trained by `chatmem bench
train-segmenter` (bench/train_segmenter.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple

import numpy as np

from chatmem.memory.boundary_pair import PairStack, candidate_text, context_text
from chatmem.memory.mlp import Mlp
from chatmem.memory.ports import PairEncoder
from chatmem.memory.text import pattern_text

WEIGHTS_FILE = "segmenter_weights.json"
STAGES: tuple[str, ...] = ("open", "reply", "closed")
LEFT_WIDTHS: tuple[int, ...] = (1, 2, 3, 4)
LEFT_CONTEXT = 5  # turns before a candidate that features read (depth over 2-turn windows needs 5)

_WORD = re.compile(r"[\w'\u2019\u02bc]+", re.UNICODE)  # "don't" and a phone's "don’t" are one word
# Cues in English and Russian, the languages of the explicit markers. Matched at the start of a
# message, except closings, which count anywhere ("ok thanks, bye").
_GREETING = re.compile(
    r"^\W*(hi|hello|hey|hiya|greetings|good (morning|afternoon|evening)|привет|здравствуй|здравствуйте|"
    r"добрый (день|вечер)|доброе утро)\b",
    re.IGNORECASE,
)
_CLOSING = re.compile(
    r"\b(thanks|thank you|thank u|thx|bye|goodbye|good bye|see you|that's all|that is all|that's it|"
    r"have a (nice|good|great)|you're welcome|you are welcome|спасибо|пока|до свидания|всего доброго)\b",
    re.IGNORECASE,
)
_CONTINUES = re.compile(
    r"^\W*(and|but|so|also|or|because|then|it|its|it's|that|that's|this|they|them|those|these|he|she|his|her|"
    r"yes|yeah|no|nope|ok|okay|sure|right|и|а|но|так|это|он|она|они|да|нет|ок|хорошо)\b",
    re.IGNORECASE,
)
_REQUEST = re.compile(
    r"^\W*(what about|how about|what else|anything else|another|one more|i also|can you also|i'd also|"
    r"i would also|i need|i want|i'd like|i would like|i'm looking|i am looking|can you|could you|please|find|"
    r"where|when|what|how|who|which|why|is there|are there|do you|does|do i|can i|should i|а что|а как|ещё|еще|"
    r"скажи|подскажи|найди|где|когда|что|как|кто|почему)\b",
    re.IGNORECASE,
)
# A pronoun or "there" and an elliptical opener mark a follow-up on what was just said ("Where is
# it?", "And tomorrow?"): in every training set such a short user turn opens a topic far less
# often than other questions do, and task dialogues are full of them.
_ANAPHORA = re.compile(
    r"\b(it|its|it's|there|that|this|those|these|them|they|one|ones|he|she|him|her|his|"
    r"он|она|оно|они|его|её|ее|их|там|туда|этот|эта|это|эти|тот|та|те)\b",
    re.IGNORECASE,
)
_ELLIPSIS = re.compile(r"^\W*(and|what about|how about|also|same|а что|а как|и|тоже|также)\b", re.IGNORECASE)
SHORT_FOLLOW_UP = 8  # words: a longer turn with a pronoun is as often a new topic as any
# A user who is done says so without a thanks too ("Great, that's everything I needed."). Read only
# to tell that a task ended (`closes_conversation`), never as a scorer feature.
_DONE = re.compile(
    r"\b(that's everything|that is everything|that will be all|that'll be all|that would be all|that'd be all|"
    r"all set|nothing else|nothing more|(don't|do not|dont) need anything|no more questions|no further questions|"
    r"это всё|это все|больше ничего|ничего больше)\b",
    re.IGNORECASE,
)
_ORDER = re.compile(
    r"^\W*(book|reserve|find|get|send|set|add|show|tell|give|call|make|change|cancel|move|remind|schedule|check|"
    r"забронируй|закажи|найди|покажи|напомни|добавь|отмени|поставь)\b",
    re.IGNORECASE,
)
_THANKS_TO = re.compile(r"\bthanks to\b", re.IGNORECASE)  # "thanks to the storm ...": a cause, no thanks
_CLAUSE = re.compile(r"[.!;,\n]+")
NEW_REQUEST_WORDS = 5  # a clause this long with no thanks in it says something new
# Among people a question that opens on the partner ("good for you. do you like vintage cars?")
# brings up something new far more often than other questions (TIAGE train: 59% of such turns
# start a topic, other questions 26%), and one that hands a question back ("how about you?")
# keeps it. Read only in a turn with a question mark; a clause may open with a filler word.
# One `\s*` after the clause mark: two in a row made a long run of spaces quadratic to search.
_OPENER = r"(?:^|[.!?;,])\s*(?:(?:so|and|well|oh|hey|btw|also|anyway|ok|okay|lol|cool|nice|great|wow|а|и|ну)[\s,!.]*)?"
_INTRO = re.compile(
    _OPENER + r"(?:(?:do|did|have|are|were|would|can|could|will)\s+(?:you|u)\b|"
    r"what(?:'s|s| is| are| was)\s+your\b|what do you\b|where (?:do|are|did) you\b|how old\b|who is your\b|"
    r"(?:ты|вы)\s+\w+(?:ешь|ишь|ете|ите|ал|ала)\b|"
    r"у (?:тебя|вас) есть\b|(?:какой|какая|какое|какие|кто) (?:твой|твоя|твоё|твое|твои|ваш|ваша|ваши)\b)",
    re.IGNORECASE,
)
_BACK = re.compile(
    r"\b(?:how|what) about (?:you|u)\b|\band (?:you|u)\s*\?|\b(?:you|u)\s*\?\s*$|\bа (?:ты|вы|у тебя|у вас)\s*\?",
    re.IGNORECASE,
)
GREETING, CLOSING, CONTINUES, REQUEST, ANAPHORA, ELLIPSIS, ENDS_TASK, INTRO, BACK = 1, 2, 4, 8, 16, 32, 64, 128, 256

FEATURES: tuple[str, ...] = (
    *(f"sim_left{w}_{part}" for w in LEFT_WIDTHS for part in ("cand", "window", "last")),
    "sim_cand_last",
    "depth1",
    "depth2",
    "question_before",
    "question_cand",
    "question_last",
    "answers",
    "user_before",
    "log_words_cand",
    "log_words_before",
    "log_words_last",
    "short_cand",
    "short_before",
    "greeting_cand",
    "closing_before",
    "closing_cand",
    "continues_cand",
    "request_cand",
    "anaphora_cand",
    "ellipsis_cand",
    "short_anaphora_cand",
    "intro_cand",
    "back_cand",
    "people",
)


@dataclass(frozen=True)
class TurnInfo:
    """What the scorer needs of one turn; small, so the segmenter's state can keep a few."""

    seq: int
    role: str
    vector: np.ndarray | None  # float32, unit-normalised
    words: int
    question: bool
    cues: int  # bit set of GREETING, CLOSING, CONTINUES, REQUEST, ANAPHORA, ELLIPSIS, ENDS_TASK, INTRO, BACK
    # The words, kept only while an LLM assists the segmenter (memory/boundary_llm.py): the
    # scorer never reads them, and with the assist off the state stays as small as before.
    text: str | None = None

    @classmethod
    def of(cls, seq: int, role: str, text: str, vector: np.ndarray | None) -> TurnInfo:
        words = len(_WORD.findall(text))
        text = pattern_text(text)  # only the patterns read it; the word count is the turn's as sent
        intro = "?" in text and bool(_INTRO.search(text))
        cues = (
            GREETING * bool(_GREETING.search(text))
            | CLOSING * bool(_CLOSING.search(text))
            | CONTINUES * bool(_CONTINUES.search(text))
            | REQUEST * bool(_REQUEST.search(text))
            | ANAPHORA * bool(_ANAPHORA.search(text))
            | ELLIPSIS * bool(_ELLIPSIS.search(text))
            | ENDS_TASK * (role == "user" and _ends_task(text))  # only a user ends a task
            | INTRO * intro
            | BACK * ("?" in text and not intro and bool(_BACK.search(text)))
        )
        vec = None if vector is None else np.asarray(vector, dtype=np.float32)
        return cls(seq, role, vec, words, "?" in text, cues)


def _ends_task(text: str) -> bool:
    """A thanks or goodbye that asks nothing more: no question, and no clause without a closing
    that asks or orders something ("Thanks. I also need a taxi to the station." goes on with the
    task)."""
    if "?" in text:
        return False
    text = _THANKS_TO.sub(" ", text)
    if not (_CLOSING.search(text) or _DONE.search(text)):
        return False
    for clause in _CLAUSE.split(text):
        if _CLOSING.search(clause) or _DONE.search(clause):
            continue
        if len(_WORD.findall(clause)) >= NEW_REQUEST_WORDS or _REQUEST.search(clause) or _ORDER.search(clause):
            return False
    return True


def _unit(rows: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero: its cosine with anything is 0)."""
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


def _depth(gaps: list[float], at: int) -> float:
    """TextTiling depth of gap `at`: how far its similarity dips below the highest gap on each side
    (within what the window lets us see)."""
    left, right = gaps[:at], gaps[at + 1 :]
    return (max(left) - gaps[at] if left else 0.0) + (max(right) - gaps[at] if right else 0.0)


def features(left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> np.ndarray:
    """Features of the candidate `window[0]` given up to `LEFT_CONTEXT` turns before it (`left`)
    and the turns after it seen so far (`window[1:]`). The candidate and at least one left turn
    have vectors. Cosines of block means are taken on block sums (the same direction), from
    running sums over the turns: one array pass instead of dozens of small ones per candidate."""
    cand, last, before = window[0], window[-1], left[-1]
    assert cand.vector is not None
    seq = np.asarray(
        [t.vector for t in left if t.vector is not None] + [t.vector for t in window if t.vector is not None],
        dtype=np.float64,
    )  # vector-bearing turns in order; gap g sits before seq[g]
    at = sum(1 for t in left if t.vector is not None)
    unit = _unit(seq)
    sums = np.vstack([np.zeros(seq.shape[1]), np.cumsum(seq, axis=0)])  # sums[b] - sums[a] = seq[a:b].sum()
    cand_u, last_u = unit[at], unit[-1]
    right = _unit(sums[-1] - sums[at])
    sims: list[float] = []
    for w in LEFT_WIDTHS:
        lw = _unit(sums[at] - sums[max(0, at - w)])
        sims += [float(lw @ cand_u), float(lw @ right), float(lw @ last_u)]
    gaps = range(max(1, at - 3), len(seq))
    adjacent = [float(unit[g - 1] @ unit[g]) for g in gaps]
    ends = len(seq)
    paired = [float(_unit(sums[g] - sums[max(0, g - 2)]) @ _unit(sums[min(ends, g + 2)] - sums[g])) for g in gaps]
    here = at - max(1, at - 3)
    q_before = float(before.question)
    return np.array(
        [
            *sims,
            float(cand_u @ last_u),
            _depth(adjacent, here),
            _depth(paired, here),
            q_before,
            float(cand.question),
            float(last.question),
            q_before * float(not cand.question),
            float(before.role == "user"),
            np.log1p(cand.words),
            np.log1p(before.words),
            np.log1p(last.words),
            float(cand.words < 3),
            float(before.words < 3),
            float(bool(cand.cues & GREETING)),
            float(any(t.cues & CLOSING for t in left[-2:])),
            float(bool(cand.cues & CLOSING)),
            float(bool(cand.cues & CONTINUES)),
            float(bool(cand.cues & REQUEST)),
            float(bool(cand.cues & ANAPHORA)),
            float(bool(cand.cues & ELLIPSIS)),
            float(bool(cand.cues & ANAPHORA) and cand.words <= SHORT_FOLLOW_UP),
            float(bool(cand.cues & INTRO)),
            float(bool(cand.cues & BACK)),
            # One bag reads both kinds of conversation: people shift topics otherwise than a bot's user.
            float(among_people(left, window)),
        ],
        dtype=np.float64,
    )


def stage_of(window: Sequence[TurnInfo]) -> str:
    if len(window) == 1:
        return "open"
    return "closed" if window[-1].role == "user" else "reply"


def model_input(stage: str, x: np.ndarray) -> np.ndarray:
    """One network serves every stage: the stage is a one-hot appended to the features."""
    return np.concatenate([x, [float(stage == "reply"), float(stage == "closed")]])


def bag_probability(mlps: Sequence[Mlp], x: np.ndarray) -> np.ndarray:
    """The mean probability of the bag's networks over rows `x`."""
    return np.mean([m.probability(x) for m in mlps], axis=0)


def closes_conversation(turn: TurnInfo) -> bool:
    """A user's thanks or goodbye that asks nothing more ("Thanks, that's all"): a task ended."""
    return turn.role == "user" and bool(turn.cues & ENDS_TASK)


def among_people(left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> bool:
    """No assistant turn in view: people talking with each other rather than with a bot."""
    return not any(t.role == "assistant" for t in (*left, *window))


class Bar(NamedTuple):
    """When the segmenter declares a shift: P(topic continues) below `threshold` once the window
    has closed, below it by `early_margin` before; and `fresh_margin` lower still while the episode
    holds a single user turn before the candidate."""

    threshold: float
    early_margin: float
    fresh_margin: float = 0.0


@dataclass(frozen=True)
class BoundaryScorer:
    # A bag of networks trained alike from different seeds: one network's decisions hung on its
    # seed by more than any feature moved them (docs/benchmarks.md), their mean much less.
    mlps: tuple[Mlp, ...]
    threshold: float  # the default `shift_threshold`: a shift when P(topic continues) falls below it
    early_margin: float  # an undecided window (open, reply) must be this much surer
    # The same two where no assistant is in view. A bot's user asks follow-ups that a scorer
    # trained on document-grounded sub-questions splits; people chatting shift topics otherwise.
    peer_threshold: float | None = None  # None: as `threshold`
    peer_margin: float | None = None  # None: as `early_margin`
    # How much surer a shift must be while the episode holds one user turn: among people a topic
    # of a single turn is rare (TIAGE train: 12% of such turns open one, against 24% after more).
    # Chosen by the trainer's cross-validation for each kind; 0 in weights trained before it.
    fresh_margin: float = 0.0
    peer_fresh_margin: float = 0.0
    # Among people, the pair model stacked with the bag (memory/boundary_pair.py), with its own bar.
    # It needs the encoder, which the composition root attaches (`with_encoder`): without one the
    # bag decides alone, with the bar above, exactly as before the pair model.
    pair: PairStack | None = None
    encoder: PairEncoder | None = None

    def with_encoder(self, encoder: PairEncoder | None) -> BoundaryScorer:
        return replace(self, encoder=encoder)

    def for_thread(self, thread_id: str) -> BoundaryScorer:
        """This scorer for one thread's turns: the pair model's answers are kept under it."""
        return self if self.encoder is None else replace(self, encoder=self.encoder.for_thread(thread_id))

    @property
    def reads_text(self) -> bool:
        """The segmenter must keep the turns' words in its state for this scorer."""
        return self.pair is not None and self.encoder is not None

    def _paired(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> bool:
        """The pair model reads this candidate: people talking, and the words at hand (a state kept
        before the words were reads as the bag alone until those turns leave it)."""
        return (
            self.reads_text
            and among_people(left, window)
            and window[0].text is not None
            and all(t.text is not None for t in left)
        )

    def boundary_probability(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> float:
        stage = stage_of(window)
        p = float(bag_probability(self.mlps, model_input(stage, features(left, window))[None, :])[0])
        if not self._paired(left, window):
            return p
        assert self.pair is not None and self.encoder is not None
        z = self.encoder.logit(context_text([t.text or "" for t in left]), candidate_text(window[0].text or ""))
        return self.pair.probability(p, z, stage == "closed")

    def bar(self, left: Sequence[TurnInfo], window: Sequence[TurnInfo]) -> Bar:
        """The bar for this candidate: the peers' when no assistant is in view."""
        if self._paired(left, window):
            assert self.pair is not None
            return Bar(self.pair.threshold, self.pair.early_margin, self.pair.fresh_margin)
        if among_people(left, window):
            return Bar(
                self.threshold if self.peer_threshold is None else self.peer_threshold,
                self.early_margin if self.peer_margin is None else self.peer_margin,
                self.peer_fresh_margin,
            )
        return Bar(self.threshold, self.early_margin, self.fresh_margin)

    def to_json(self, trained: dict[str, Any]) -> dict[str, Any]:
        return {
            "features": list(FEATURES),
            "stages": list(STAGES),
            "threshold": self.threshold,
            "early_margin": self.early_margin,
            "peer_threshold": self.peer_threshold,
            "peer_margin": self.peer_margin,
            "fresh_margin": self.fresh_margin,
            "peer_fresh_margin": self.peer_fresh_margin,
            "mlps": [m.to_json() for m in self.mlps],
            **({"pair": self.pair.to_json()} if self.pair is not None else {}),
            "trained": trained,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BoundaryScorer:
        if list(data["features"]) != list(FEATURES):
            raise ValueError("segmenter weights were trained on other features; retrain with `make train-segmenter`")
        mlps = tuple(Mlp.from_json(m) for m in data["mlps"])
        peer_threshold, peer_margin = data.get("peer_threshold"), data.get("peer_margin")
        return cls(
            mlps,
            float(data["threshold"]),
            float(data["early_margin"]),
            None if peer_threshold is None else float(peer_threshold),
            None if peer_margin is None else float(peer_margin),
            float(data.get("fresh_margin", 0.0)),
            float(data.get("peer_fresh_margin", 0.0)),
            PairStack.from_json(data["pair"]) if data.get("pair") else None,
        )


@lru_cache(maxsize=1)
def shipped_scorer() -> BoundaryScorer:
    text = resources.files("chatmem.memory").joinpath(WEIGHTS_FILE).read_text(encoding="utf-8")
    return BoundaryScorer.from_json(json.loads(text))
