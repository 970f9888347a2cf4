"""Which of two speakers is a bot, read from how each one talks, for dialogue files that do not say.

TIAGE's format names no speaker (they alternate), and a Def-DTS file may name its two speakers
"A" and "B". Read as two people, a booking conversation splits at nearly every agent turn, since
only a user's turn is a candidate boundary and the people's pair model, trained on chit-chat,
reads every turn (docs/benchmarks.md, "A bot's conversations without roles"). A live thread
always knows its roles: a bot adapter marks the bot's messages. This reads them back for files.

A side is one speaker's turns. Its style is a handful of rates over them: questions, "I" and
"you", requests, offers ("would you like", "you're welcome"), thanks, digits, "we",
exclamations, and its mean length. A logistic model reads a side's rates, the other side's and
their difference, and gives the probability that the side is a bot. It learns from the TIAGE
training dialogues (two people: neither side) and from SuperDialseg's training part (a user and
a support agent), and its bar is set above every TIAGE training dialogue, so that no
conversation among the people it learned from reads as having a bot
(bench/train_speakers.py). A side needs a few turns before it is judged.

Named speakers are sides by name. Where a file names none, its speakers alternate, but a file of
conversations joined one after another changes who speaks at even positions wherever a
conversation ended on the user's turn. So the positions are read turn by turn: the model over
the few turns around each one says which position is the bot there, the likeliest sequence of
those readings (a change is rare) marks the bot's turns. A window finds a change a few turns late,
so each one is then moved to where the user closed a task and spoke again, if that lies within
the window; and where a user's closing is followed by a request read as the bot's, the positions
change there too. The model then reads the bot's turns against the rest as one side each.

A file is one corpus. Where most of its dialogues read as conversations with a bot, every dialogue
of it is read with its bot, also one whose turns say too little to pass the bar on their own."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from chatmem.memory.boundary_pair import sigmoid
from chatmem.memory.boundary_scorer import CLOSING, TurnInfo, closes_conversation
from chatmem.memory.text import pattern_text

WEIGHTS_FILE = "speaker_weights.json"
MIN_TURNS = 3  # a side of one or two turns says too little about who speaks

# English, with the Russian forms the segmenter's cues also read.
STYLE = {
    "question_end": re.compile(r"\?\s*$"),
    "question": re.compile(r"\?"),
    "i": re.compile(r"\b(i|i'm|im|i've|i'd|i'll|my|me|mine|myself|я|мне|меня|мой|моя|моё|мои)\b", re.I),
    "you": re.compile(r"\b(you|your|you're|yours|yourself|you'll|you'd|you've|вы|вам|вас|ваш|ваша|ваши)\b", re.I),
    "request": re.compile(
        r"^\W*(hi|hello|hey)?\W*(i need|i want|i'd like|i would like|i'm looking|i am looking|i'm trying|can you|"
        r"could you|can i|could i|would you|find|show|tell me|give me|set|remind|book|get me|what|where|when|which|"
        r"how|is there|are there|do you have|please|мне нужно|мне нужен|подскажите|найди|где|когда|какой|как)\b",
        re.I,
    ),
    "offer": re.compile(
        r"(would you like|anything else|else i can|you're welcome|you are welcome|glad to help|happy to help|"
        r"how can i help|how may i help|i can help|let me|i have booked|i've booked|booked|reference|you can|you may|"
        r"you will|you need to|you should|there are|there is|there's|i found|i have found|i'd recommend|i recommend|"
        r"чем могу помочь|что-нибудь ещё|пожалуйста|вы можете)",
        re.I,
    ),
    "thanks": re.compile(r"\b(thanks|thank you|thx|cheers|спасибо)\b", re.I),
    "digit": re.compile(r"\d"),
    "we": re.compile(r"\b(we|our|us|мы|нас|наш)\b", re.I),
    "exclamation": re.compile(r"!"),
}
FEATURES = (*STYLE, "length")
INPUTS = tuple(f"{where}_{f}" for where in ("own", "other", "difference") for f in FEATURES)
CHANGE = 0.01  # chance that the two positions change speakers at a turn (a conversation ended on the user)


def turn_style(texts: Sequence[str]) -> np.ndarray:
    """One row a turn: whether it matches each pattern, and its word count."""
    rows = [[bool(p.search(pattern_text(t))) for p in STYLE.values()] + [len(t.split())] for t in texts]
    return np.array(rows, dtype=float).reshape(-1, len(FEATURES))


def side_style(rows: np.ndarray) -> np.ndarray:
    """A side's rates: the share of its turns that match each pattern, and log(1 + mean words)."""
    mean = rows.sum(axis=0) / max(len(rows), 1)
    return np.array([*mean[:-1], math.log1p(mean[-1])])


def side_inputs(own: Sequence[str], other: Sequence[str]) -> np.ndarray:
    return _inputs(turn_style(own), turn_style(other))


