"""Durable facts about users: extraction, the write policy and conflict resolution.

A fact is (user, category, key) -> value with a confidence and an importance. One value per
(user, category, key) is active; a new value replaces it only when its confidence is at least
the active one's, and the replaced value stays as history (`is_active = false`). The offline
extractor recognises common English and Russian statements; greetings, filler and speculation
are never stored."""

from __future__ import annotations

import re
from dataclasses import dataclass

from chatmem.memory.text import pattern_text

CATEGORIES = ("identity", "preference", "constraint", "instruction", "decision")


@dataclass(frozen=True)
class FactCandidate:
    category: str
    key: str
    value: str
    confidence: float
    importance: float
    text: str  # the sentence it came from, as written to mem0


# (pattern, category, key or None to derive from the value, confidence, importance)
_RULES: list[tuple[re.Pattern[str], str, str | None, float, float]] = [
    (re.compile(r"\bmy full name is ([^.,!?;]+)", re.I), "identity", "name", 0.95, 1.0),
    (re.compile(r"\bmy name is ([^.,!?;]+)", re.I), "identity", "name", 0.9, 1.0),
    (re.compile(r"\b(?:please )?call me ([^.,!?;]+)", re.I), "identity", "name", 0.6, 0.8),
    (re.compile(r"\bменя зовут ([^.,!?;]+)", re.I), "identity", "name", 0.9, 1.0),
    (re.compile(r"\bзови(?:те)? меня ([^.,!?;]+)", re.I), "identity", "name", 0.6, 0.8),
    (re.compile(r"\bi live in ([^.,!?;]+)", re.I), "identity", "location", 0.85, 0.8),
    (re.compile(r"\bi(?:'m| am) based in ([^.,!?;]+)", re.I), "identity", "location", 0.85, 0.8),
    (re.compile(r"\bя живу в ([^.,!?;]+)", re.I), "identity", "location", 0.85, 0.8),
    (re.compile(r"\bi(?:'m| am) from ([^.,!?;]+)", re.I), "identity", "origin", 0.8, 0.6),
    (re.compile(r"\bi work (?:at|for) ([^.,!?;]+)", re.I), "identity", "employer", 0.85, 0.7),
    (re.compile(r"\bя работаю в ([^.,!?;]+)", re.I), "identity", "employer", 0.85, 0.7),
    (re.compile(r"\bi work as (?:an? )?([^.,!?;]+)", re.I), "identity", "occupation", 0.85, 0.7),
    (re.compile(r"\bi(?:'m| am) allergic to ([^.,!?;]+)", re.I), "constraint", None, 0.95, 1.0),
    (re.compile(r"\bу меня аллергия на ([^.,!?;]+)", re.I), "constraint", None, 0.95, 1.0),
    (re.compile(r"\bi (?:can't|cannot|don't) eat ([^.,!?;]+)", re.I), "constraint", None, 0.85, 0.9),
    (re.compile(r"\bi never ([^.,!?;]+)", re.I), "constraint", None, 0.75, 0.7),
    (re.compile(r"\bя никогда не ([^.,!?;]+)", re.I), "constraint", None, 0.75, 0.7),
    (re.compile(r"\bi prefer ([^.,!?;]+)", re.I), "preference", None, 0.8, 0.7),
    (re.compile(r"\bя предпочитаю ([^.,!?;]+)", re.I), "preference", None, 0.8, 0.7),
    (re.compile(r"\bi (?:really )?(?:like|love) ([^.,!?;]+)", re.I), "preference", None, 0.7, 0.5),
    (re.compile(r"\bя (?:очень )?люблю ([^.,!?;]+)", re.I), "preference", None, 0.7, 0.5),
    (re.compile(r"\bi (?:hate|dislike|don't like) ([^.,!?;]+)", re.I), "preference", None, 0.7, 0.5),
    (re.compile(r"\bi always ([^.,!?;]+)", re.I), "preference", None, 0.7, 0.6),
    (
        re.compile(r"\b(?:always|please always) (answer|reply|respond|write|use|speak) ([^.,!?;]+)", re.I),
        "instruction",
        None,
        0.85,
        0.8,
    ),
    (
        re.compile(r"\b(?:never|please never|don't ever) (answer|reply|respond|write|use|speak) ([^.,!?;]+)", re.I),
        "instruction",
        None,
        0.85,
        0.8,
    ),
    (re.compile(r"\bвсегда (отвечай|пиши|говори) ([^.,!?;]+)", re.I), "instruction", None, 0.85, 0.8),
    (re.compile(r"\b(?:we|i) decided (?:to )?([^.,!?;]+)", re.I), "decision", None, 0.75, 0.6),
    (re.compile(r"\bмы решили ([^.,!?;]+)", re.I), "decision", None, 0.75, 0.6),
]

