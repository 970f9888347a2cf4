"""The offline LLM: deterministic and extractive, used when no LLM endpoint is configured.

Summaries are the most central sentences (by embedding, against the centroid of all of them);
open loops, decisions, to-dos and fact candidates come from patterns in English and Russian.
It answers the same prompts, with the same response models, as a real LLM."""

from __future__ import annotations

import re
from collections import Counter
from typing import TypeVar

import numpy as np
from pydantic import BaseModel

from chatmem.memory.ports import Embedder
from chatmem.memory.prompts import (
    FactItem,
    FactList,
    FileSummary,
    FinalSummary,
    Line,
    Prompt,
    RollupSummary,
    RunningSummary,
)
from chatmem.memory.text import pattern_text

T = TypeVar("T", bound=BaseModel)

_SENTENCE = re.compile(r"(?<=[.!?…])\s+|\n+")
_WORD = re.compile(r"[^\W\d_][\w'-]{2,}", re.UNICODE)

OPEN_LOOP = re.compile(
    r"\b(i will|i'll|i am going to|i'm going to|we will|we'll|todo|to-do|to do:|need to|have to|must|"
    r"remind me|don't forget|follow up|я сделаю|сделаю|нужно|надо|напомни|не забудь|обязательно)\b",
    re.IGNORECASE,
)
DECISION = re.compile(
    r"\b(decided|decide to|let's go with|we'll go with|i'll take|i will take|agreed|settled on|going with|"
    r"решили|решено|выбираю|беру|договорились)\b",
    re.IGNORECASE,
)
FACT = re.compile(
    r"\b(my name is|call me|i am from|i'm from|i live in|i work (at|as|for)|i prefer|i like|i love|i hate|"
    r"i don't like|i'm allergic|i am allergic|i always|i never|my (wife|husband|son|daughter|kid|dog|cat|"
    r"birthday|job|favorite|favourite)|меня зовут|я живу|я работаю|я предпочитаю|я люблю|не люблю|"
    r"у меня аллергия|я всегда|я никогда)\b",
    re.IGNORECASE,
)
_FILLER = re.compile(r"^(hi|hello|hey|thanks|thank you|ok|okay|bye|привет|спасибо|пока|ок)\b[\s!.,]*$", re.I)

STOPWORDS = frozenset(
    """a an and are as at be but by can could did do does for from had has have he her here him his how i i'm
    if in into is it it's its just me my no not of on or our out she so some than that the their them then
    there these they this to too up us was we were what when where which who why will with would you your
    yes about also like get got really very much well would should could been being all any more most other
    one two know think want need going make sure good great nice okay thanks hello please let's
    и в во не что он на я с со как а то все она так его но да ты к у же вы за бы по только ее мне было вот от
    меня еще нет о из ему теперь когда даже ну ли если уже или ни быть был него до вас нибудь опять уж вам
    ведь там потом себя ничего ей может они тут где есть надо ней для мы тебя их чем была сам чтоб без будто
    чего раз тоже себе под будет ж тогда кто этот того потому этого какой совсем ним здесь этом один почти мой
    тем чтобы нее сейчас были куда зачем всех никогда можно при наконец два об другой хоть после над больше тот
    через эти нас про всего них какая много разве три эту моя впрочем хорошо свою этой перед иногда лучше чуть
    том нельзя такой им более всегда конечно всю между""".split()
)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if len(s.strip()) > 1]


def keywords(texts: list[str], k: int) -> list[str]:
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(w.lower() for w in _WORD.findall(t) if w.lower() not in STOPWORDS)
    return [w for w, _ in counts.most_common(k)]


def entities(lines: list[Line]) -> list[str]:
    """Capitalised words not opening a sentence, and numbers with units: cheap, language-agnostic."""
    found: Counter[str] = Counter()
    for ln in lines:
        for sent in sentences(ln.text):
            words = sent.split()
            for w in words[1:]:
                w = w.strip(".,!?;:()\"'«»")
                if len(w) > 1 and w[0].isupper() and w.lower() not in STOPWORDS and not w.isupper():
                    found[w] += 1
    return [w for w, _ in found.most_common(10)]