def _inputs(own: np.ndarray, other: np.ndarray) -> np.ndarray:
    a, b = side_style(own), side_style(other)
    return np.concatenate([a, b, a - b])


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class SpeakerModel:
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray  # one per input, then the constant
    bar: float
    window: int = 0  # turns each way that give a position's local reading; 0: the whole dialogue

    def _p(self, own: np.ndarray, other: np.ndarray) -> float:
        z = (_inputs(own, other) - self.mean) / self.scale
        return sigmoid(float(z @ self.weights[:-1] + self.weights[-1]))

    def probability(self, own: Sequence[str], other: Sequence[str]) -> float:
        """P(the speaker of `own` is a bot), the other speaker having said `other`."""
        return self._p(turn_style(own), turn_style(other))

    def side_reading(self, sides: Mapping[str, Sequence[str]]) -> tuple[str, float] | None:
        """The speaker of two who reads more like a bot, and P of that, before the bar; None when
        there are not two speakers or a side is too short to judge."""
        if len(sides) != 2 or any(len(turns) < MIN_TURNS for turns in sides.values()):
            return None
        (a, ta), (b, tb) = sides.items()
        pa, pb = self.probability(ta, tb), self.probability(tb, ta)
        return (a, pa) if pa >= pb else (b, pb)

    def bots_of(self, dialogues: Sequence[Mapping[str, Sequence[str]]]) -> list[str | None]:
        """Per dialogue of one file (its speakers' turns), the speaker who is a bot, or None: as
        `side_reading` reads it, above the bar, or anywhere in a file of bots' conversations."""
        reads = [self.side_reading(sides) for sides in dialogues]
        of_bots = self.of_bots([r[1] for r in reads if r is not None])
        return [r[0] if r is not None and (of_bots or r[1] > self.bar) else None for r in reads]

    def of_bots(self, probabilities: Sequence[float]) -> bool:
        """Whether a file is a corpus of conversations with a bot: most of the dialogues that can
        be read are read with one. A file is one corpus, so then the rest have a bot too, even where
        their turns say too little to pass the bar (a short conversation, a quiet agent). Among
        people no TIAGE dialogue passes the bar, so their files stay people's."""
        return sum(p > self.bar for p in probabilities) > len(probabilities) / 2

    def position_reading(self, texts: Sequence[str]) -> tuple[np.ndarray, float] | None:
        """Speakers that alternate (TIAGE's format) but may change places where a conversation
        ended on the user: which turns read as the bot's, and P of that side, before the bar.

        Each turn's local reading is the model over the turns within `window` of it, by position;
        the most likely sequence of readings (a change costs `CHANGE`) marks the bot's turns, with
        its changes placed where a user closed a task (`at_closings`, `at_new_requests`); the model
        then reads those turns against the rest. None when a side is too short."""
        n = len(texts)
        rows = turn_style(texts)
        even = np.arange(n) % 2 == 0
        if min(even.sum(), (~even).sum()) < MIN_TURNS:
            return None
        if self.window == 0:
            p_even, p_odd = self._p(rows[even], rows[~even]), self._p(rows[~even], rows[even])
            return (even, p_even) if p_even >= p_odd else (~even, p_odd)
        lean = np.zeros(n)  # > 0: the even positions read as the bot's here
        for i in range(n):
            lo, hi = max(0, i - self.window), min(n, i + self.window + 1)
            e, o = rows[lo:hi][even[lo:hi]], rows[lo:hi][~even[lo:hi]]
            if min(len(e), len(o)) >= 2:
                lean[i] = _logit(self._p(e, o)) - _logit(self._p(o, e))
        after = _after_closings(texts)  # read once for both moves
        bot = even == _viterbi(lean, CHANGE)
        bot = at_new_requests(texts, at_closings(texts, bot, self.window, after), after)
        if min(bot.sum(), (~bot).sum()) < MIN_TURNS:
            return None
        return bot, self._p(rows[bot], rows[~bot])

    def roles_by_position(self, texts: Sequence[str]) -> list[str]:
        """Roles where the file names no speaker: a bot's turns are the assistant's."""
        return self._roles(texts, self.position_reading(texts), of_bots=False)

    def file_roles_by_position(self, dialogues: Sequence[Sequence[str]]) -> list[list[str]]:
        """`roles_by_position` for every dialogue of one file, where a file of bots'
        conversations (`of_bots`) reads its bot in each dialogue, above the bar or not."""
        reads = [self.position_reading(texts) for texts in dialogues]
        of_bots = self.of_bots([r[1] for r in reads if r is not None])
        return [self._roles(texts, read, of_bots) for texts, read in zip(dialogues, reads, strict=True)]

    def _roles(self, texts: Sequence[str], read: tuple[np.ndarray, float] | None, of_bots: bool) -> list[str]:
        if read is None or (read[1] <= self.bar and not of_bots):
            return ["user"] * len(texts)
        return ["assistant" if b else "user" for b in read[0]]

    def to_json(self, summary: dict | None = None) -> dict:
        return {
            "inputs": list(INPUTS),
            "mean": self.mean.round(6).tolist(),
            "scale": self.scale.round(6).tolist(),
            "weights": self.weights.round(6).tolist(),
            "bar": self.bar,
            "window": self.window,
            **({"summary": summary} if summary else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> SpeakerModel:
        if list(data["inputs"]) != list(INPUTS):
            raise ValueError("speaker weights were read from other inputs; retrain with `make train-segmenter`")
        return cls(
            np.array(data["mean"], dtype=float),
            np.array(data["scale"], dtype=float),
            np.array(data["weights"], dtype=float),
            float(data["bar"]),
            int(data["window"]),
        )


@lru_cache(maxsize=1)
def shipped_speakers() -> SpeakerModel:
    return SpeakerModel.from_json(
        json.loads(resources.files("chatmem.bench").joinpath(WEIGHTS_FILE).read_text(encoding="utf-8"))
    )


def at_closings(
    texts: Sequence[str], bot: np.ndarray, reach: int, after_closing: Sequence[bool] | None = None
) -> np.ndarray:
    """`bot` with each change of places moved to the nearest turn, within `reach` either way and
    short of the changes beside it, that follows a user's closing (a thanks or goodbye that asks
    nothing more, as the segmenter reads one) and is no closing reply itself. There the user
    spoke twice: one conversation ended on the user and the next began. A window's reading finds
    such a change a turn or a few late, on the turn that opens the next conversation.
    `after_closing`: `_after_closings(texts)`, when already read."""
    n = len(texts)
    if n < 2:
        return bot
    even = np.arange(n) % 2 == 0
    state = even == bot  # True where the even positions are the bot's
    after_closing = _after_closings(texts) if after_closing is None else after_closing
    changes = [i for i in range(1, n) if state[i] != state[i - 1]]
    bounds = [0, *changes, n]
    for k, at in enumerate(changes):
        lo, hi = max(bounds[k] + 1, at - reach), min(bounds[k + 2] - 1, at + reach)
        near = [c for c in range(lo, hi + 1) if after_closing[c]]
        if not near:
            continue
        to = min(near, key=lambda c: (abs(c - at), c))
        before, after = state[at - 1], state[at]
        state[min(at, to) : max(at, to)] = after if to < at else before
        bounds[k + 1] = to
    return even == state


def at_new_requests(texts: Sequence[str], bot: np.ndarray, after_closing: Sequence[bool] | None = None) -> np.ndarray:
    """`bot` with the positions changed from each turn read as the bot's that follows a user's
    closing, asks for something and offers nothing (`STYLE`'s request and offer), up to the
    reading's next change. The user spoke twice there. Two conversations ended on the user a few
    turns apart change places twice within one window, which the reading cannot tell apart from
    no change at all. `after_closing`: `_after_closings(texts)`, when already read."""
    after_closing = _after_closings(texts) if after_closing is None else after_closing
    bot = bot.copy()
    even = np.arange(len(texts)) % 2 == 0
    for i in range(1, len(texts)):
        if not (after_closing[i] and bot[i] and not bot[i - 1]):
            continue
        text = pattern_text(texts[i])
        if not STYLE["request"].search(text) or STYLE["offer"].search(text):
            continue
        state = even == bot
        end = next((j for j in range(i + 1, len(texts)) if state[j] != state[j - 1]), len(texts))
        bot[i:end] = ~bot[i:end]
    return bot


def _after_closings(texts: Sequence[str]) -> list[bool]:
    """Whether each turn follows a user's closing (a thanks or goodbye that asks nothing more, as
    the segmenter reads one) and is no closing reply itself."""
    turns = [TurnInfo.of(i, "user", t, None) for i, t in enumerate(texts)]
    return [False] + [closes_conversation(turns[i - 1]) and not turns[i].cues & CLOSING for i in range(1, len(texts))]


def _viterbi(lean: np.ndarray, change: float) -> np.ndarray:
    """The likeliest sequence of two states (True: the even positions are the bot's) given each
    turn's log-odds `lean` for True, changing state with probability `change`."""
    n = len(lean)
    stay, move = math.log(1 - change), math.log(change)
    score = np.array([lean[0] / 2, -lean[0] / 2])  # [True, False]
    back = np.zeros((n, 2), dtype=int)
    for i in range(1, n):
        to_true = (score[0] + stay, score[1] + move)
        to_false = (score[0] + move, score[1] + stay)
        back[i] = (int(np.argmax(to_true)), int(np.argmax(to_false)))
        score = np.array([max(to_true) + lean[i] / 2, max(to_false) - lean[i] / 2])
    state = int(np.argmax(score))
    path = np.zeros(n, dtype=int)
    for i in range(n - 1, -1, -1):
        path[i] = state
        state = back[i][state]
    return path == 0
