"""`chatmem bench train-speakers`: fits the model that tells which of two speakers is a bot
(bench/speakers.py, shipped as `bench/speaker_weights.json`; `make train-segmenter` runs it).

Data: TIAGE train (two people: no side is a bot) and SuperDialseg validation's training part, the
same hash split as the segmenter's trainer (its user and agent, by the roles the file names; a
side is the agent when most of its turns are). Sides are the two alternating positions, as in
TIAGE's format. Each source weighs alike. Logistic regression by Newton's method, L2 `L2` on the
standardised inputs: no randomness, so a refit writes the same bytes.

A file's positions are then read turn by turn (`SpeakerModel.position_reading`: each turn's
window of turns by position, the likeliest sequence of readings), so that a concatenation whose
conversation ended on the user, and whose positions then change speakers, is still read. The bar
of a window is the highest probability any TIAGE training dialogue gets when read that way,
rounded up to the next `BAR_STEP`. The window is the smallest of `WINDOWS` whose bar is no higher
than reading each dialogue whole (window 0): a smaller window finds a lopsided path through some
people's chat and needs a higher bar."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from chatmem.bench.speakers import INPUTS, MIN_TURNS, WEIGHTS_FILE, SpeakerModel, side_inputs
from chatmem.bench.topicseg import Dialogue, load
from chatmem.bench.train_segmenter import fit_logistic, is_tune

L2 = 10.0
BAR_STEP = 0.05
WINDOWS = (2, 3, 4, 5, 6, 7, 8)


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
    return np.array(x, dtype=float).reshape(-1, len(INPUTS)), np.array(y, dtype=float)


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
    # The bar of each window: above every people's dialogue read that way. The window is the
    # smallest whose bar is no higher than the whole dialogue's, so that reading turn by turn
    # finds no bot among people that reading the whole dialogue would not.
    highest = {w: _highest(SpeakerModel(mean, scale, weights, 1.0, w), people) for w in (0, *WINDOWS)}
    bars = {w: round(math.ceil(h / BAR_STEP) * BAR_STEP, 4) for w, h in highest.items()}
    window = next((w for w in WINDOWS if bars[w] <= bars[0]), 0)
    model = SpeakerModel(mean, scale, weights, bars[window], window)
    found = [_found(model, d) for d in with_bots]
    summary = {
        "dialogues": {"people": len(people), "with_a_bot": len(with_bots)},
        "people_highest": {str(w): round(h, 4) for w, h in highest.items()},
        "with_a_bot_found": round(sum(f is not None for f in found) / max(len(found), 1), 4),
        "with_a_bot_turns_right": round(sum(f or 0.0 for f in found) / max(len(found), 1), 4),
    }
    return model, summary


def _highest(model: SpeakerModel, people: Sequence[Dialogue]) -> float:
    return max((r[1] for d in people if (r := model.position_reading(d.texts)) is not None), default=0.0)


def _found(model: SpeakerModel, d: Dialogue) -> float | None:
    """None when no bot is read; else the share of turns whose role is read right."""
    roles = model.roles_by_position(d.texts)
    if "assistant" not in roles:
        return None
    return sum(a == b for a, b in zip(roles, d.roles, strict=True)) / len(roles)


def shipped_weights_path() -> Path:
    return Path(__file__).with_name(WEIGHTS_FILE)


def run(data_dir: Path, out: Path | None, say: Callable[[str], None]) -> SpeakerModel:
    out = out or shipped_weights_path()
    people = load(data_dir / "anno_train.json", speakers=None)
    with_bots = [d for d in load(data_dir / "superseg_validation.defdts.jsonl", speakers=None) if not is_tune(d.id)]
    model, summary = fit(people, with_bots)
    out.write_text(json.dumps(model.to_json(summary), separators=(",", ":")) + "\n", encoding="utf-8")
    say(
        f"wrote {out}: window {model.window}, bar {model.bar} (TIAGE train's highest by window: "
        + ", ".join(f"{w} {h}" for w, h in summary["people_highest"].items())
        + f"); SuperDialseg's training part read with a bot {summary['with_a_bot_found']:.1%}, "
        f"its turns' roles right {summary['with_a_bot_turns_right']:.1%}"
    )
    return model