# Said with doubt, or not about the speaker: not a durable fact.
_SPECULATION = re.compile(
    r"\b(maybe|perhaps|probably|might|i think|i guess|not sure|if i|would|could be|"
    r"может быть|наверное|возможно|кажется|если)\b",
    re.I,
)
_GREETING = re.compile(r"^\s*(hi|hello|hey|thanks|thank you|привет|спасибо|здравствуйте)\b[\s!.,]*$", re.I)
_STOP = frozenset("a an the my to of in on for with and or at very really some any that this".split())
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def normalise_key(text: str, words: int = 4) -> str:
    tokens = [t for t in re.findall(r"[\w'-]+", text.lower()) if t not in _STOP]
    return " ".join(tokens[:words])


def _clean(value: str) -> str:
    value = re.split(r"\b(?:and|but|so|because|но|и|потому)\b", value, maxsplit=1)[0]
    return value.strip(" \"'«»").strip()


def extract(text: str, *, speaker_is_user: bool = True) -> list[FactCandidate]:
    """Facts stated in `text` by the user (assistant lines are never facts about the user)."""
    if not speaker_is_user or _GREETING.match(text):
        return []
    found: list[FactCandidate] = []
    for sentence in _SENTENCE.split(text):
        read = pattern_text(sentence)  # "I’m allergic to ..." as a phone types it
        if "?" in read or _SPECULATION.search(read):
            continue
        taken: set[str] = set()
        for pattern, category, key, confidence, importance in _RULES:
            m = pattern.search(read)
            if not m:
                continue
            value = _clean(" ".join(g for g in m.groups() if g))
            if not value or len(value) > 120:
                continue
            fact_key = key or normalise_key(value)
            if not fact_key or f"{category}:{fact_key}" in taken:
                continue  # rules run most specific first: "my full name" before "my name"
            taken.add(f"{category}:{fact_key}")
            found.append(FactCandidate(category, fact_key, value, confidence, importance, sentence.strip()))
    return found


def from_remember(text: str) -> FactCandidate:
    """An explicit `remember`: what the patterns recognise keeps its category and key; anything
    else becomes an instruction keyed by its words. Always confidence 1.0."""
    facts = extract(text)
    if facts:
        f = facts[0]
        return FactCandidate(f.category, f.key, f.value, 1.0, 1.0, text.strip())
    return FactCandidate("instruction", normalise_key(text, 6) or "note", text.strip(), 1.0, 1.0, text.strip())


@dataclass(frozen=True)
class Decision:
    action: str  # insert | replace | keep_old | same
    reason: str


def resolve(new_confidence: float, active_confidence: float | None, same_value: bool) -> Decision:
    if active_confidence is None:
        return Decision("insert", "no active value")
    if same_value:
        return Decision("same", "already the active value")
    if new_confidence >= active_confidence:
        return Decision("replace", f"confidence {new_confidence:.2f} ≥ {active_confidence:.2f}")
    return Decision("keep_old", f"confidence {new_confidence:.2f} < {active_confidence:.2f}")
