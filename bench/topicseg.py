"""`chatmem bench topicseg`: the workers' segmenter on dialogue topic-segmentation data, next to
the rule-based segmenter it replaced (bench/topicseg_rules.py) as the baseline.

Reads TIAGE (`.json`: id -> [[utterance, label], ...]) and Def-DTS (`.jsonl`: {id, dialogue} with
`role: text` lines joined by [NEWLINE] and a [BOUNDARY] line after each segment). Each dialogue is
one thread with no time gaps. A Def-DTS speaker named like a bot or a support agent ("agent",
"system", "assistant", ...) is the thread's assistant; any other speaker is a user, as the history
importers count every author not named as the bot's. A file that names no bot (TIAGE's format,
whose speakers alternate, or a Def-DTS file of two speakers such as "A:" and "B:") has its bot
read from how each speaker talks (bench/speakers.py): when one of the two reads as a bot, its
turns are the assistant's, else both are people chatting. So does a Def-DTS file whose names only
follow the positions ("user", "agent", "user", ... in every dialogue, as a copy of a corpus that
never recorded its speakers names them): it is read as TIAGE's positions are. A file is one
corpus: where most of its dialogues read as a bot's conversations, each of them is read with its
bot. A line with no short speaker name before a colon is all text, said by a person. Scores follow
the SuperDialseg protocol: per utterance `ends_segment` (the last utterance is always 0); Pk and
WindowDiff as in NLTK with k = max(2, round(n / (boundaries + 1) / 2)); binary F1 (0 when
undefined); each averaged over dialogues; Score = 0.5·F1 + 0.25·(1 − Pk) + 0.25·(1 − WD). Each
Score comes with its bootstrap interval over the dialogues, and the learned segmenter's lead over
the rules with the interval of the paired difference (bench/stats.py).

With an assist (`--llm-assist`: the segmenter's LLM assist over the configured endpoint,
memory/boundary_llm.py) the learned segmenter also runs with it, as `learned+llm`; with other
weights (`--weights`, a retrain) it also runs with them, as `candidate`."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np

from chatmem.bench import topicseg_rules
from chatmem.bench.speakers import SpeakerModel, shipped_speakers
from chatmem.bench.stats import Interval, bootstrap
from chatmem.memory.ports import Embedder
from chatmem.memory.segmentation import BoundaryAssist, Scorer, SegmenterConfig, SegTurn, segment


@dataclass(frozen=True)
class Dialogue:
    id: str
    roles: list[str]
    texts: list[str]
    ends_segment: list[int]


def load(path: Path, speakers: SpeakerModel | Literal["shipped"] | None = "shipped") -> list[Dialogue]:
    """The file's dialogues; `speakers` reads which speaker is a bot where the file does not say
    (None: nobody is, the file as written)."""
    model = shipped_speakers() if speakers == "shipped" else speakers
    if path.suffix == ".jsonl":
        rows = [
            _defdts_lines(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
        by_position = model is not None and names_follow_positions([r.names for r in rows])
        return _defdts(rows, model, by_position)
    return _tiage(json.loads(path.read_text(encoding="utf-8")), model)


def names_follow_positions(names: list[list[str]]) -> bool:
    """Whether a file's speaker names say no more than the positions do: every dialogue has two
    named speakers who take strict turns. A copy made from a corpus that never recorded who spoke
    names them that way ("user", "agent", "user", ...), and such names are wrong wherever a joined
    conversation ended on the user, or wherever the two are people. A file that records its
    speakers has a speaker who says two things in a row somewhere."""
    return any(len(set(n)) == 2 for n in names) and all(
        len(set(n)) <= 2 and "" not in n and all(a != b for a, b in zip(n, n[1:], strict=False)) for n in names
    )


# Speaker names that the dialogue corpora in this format give a bot, a system or a support agent
# (in English and Russian, the languages of the segmenter's cues).
ASSISTANT_NAMES = frozenset(
    {"agent", "assistant", "system", "sys", "bot", "chatbot", "ai", "model", "gpt", "wizard", "operator", "support"}
    | {"агент", "ассистент", "система", "бот", "оператор", "поддержка"}
)
MAX_SPEAKER_WORDS = 3  # "customer service agent"; a longer head before a colon is part of what was said
_NAME_WORD = re.compile(r"[^\W\d_]+")  # letters: "agent1", "System 2", "travel_agent", "Бот"


def speaker_role(name: str) -> str:
    """The thread role of a speaker named `name` in a Def-DTS line."""
    return "assistant" if any(w in ASSISTANT_NAMES for w in _NAME_WORD.findall(name.lower())) else "user"


def _tiage(data: dict, speakers: SpeakerModel | None) -> list[Dialogue]:
    texts = [[t[0] for t in turns] for turns in data.values()]
    # Two speakers alternating: people chatting, unless one of them talks like a bot.
    roles = speakers.file_roles_by_position(texts) if speakers is not None else [["user"] * len(t) for t in texts]
    out = []
    for (did, turns), said, role in zip(data.items(), texts, roles, strict=True):
        starts = [str(t[1]) == "1" for t in turns]
        ends = [1 if i + 1 < len(turns) and starts[i + 1] else 0 for i in range(len(turns))]
        out.append(Dialogue(did, role, said, ends))
    return out


@dataclass(frozen=True)
class _Lines:
    id: str
    names: list[str]  # as written, lower case; "" for a line with no speaker
    texts: list[str]
    ends: list[int]


def _defdts_lines(row: dict) -> _Lines:
    names: list[str] = []
    texts: list[str] = []
    ends: list[int] = []
    for line in row["dialogue"].split("[NEWLINE]"):
        line = line.strip()
        if line == "[BOUNDARY]":
            if ends:
                ends[-1] = 1
            continue
        if not line:
            continue
        role, colon, text = line.partition(":")
        if not colon or len(role.split()) > MAX_SPEAKER_WORDS:
            role, text = "", line  # no speaker named: the whole line is what was said, by a person
        names.append(role.strip().lower())
        texts.append(text.strip())
        ends.append(0)
    if ends:
        ends[-1] = 0
    return _Lines(str(row["id"]), names, texts, ends)


def _defdts(rows: list[_Lines], speakers: SpeakerModel | None, by_position: bool) -> list[Dialogue]:
    if speakers is not None and by_position:  # the names are positions: read them as TIAGE's are
        roles = speakers.file_roles_by_position([r.texts for r in rows])
        return [Dialogue(r.id, role, r.texts, r.ends) for r, role in zip(rows, roles, strict=True)]
    roles = [[speaker_role(name) for name in r.names] for r in rows]
    unnamed = [i for i, role in enumerate(roles) if "assistant" not in role]
    if speakers is not None and unnamed:
        sides: list[dict[str, list[str]]] = []
        for i in unnamed:
            sides.append({})
            for name, text in zip(rows[i].names, rows[i].texts, strict=True):
                if name:  # a line with no speaker is a person's
                    sides[-1].setdefault(name, []).append(text)
        for i, bot in zip(unnamed, speakers.bots_of(sides), strict=True):
            if bot is not None:
                roles[i] = [
                    "assistant" if name == bot else role for name, role in zip(rows[i].names, roles[i], strict=True)
                ]
    return [Dialogue(r.id, role, r.texts, r.ends) for r, role in zip(rows, roles, strict=True)]


def predict(
    dialogue: Dialogue,
    vectors: np.ndarray,
    segmenter: str = "learned",
    assist: BoundaryAssist | None = None,
    scorer: Scorer | None = None,
    config: SegmenterConfig | None = None,
) -> list[int]:
    """`learned`: the workers' segmenter with `scorer` (None: the shipped bag alone) and its
    default settings; `learned+llm`: the same with `assist`; `candidate`: the same with `config`
    (other settings); `rules`: the baseline."""
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    turns = [
        SegTurn(i, role, text, t0 + timedelta(seconds=i), vectors[i])
        for i, (role, text) in enumerate(zip(dialogue.roles, dialogue.texts, strict=True))
    ]
    if segmenter == "rules":
        bounds = topicseg_rules.segment(turns, topicseg_rules.RulesConfig())
    else:
        bounds = segment(
            turns,
            config if segmenter == "candidate" and config is not None else SegmenterConfig(),
            scorer=scorer,
            assist=assist if segmenter == "learned+llm" else None,
        )
    ends = [0] * len(turns)
    for b in bounds:
        if 0 < b.seq < len(turns):
            ends[b.seq - 1] = 1
    if ends:
        ends[-1] = 0
    return ends


def pk(ref: list[int], hyp: list[int], k: int) -> float:
    n = len(ref)
    windows = n - k + 1
    errors = sum((sum(ref[i : i + k]) > 0) != (sum(hyp[i : i + k]) > 0) for i in range(windows))
    return errors / windows


def windowdiff(ref: list[int], hyp: list[int], k: int) -> float:
    n = len(ref)
    windows = n - k + 1
    return sum(min(1, abs(sum(ref[i : i + k]) - sum(hyp[i : i + k]))) for i in range(windows)) / windows


def f1(ref: list[int], hyp: list[int]) -> float:
    tp = sum(1 for r, h in zip(ref, hyp, strict=True) if r and h)
    fp = sum(1 for r, h in zip(ref, hyp, strict=True) if h and not r)
    fn = sum(1 for r, h in zip(ref, hyp, strict=True) if r and not h)
    if tp == 0:
        return 0.0
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall)


def window_k(ref: list[int]) -> int:
    return min(len(ref), max(2, round(len(ref) / (sum(ref) + 1) / 2)))


def combined(pk_: float, wd: float, f1_: float) -> float:
    return 0.5 * f1_ + 0.25 * (1 - pk_) + 0.25 * (1 - wd)


@dataclass(frozen=True)
class Scores:
    pk: float
    wd: float
    f1: float
    # Each scored dialogue's own Score, in order: Score is linear in the three means, so it is
    # the mean of these, and they are what an interval resamples.
    dialogues: tuple[float, ...] = ()

    @property
    def score(self) -> float:
        return combined(self.pk, self.wd, self.f1)

    def interval(self) -> Interval:
        return bootstrap(self.dialogues)


def evaluate(refs: list[list[int]], hyps: list[list[int]]) -> Scores:
    pks, wds, f1s = [], [], []
    for ref, hyp in zip(refs, hyps, strict=True):
        if len(ref) < 2:
            continue
        k = window_k(ref)
        pks.append(pk(ref, hyp, k))
        wds.append(windowdiff(ref, hyp, k))
        f1s.append(f1(ref, hyp))
    if not pks:
        return Scores(float("nan"), float("nan"), float("nan"))
    per = tuple(combined(*x) for x in zip(pks, wds, f1s, strict=True))
    return Scores(float(np.mean(pks)), float(np.mean(wds)), float(np.mean(f1s)), per)


def embed_all(dialogues: list[Dialogue], embedder: Embedder) -> list[np.ndarray]:
    flat = [t for d in dialogues for t in d.texts]
    vectors = embedder.embed(flat)
    out, pos = [], 0
    for d in dialogues:
        out.append(vectors[pos : pos + len(d.texts)])
        pos += len(d.texts)
    return out


def run(
    data: Path,
    out: Path | None,
    embedder: Embedder,
    baseline: bool,
    assist: BoundaryAssist | None = None,
    candidate: Scorer | None = None,
    candidate_config: SegmenterConfig | None = None,
    learned: Scorer | None = None,
    ms_a_message: dict[str, float] | None = None,
    as_written: bool = False,
) -> dict[str, Scores]:
    """Scores of the learned segmenter with the workers' scorer `learned` (its predictions go to
    `out`), with `assist` also of the learned segmenter with it (then its predictions go to `out`),
    with `candidate` or `candidate_config` also of the segmenter with those weights or settings,
    when `learned` reads the words (the pair model) also of the bag alone (`bag`, the segmenter
    before the pair model), and with `baseline` of the rule-based one, all on the same vectors and
    dialogues, so any two compare pairwise. `ms_a_message`, if given, gets each segmenter's time a
    message, the vectors being computed before: the segment step's own cost. `as_written` reads no
    bot from the words: a speaker the file does not name as one is a person."""
    dialogues = load(data, speakers=None if as_written else "shipped")
    vectors = embed_all(dialogues, embedder)
    scores: dict[str, Scores] = {}
    first = "learned+llm" if assist is not None else "learned"
    scorer_of: dict[str, Scorer | None] = {
        "learned+llm": learned,
        "candidate": candidate or learned,
        "learned": learned,
        "bag": None,
        "rules": None,
    }
    segmenters = [
        *(["learned+llm"] if assist is not None else []),
        *(["candidate"] if candidate is not None or candidate_config is not None else []),
        "learned",
        *(["bag"] if getattr(learned, "reads_text", False) else []),
        *(["rules"] if baseline else []),
    ]
    for segmenter in segmenters:
        started = time.perf_counter()
        hyps = [
            predict(d, v, segmenter, assist, scorer_of[segmenter], candidate_config)
            for d, v in zip(dialogues, vectors, strict=True)
        ]
        if ms_a_message is not None:
            messages = max(sum(len(d.texts) for d in dialogues), 1)
            ms_a_message[segmenter] = 1000 * (time.perf_counter() - started) / messages
        if out is not None and segmenter == first:
            with open(out, "w", encoding="utf-8") as fh:
                for d, h in zip(dialogues, hyps, strict=True):
                    fh.write(json.dumps({"id": d.id, "ends_segment": h}) + "\n")
        scores[segmenter] = evaluate([d.ends_segment for d in dialogues], hyps)
    return scores