class OfflineLLM:
    model = "offline-extractive-v1"

    def __init__(self, embedder: Embedder, max_sentences: int = 3):
        self.embedder = embedder
        self.max_sentences = max_sentences

    def complete(self, prompt: Prompt, response_model: type[T]) -> T:
        handler = getattr(self, f"_{prompt.name}")
        result = handler(prompt.input)
        return response_model.model_validate(result.model_dump())

    # --- prompts --------------------------------------------------------------------------
    def _running_summary(self, data: dict) -> RunningSummary:
        lines = [Line(**m) for m in data["messages"]]
        return RunningSummary(summary=self._central(lines), open_loops=open_loops(lines))

    def _chunk_summary(self, data: dict) -> RunningSummary:
        return self._running_summary(data)

    def _final_summary(self, data: dict) -> FinalSummary:
        lines = [Line(**m) for m in data["messages"]]
        summary = self._central(lines)
        label_words = keywords([ln.text for ln in lines], 4)
        user_sents = [s for ln in lines if ln.role == "user" for s in sentences(ln.text)]
        all_sents = [s for ln in lines for s in sentences(ln.text)]
        return FinalSummary(
            topic=(sentences(summary) or [summary])[0][:200] if summary else "",
            topic_label=" ".join(label_words[:4]) or "conversation",
            summary=summary,
            decisions=_dedupe(s for s in all_sents if DECISION.search(pattern_text(s))),
            todos=_dedupe(s for s in all_sents if OPEN_LOOP.search(pattern_text(s)) and "?" not in s),
            facts_candidates=_dedupe(s for s in user_sents if FACT.search(pattern_text(s)) and "?" not in s),
            entities=entities(lines),
            artifacts=_dedupe(
                m.group(0) for ln in lines for m in re.finditer(r"\[(image|file)#[0-9a-f]+\][^\n]*", ln.text)
            ),
            open_questions=unanswered_questions(lines),
        )

    def _extract_facts(self, data: dict) -> FactList:
        from chatmem.memory.facts import extract

        items = []
        for m in data["messages"]:
            for f in extract(m["text"]):
                items.append(
                    FactItem(
                        seq=m["seq"],
                        category=f.category,
                        key=f.key,
                        value=f.value,
                        confidence=f.confidence,
                        importance=f.importance,
                        text=f.text,
                    )
                )
        return FactList(facts=items)

    def _rollup_summary(self, data: dict) -> RollupSummary:
        texts = [t for t in data["summaries"] if t]
        lines = [Line(seq=i, role="summary", text=t) for i, t in enumerate(texts)]
        return RollupSummary(summary=self._central(lines, self.max_sentences + 1), topics=keywords(texts, 6))

    def _file_summary(self, data: dict) -> FileSummary:
        sections = [t for t in data["sections"] if t.strip()]
        # A first section too short to hold a sentence ("1", a page number) stands for itself.
        first = (sentences(sections[0]) or [sections[0].strip()])[0] if sections else ""
        title = data.get("filename") or first[:80] or "file"
        lines = [Line(seq=i, role="file", text=t) for i, t in enumerate(sections)]
        return FileSummary(title=title, summary=self._central(lines, self.max_sentences))

    # --- extractive core ------------------------------------------------------------------
    def _central(self, lines: list[Line], k: int | None = None) -> str:
        """The k most central messages (closest to the centroid of all), in order, two sentences
        of each at most. Chat messages are short, so message vectors serve as sentence vectors,
        and they are the ones the pipeline already embedded (cache hits, no new model work)."""
        k = k or self.max_sentences
        kept = [ln for ln in lines if ln.text.strip() and not _FILLER.match(ln.text.strip())]
        cands = [ln.text for ln in kept]
        if not cands:
            return ""
        if len(cands) > k:
            # The texts the segment path embedded (the author's name first, as embed_text does),
            # so that these are cache hits and not a second pass of the model over the episode.
            vectors = self.embedder.embed([ln.embedding_text() for ln in kept])
            centroid = vectors.mean(axis=0)
            centroid /= max(float(np.linalg.norm(centroid)), 1e-12)
            scores = vectors @ centroid
            # Ties broken by position so the output never depends on sort stability.
            best = sorted(range(len(cands)), key=lambda j: (-round(float(scores[j]), 6), j))[:k]
            cands = [cands[j] for j in sorted(best)]
        return " ".join(" ".join(sentences(text)[:2]) for text in cands)


def open_loops(lines: list[Line]) -> list[str]:
    loops = [s for ln in lines for s in sentences(ln.text) if OPEN_LOOP.search(pattern_text(s)) and "?" not in s]
    return _dedupe([*unanswered_questions(lines), *loops])[:8]


def unanswered_questions(lines: list[Line]) -> list[str]:
    """A question no later message of the other side follows."""
    out: list[str] = []
    for i, ln in enumerate(lines):
        if "?" not in ln.text:
            continue
        answered = any(later.role != ln.role for later in lines[i + 1 :])
        if not answered:
            out.extend(s for s in sentences(ln.text) if s.endswith("?"))
    return _dedupe(out)


def _dedupe(items) -> list[str]:  # noqa: ANN001
    seen, out = set(), []
    for item in items:
        key = item.strip().lower()
        if key and key not in seen:
            seen.add(key)
            out.append(item.strip())
    return out
