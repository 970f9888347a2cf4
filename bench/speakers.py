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
(bench/train_speakers.py). A side needs a few turns before it is judged."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

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


def side_style(turns: Sequence[str]) -> np.ndarray:
    """A side's rates: the share of its turns that match each pattern, and log(1 + mean words)."""
    n = max(len(turns), 1)
    rates = [sum(bool(p.search(t)) for t in turns) / n for p in STYLE.values()]
    words = sum(len(t.split()) for t in turns) / n
    return np.array([*rates, math.log1p(words)])


def side_inputs(own: Sequence[str], other: Sequence[str]) -> np.ndarray:
    a, b = side_style(own), side_style(other)
    return np.concatenate([a, b, a - b])


@dataclass(frozen=True)
class SpeakerModel:
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray  # one per input, then the constant
    bar: float

    def probability(self, own: Sequence[str], other: Sequence[str]) -> float:
        """P(the speaker of `own` is a bot), the other speaker having said `other`."""
        z = (side_inputs(own, other) - self.mean) / self.scale
        return 1.0 / (1.0 + math.exp(-float(np.clip(z @ self.weights[:-1] + self.weights[-1], -30, 30))))

    def bot_of(self, sides: Mapping[str, Sequence[str]]) -> str | None:
        """The speaker of two who reads as a bot, or None: not two speakers, a side too short to
        judge, or neither above the bar."""
        if len(sides) != 2 or any(len(turns) < MIN_TURNS for turns in sides.values()):
            return None
        (a, ta), (b, tb) = sides.items()
        pa, pb = self.probability(ta, tb), self.probability(tb, ta)
        best, p = (a, pa) if pa >= pb else (b, pb)
        return best if p > self.bar else None

    def roles_by_parity(self, texts: Sequence[str]) -> list[str]:
        """Roles of alternating speakers (TIAGE's format): a bot's turns are the assistant's."""
        bot = self.bot_of({"even": texts[0::2], "odd": texts[1::2]})
        return ["assistant" if bot == ("even" if i % 2 == 0 else "odd") else "user" for i in range(len(texts))]

    def to_json(self, summary: dict | None = None) -> dict:
        return {
            "inputs": list(INPUTS),
            "mean": self.mean.round(6).tolist(),
            "scale": self.scale.round(6).tolist(),
            "weights": self.weights.round(6).tolist(),
            "bar": self.bar,
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
        )


@lru_cache(maxsize=1)
def shipped_speakers() -> SpeakerModel:
    return SpeakerModel.from_json(json.loads(resources.files("chatmem.bench").joinpath(WEIGHTS_FILE).read_text()))
