"""`chatmem bench train-speakers`: fits the model that tells which of two speakers is a bot
(bench/speakers.py, shipped as `bench/speaker_weights.json`; `make train-segmenter` runs it).

Data: TIAGE train (two people: no side is a bot) and SuperDialseg validation's training part, the
same hash split as the segmenter's trainer (its user and agent, by the roles the file names; a
side is the agent when most of its turns are). Sides are the two alternating positions, as in
TIAGE's format. Each source weighs alike. Logistic regression by Newton's method, L2 `L2` on the
standardised inputs: no randomness, so a refit writes the same bytes. The bar is the highest
probability any TIAGE training dialogue gets, rounded up to the next `BAR_STEP`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from chatmem.bench.speakers import MIN_TURNS, WEIGHTS_FILE, SpeakerModel, side_inputs
from chatmem.bench.topicseg import Dialogue, load
from chatmem.bench.train_segmenter import fit_logistic, is_tune

L2 = 10.0
BAR_STEP = 0.05


def _sides(d: Dialogue) -> tuple[list[str], list[str], bool, bool]:
    """The two alternating sides' turns, and whether each is mostly the assistant's."""
    even, odd = d.texts[0::2], d.texts[1::2]

    def agent(roles: Sequence[str]) -> bool:
        return sum(r == "assistant" for r in roles) > len(roles) / 2

    return even, odd, agent(d.roles[0::2]), agent(d.roles[1::2])


def rows(dialogues: Sequence[Dialogue]) -> tuple[np.ndarray, np.ndarray]:
    """Two rows a dialogue whose sides are long enough to judge: each side against the other."""
    x, y = [], []
    for d in dialogues:
        even, odd, even_bot, odd_bot = _sides(d)
        if min(len(even), len(odd)) < MIN_TURNS:
            continue
        x += [side_inputs(even, odd), side_inputs(odd, even)]
        y += [even_bot, odd_bot]
    return np.array(x, dtype=float).reshape(-1, len(side_inputs(["a"], ["b"]))), np.array(y, dtype=float)


def fit(people: Sequence[Dialogue], with_bots: Sequence[Dialogue]) -> tuple[SpeakerModel, dict]:
    """The model and what it scores on its own training data. `people` are read as people
    whatever their roles say."""
    xp, _ = rows(people)
    xb, yb = rows(with_bots)
    x = np.vstack([xp, xb])
    y = np.concatenate([np.zeros(len(xp)), yb])
    weight = np.concatenate([np.full(len(xp), len(xb) / max(len(xp), 1)), np.ones(len(xb))])
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = np.column_stack([(x - mean) / scale, np.ones(len(x))])
    weights = fit_logistic(z, y, L2, weight)
    model = SpeakerModel(mean, scale, weights, 1.0)
    people_max = max((max(model.probability(a, b), model.probability(b, a)) for *_, a, b in _pairs(people)), default=0)
    bar = math.ceil(people_max / BAR_STEP) * BAR_STEP
    model = SpeakerModel(mean, scale, weights, round(bar, 4))
    found = [_found(model, d) for d in with_bots]
    summary = {
        "dialogues": {"people": len(people), "with_a_bot": len(with_bots)},
        "people_highest": round(people_max, 4),
        "with_a_bot_found": round(sum(f is not None for f in found) / max(len(found), 1), 4),
        "with_a_bot_side_right": round(sum(bool(f) for f in found) / max(len(found), 1), 4),
    }
    return model, summary


def _pairs(dialogues: Sequence[Dialogue]) -> list[tuple[Dialogue, list[str], list[str]]]:
    sides = [(d, d.texts[0::2], d.texts[1::2]) for d in dialogues]
    return [(d, a, b) for d, a, b in sides if min(len(a), len(b)) >= MIN_TURNS]


def _found(model: SpeakerModel, d: Dialogue) -> bool | None:
    """None when no bot is read; else whether the side read is the one that is mostly the agent."""
    even, odd, even_bot, _ = _sides(d)
    bot = model.bot_of({"even": even, "odd": odd})
    return None if bot is None else (bot == "even") == even_bot


def shipped_weights_path() -> Path:
    return Path(__file__).with_name(WEIGHTS_FILE)


def run(data_dir: Path, out: Path | None, say: Callable[[str], None]) -> SpeakerModel:
    out = out or shipped_weights_path()
    people = load(data_dir / "anno_train.json", speakers=None)
    with_bots = [d for d in load(data_dir / "superseg_validation.defdts.jsonl", speakers=None) if not is_tune(d.id)]
    model, summary = fit(people, with_bots)
    out.write_text(json.dumps(model.to_json(summary), separators=(",", ":")) + "\n")
    say(
        f"wrote {out}: bar {model.bar} (TIAGE train's highest {summary['people_highest']}); "
        f"SuperDialseg's training part read with a bot {summary['with_a_bot_found']:.1%}, "
        f"the agent's side {summary['with_a_bot_side_right']:.1%}"
    )
    return model
