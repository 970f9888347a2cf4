"""build_context: a token-budgeted bundle of what the bot should know about a thread, in the
priority order of DESIGN.md, rendered as OpenAI chat messages.

Sections fill within their own budgets; if the rendered whole is still over `max_tokens`, items
go in this order: retrieved snippets, recent turns (oldest first), older summaries, facts,
artifacts, the running summary, and last the system text (cut). The final count is taken on the
rendered messages, so the budget holds for what the bot actually sends."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatmem.memory.attachments.queries import about_attachment
from chatmem.memory.recall import FoundFact, NotReadable, Recall
from chatmem.memory.tokens import TokenCounter
from chatmem.schemas.events import validate_identifier
from chatmem.schemas.read import Budgets, Citation, ContextBundle, ContextItem, Scope, Section, SectionName

DEFAULT_SYSTEM = (
    "You are a helpful assistant with a long-term memory of this conversation. "
    "Use the memory below when it is relevant; do not invent what it does not say."
)
MESSAGE_OVERHEAD = 4  # tokens the chat format adds per message
REPLY_PRIMING = 3
RECENT_LIMIT = 400
FACTS_LIMIT = 20
RETRIEVE_LIMIT = 20
ARTIFACTS_LIMIT = 5

HEADINGS: dict[SectionName, str] = {
    "running": "## The conversation so far",
    "summaries": "## Earlier in this conversation",
    "facts": "## What you know about the user",
    "artifacts": "## From shared files",
    "retrieved": "## Possibly relevant earlier messages",
}
# Trim order when the whole is over budget (most expendable first).
TRIM_ORDER: tuple[SectionName, ...] = ("retrieved", "recent_turns", "summaries", "facts", "artifacts", "running")
SECTION_BUDGETS = ("system", "summaries", "recent_turns", "snippets")  # the fields of Budgets that share the total
_NAME_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ContextTurn:
    text: str
    role: str
    author: str
    citation: Citation


@dataclass(frozen=True)
class ThreadSnapshot:
    thread_id: str
    generation: int | None
    running: dict | None  # text, content (open_loops), episode_id, from_seq, upto_seq
    summaries: list[dict]  # highest level first, newest first
    recent: list[ContextTurn]  # newest first


class ContextStore(Protocol):
    def session(self) -> AbstractContextManager[None]: ...

    def readable_threads(self, user_id: str, thread_id: str | None) -> list[str]: ...

    def snapshot(self, thread_id: str, recent_limit: int) -> ThreadSnapshot: ...

    def user_facts(self, user_id: str, limit: int) -> list[FoundFact]: ...


@dataclass
class _Draft:
    name: SectionName
    budget: int
    items: list[ContextItem] = field(default_factory=list)
    trimmed: int = 0

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)


def build_context(
    store: ContextStore,
    recall: Recall | None,
    counter: TokenCounter,
    *,
    thread_id: str,
    user_id: str,
    query: str | None = None,
    max_tokens: int | None = None,
    budgets: Budgets | None = None,
    system: str | None = None,
) -> ContextBundle:
    with store.session():
        return _build(store, recall, counter, thread_id, user_id, query, max_tokens, budgets, system)


@dataclass(frozen=True)
class _Request:
    """A checked request and what answers it: the store, recall (optional) and the counter."""

    store: ContextStore
    recall: Recall | None
    count: Callable[[str], int]
    user_id: str
    thread_id: str
    query: str | None  # stripped; None when blank

    def item(self, text: str, **kw: Any) -> ContextItem:
        return ContextItem(text=text, tokens=self.count(text) + 1, **kw)  # +1: the line break


def _build(
    store: ContextStore,
    recall: Recall | None,
    counter: TokenCounter,
    thread_id: str,
    user_id: str,
    query: str | None,
    max_tokens: int | None,
    budgets: Budgets | None,
    system: str | None,
) -> ContextBundle:
    user_id, thread_id = _validate(user_id, thread_id)
    _check_readable(store, user_id, thread_id)
    total = max_tokens if max_tokens is not None else (budgets or Budgets()).total
    req = _Request(store, recall, counter.count, user_id, thread_id, (query or "").strip() or None)
    # The persona as it is shown (its words, one space apart), counted once: its size is what the
    # system section needs of the total, and the item the section holds when it fits.
    persona = req.item(" ".join((system if system is not None else DEFAULT_SYSTEM).split()))
    b = shared(budgets or Budgets(), total, {"system": persona.tokens})
    snap = store.snapshot(thread_id, RECENT_LIMIT)

    drafts = _drafts(b)
    _fill_system(drafts["system"], req, persona)
    summary_room = _fill_running(drafts["running"], req, snap.running)
    _fill_summaries(drafts["summaries"], req, snap.summaries, summary_room)
    shown = _fill_recent(drafts["recent_turns"], req, snap.recent)
    # Facts, then artifact snippets, then retrieved snippets share the snippet budget.
    seen_text = {_norm(i.text) for d in drafts.values() for i in d.items}
    room = _fill_facts(drafts["facts"], req, seen_text, b.snippets)
    room = _fill_artifacts(drafts["artifacts"], req, seen_text, room)
    _fill_retrieved(drafts["retrieved"], req, seen_text, shown, room)

    messages, used = _fit(drafts, total, req.count)
    return ContextBundle(
        thread_id=thread_id,
        user_id=user_id,
        query=req.query,
        max_tokens=total,
        tokens=used,
        counter=counter.name,
        sections=_sections(drafts),
        messages=messages,
    )


def shared(b: Budgets, total: int, needs: dict[str, int] | None = None) -> Budgets:
    """The section budgets made to fit `total` when they add up to more: the largest are cut to
    one level, so a section given less than that keeps what it was given, and a section that
    needs less than its budget (`needs`: the system text) takes only that, leaving the rest to
    the others. Left as they were, a smaller total was met by the trim alone, which drops every
    retrieved message before a recent turn: a bot asking for half the default tokens got none of
    the earlier messages its question was about (docs/read-path.md)."""
    sizes = {name: getattr(b, name) for name in SECTION_BUDGETS}
    if sum(sizes.values()) <= total:
        return b
    wants = {name: min(size, (needs or {}).get(name, size)) for name, size in sizes.items()}
    left, level = total, 0
    order = sorted(SECTION_BUDGETS, key=wants.__getitem__)
    for i, name in enumerate(order):
        level = left // (len(order) - i)
        if wants[name] > level:
            break
        left -= wants[name]
    return b.model_copy(update={name: min(want, level) for name, want in wants.items()})


def _validate(user_id: str, thread_id: str) -> tuple[str, str]:
    """The identifiers, checked (ValueError when malformed)."""
    return validate_identifier(user_id, "user_id"), validate_identifier(thread_id)


def _check_readable(store: ContextStore, user_id: str, thread_id: str) -> None:
    if not store.readable_threads(user_id, thread_id):
        raise NotReadable(thread_id)


def _drafts(b: Budgets) -> dict[SectionName, _Draft]:
    return {
        "system": _Draft("system", b.system),
        "running": _Draft("running", b.summaries),
        "summaries": _Draft("summaries", b.summaries),
        "recent_turns": _Draft("recent_turns", b.recent_turns),
        "facts": _Draft("facts", b.snippets),
        "artifacts": _Draft("artifacts", b.snippets),
        "retrieved": _Draft("retrieved", b.snippets),
    }


def _fill_system(draft: _Draft, req: _Request, persona: ContextItem) -> None:
    if not persona.text:
        return
    if persona.tokens <= draft.budget:
        draft.items.append(persona)
    elif text := _cut(persona.text, draft.budget, req.count):
        draft.items.append(req.item(text))


def _fill_running(draft: _Draft, req: _Request, running: dict | None) -> int:
    """The running summary and its open loops, first in the summary budget; return the room
    left for the other summaries."""
    if not running:
        return draft.budget
    lines = [running["text"]] + [f"Open: {o}" for o in (running["content"] or {}).get("open_loops", [])]
    return _fill(draft, [req.item(t) for t in lines if t.strip()], draft.budget)


def _fill_summaries(draft: _Draft, req: _Request, summaries: list[dict], room: int) -> None:
    """The highest-level summaries, in the room the running summary left."""
    items = [
        req.item(
            s["text"],
            citation=Citation(
                source="summary",
                thread_id=req.thread_id,
                episode_id=s["episode_id"],
                seq=s["from_seq"],
                upto_seq=s["upto_seq"],
            ),
        )
        for s in summaries
        if s["text"].strip()
    ]
    _fill(draft, items, room)


def _fill_recent(draft: _Draft, req: _Request, recent: list[ContextTurn]) -> set[tuple[str, int | None]]:
    """Recent turns, newest first into the budget (counted only until it is full), shown oldest
    first; return the (thread, seq) of the turns shown."""
    _fill(
        draft,
        (req.item(t.text, role=_role(t.role), author=t.author, citation=t.citation) for t in recent),
        draft.budget,
        contiguous=len(recent),
    )
    draft.items.reverse()
    return {(i.citation.thread_id, i.citation.seq) for i in draft.items if i.citation}


def _fill_facts(draft: _Draft, req: _Request, seen_text: set[str], room: int) -> int:
    """Facts that match the query first, then the user's most important ones, each once and none
    already said; adds them to `seen_text` and returns the snippet room left."""
    facts: list[tuple[str, Citation | None]] = []
    if req.recall is not None and req.query:
        hits = req.recall(req.user_id, req.query, scope=Scope.FACTS, limit=FACTS_LIMIT).hits
        facts += [(h.snippet, h.citation) for h in hits]
    facts += [(f.text, f.citation) for f in req.store.user_facts(req.user_id, FACTS_LIMIT)]
    unique: list[tuple[str, Citation | None]] = []
    for text, citation in facts:
        if _norm(text) not in seen_text:
            seen_text.add(_norm(text))
            unique.append((text, citation))
    return _fill(draft, [req.item(f"- {t}", citation=c) for t, c in unique], room)


def _fill_artifacts(draft: _Draft, req: _Request, seen_text: set[str], room: int) -> int:
    """Attachment texts, when the question is about something shared (a photo, a file, image#id);
    returns the snippet room left."""
    if req.recall is None or not req.query or room <= 0 or not about_attachment(req.query):
        return room
    found = req.recall(req.user_id, req.query, scope=Scope.ARTIFACTS, limit=ARTIFACTS_LIMIT).hits
    lines = [req.item(f"- {h.snippet}", citation=h.citation) for h in found if _norm(h.snippet) not in seen_text]
    return _fill(draft, lines, room)


def _fill_retrieved(
    draft: _Draft, req: _Request, seen_text: set[str], shown: set[tuple[str, int | None]], room: int
) -> None:
    """Earlier messages of the thread that match the query, unless shown or said already."""
    if req.recall is None or not req.query or room <= 0:
        return
    hits = req.recall(req.user_id, req.query, scope=Scope.MESSAGES, limit=RETRIEVE_LIMIT, thread_id=req.thread_id).hits
    fresh = [
        h for h in hits if (h.citation.thread_id, h.citation.seq) not in shown and _norm(h.snippet) not in seen_text
    ]
    lines = [
        req.item(f"- [{_when(h.citation)}] {h.author}: {h.snippet}", citation=h.citation, author=h.author)
        for h in fresh
    ]
    _fill(draft, lines, room)


def _fit(drafts: dict[SectionName, _Draft], total: int, count: Callable[[str], int]) -> tuple[list[dict], int]:
    """The whole must fit: drop the most expendable items until the rendered count does. Each
    drop lowers a running figure; the rendered messages are recounted only when it says "fits".
    Return the rendered messages and their count."""
    messages = _render(drafts)
    used = _count_messages(messages, count)
    while used > total:
        freed = _trim_one(drafts, count)
        used = used - freed if freed is not None else total
        if used <= total:
            messages = _render(drafts)
            used = _count_messages(messages, count)
        if freed is None:
            break
    return messages, used


def _sections(drafts: dict[SectionName, _Draft]) -> list[Section]:
    return [
        Section(name=d.name, items=d.items, tokens=d.tokens, budget=d.budget, trimmed=d.trimmed)
        for d in drafts.values()
    ]


def _fill(draft: _Draft, items: Iterable[ContextItem], room: int, *, contiguous: int | None = None) -> int:
    """Take items in order while they fit in `room`, skipping ones too large; with `contiguous`
    (the number of items) stop at the first that does not fit instead: recent turns must not
    have holes, and the rest need not be counted. Return the room left."""
    taken = 0
    for it in items:
        if it.tokens <= room:
            draft.items.append(it)
            room -= it.tokens
            taken += 1
        elif contiguous is not None:
            draft.trimmed += contiguous - taken
            break
        else:
            draft.trimmed += 1
    return room


def _trim_one(drafts: dict[SectionName, _Draft], count: Callable[[str], int]) -> int | None:
    """Drop the most expendable item; return about how many tokens that freed (None: nothing left)."""
    for name in TRIM_ORDER:
        d = drafts[name]
        if d.items:
            # Retrieved and summaries drop their last (weakest / oldest); recent turns their oldest.
            gone = d.items.pop(0 if name == "recent_turns" else -1)
            d.trimmed += 1
            return gone.tokens + (MESSAGE_OVERHEAD - 1 if name == "recent_turns" else 0)
    sys_item = drafts["system"].items[0] if drafts["system"].items else None
    if sys_item and sys_item.text:
        words = sys_item.text.split()
        cut = " ".join(words[: max(0, len(words) * 3 // 4)])
        drafts["system"].items[0] = ContextItem(text=cut, tokens=count(cut) + 1)
        return max(1, sys_item.tokens - drafts["system"].items[0].tokens)
    return None


def _render(drafts: dict[SectionName, _Draft]) -> list[dict]:
    parts = [i.text for i in drafts["system"].items if i.text]
    for name in ("running", "summaries", "facts", "artifacts", "retrieved"):
        d = drafts[name]
        if d.items:
            parts.append(HEADINGS[name] + "\n" + "\n".join(i.text for i in d.items))
    messages: list[dict] = []
    if parts:
        messages.append({"role": "system", "content": "\n\n".join(parts)})
    for it in drafts["recent_turns"].items:
        msg: dict[str, str] = {"role": it.role or "user", "content": it.text}
        if it.role == "user" and it.author and _NAME_OK.match(it.author):
            msg["name"] = it.author
        messages.append(msg)
    return messages


def _count_messages(messages: list[dict], count: Callable[[str], int]) -> int:
    total = REPLY_PRIMING if messages else 0
    for m in messages:
        total += MESSAGE_OVERHEAD + count(m["content"]) + (count(m["name"]) if "name" in m else 0)
    return total


def _cut(text: str, budget: int, count: Callable[[str], int]) -> str:
    words = text.split()
    while words and count(" ".join(words)) + 1 > budget:
        words = words[: len(words) * 3 // 4]
    return " ".join(words)


def _role(role: str) -> str:
    return role if role in ("user", "assistant", "system") else "user"


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).lstrip("- ")


def _when(c: Citation) -> str:
    return c.occurred_at.strftime("%Y-%m-%d") if c.occurred_at else "?"
