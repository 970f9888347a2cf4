"""build_context over the fake read port: the budget always holds, trimming follows the
design's order, nothing appears twice."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatmem.memory.context import DEFAULT_SYSTEM, ContextTurn, ThreadSnapshot, build_context
from chatmem.memory.recall import FoundFact, NotReadable
from chatmem.memory.tokens import EstimateCounter
from chatmem.schemas.read import Budgets, Citation, ContextItem, RecallHit, RecallResult, Scope
from tests.fakes import FakeContextStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COUNTER = EstimateCounter()
words = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Zs")), min_size=0, max_size=400)


def cite(seq: int) -> Citation:
    return Citation(
        source="message",
        thread_id="t",
        episode_id="t#1",
        seq=seq,
        platform_message_id=f"p{seq}",
        event_id=f"e{seq}",
        occurred_at=T0 + timedelta(minutes=seq),
    )


def make_store(turns: list[str], summaries: list[str], facts: list[str], running: str | None) -> FakeContextStore:
    recent = [
        ContextTurn(text=t, role="user" if i % 2 else "assistant", author=f"u{i % 2}", citation=cite(i))
        for i, t in enumerate(turns)
    ][::-1]
    snap = ThreadSnapshot(
        "t",
        1,
        {"text": running, "content": {"open_loops": ["pick a date"]}, "episode_id": "t#9", "from_seq": 0, "upto_seq": 3}
        if running is not None
        else None,
        [
            {"text": s, "episode_id": f"t#{i}", "from_seq": i, "upto_seq": i + 1, "level": 1, "kind": "final"}
            for i, s in enumerate(summaries)
        ],
        recent,
    )
    fact_rows = [FoundFact(i, "t", "t#1", f, "preference", 0.0, cite(i)) for i, f in enumerate(facts)]
    return FakeContextStore(members={"t": {"u1", "u0"}}, snapshots={"t": snap}, facts={"u1": fact_rows})


class FakeRecall:
    """Recall's call signature; returns given hits for messages and none for facts."""

    def __init__(self, hits: list[tuple[int, str]]):
        self.hits = hits

    def __call__(self, user_id, query, *, scope=Scope.ALL, limit=10, thread_id=None):
        if scope is Scope.FACTS:
            return RecallResult(query=query, scope=scope, hits=[])
        return RecallResult(
            query=query,
            scope=scope,
            hits=[
                RecallHit(
                    kind="message",
                    score=1.0 / (n + 1),
                    snippet=text[:300],
                    author="u1",
                    archived=True,
                    citation=cite(seq),
                )
                for n, (seq, text) in enumerate(self.hits[:limit])
            ],
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(words, max_size=40),
    summaries=st.lists(words, max_size=8),
    facts=st.lists(words, max_size=8),
    running=st.one_of(st.none(), words),
    retrieved=st.lists(st.tuples(st.integers(0, 80), words), max_size=15),
    max_tokens=st.integers(1, 3000),
    budgets=st.builds(
        Budgets,
        total=st.integers(1, 4000),
        system=st.integers(0, 800),
        summaries=st.integers(0, 800),
        recent_turns=st.integers(0, 1500),
        snippets=st.integers(0, 800),
    ),
    system=st.one_of(st.none(), words),
)
def test_the_token_budget_is_never_exceeded(turns, summaries, facts, running, retrieved, max_tokens, budgets, system):
    store = make_store(turns, summaries, facts, running)
    bundle = build_context(
        store,
        FakeRecall(retrieved),
        COUNTER,
        thread_id="t",
        user_id="u1",
        query="anything",
        max_tokens=max_tokens,
        budgets=budgets,
        system=system,
    )
    rendered = (3 if bundle.messages else 0) + sum(
        4 + COUNTER.count(m["content"]) + (COUNTER.count(m["name"]) if "name" in m else 0) for m in bundle.messages
    )
    assert bundle.tokens == rendered <= max_tokens
    for s in bundle.sections:
        if s.name != "running":  # running and summaries share the summaries budget
            assert s.tokens <= s.budget
    # nothing twice: a retrieved turn is never also a recent turn
    recent = {i.citation.seq for i in bundle.section("recent_turns").items}
    assert not recent & {i.citation.seq for i in bundle.section("retrieved").items}


def test_trimming_order_retrieved_then_recent_then_summaries():
    # Sections within budgets that add up to the total still render over it: every recent turn
    # is a message of its own (4 tokens each) and each section has a heading. What goes then
    # follows the design's order.
    turns = [f"ok {i}" for i in range(60)]
    summaries = [f"summary {i}: we discussed the garden plan in detail" for i in range(6)]
    retrieved = [(100 + i, f"old message {i} about seeds") for i in range(10)]
    store = make_store(turns, summaries, [], "running summary of the talk")

    def bundle(total: int):
        # the shares of the defaults, so that the whole is exactly the total
        b = Budgets(total=total, system=total * 3 // 16, summaries=total // 4, recent_turns=total * 3 // 8)
        b = b.model_copy(update={"snippets": total - b.system - b.summaries - b.recent_turns})
        return build_context(
            store, FakeRecall(retrieved), COUNTER, thread_id="t", user_id="u1", query="seeds", budgets=b
        )

    full = bundle(8000)
    sizes = {s.name: len(s.items) for s in full.sections}
    assert sizes["retrieved"] == 10 and sizes["recent_turns"] == 60 and sizes["summaries"] == 6

    seen = set()
    for total in range(1600, 200, -5):
        b = bundle(total)
        n = {s.name: len(s.items) for s in b.sections}
        budgets = {s.name: s.budget for s in b.sections}
        assert b.tokens <= total
        # a section short of what it has only because of the trim
        cut = {name: s.trimmed > 0 and s.tokens + 30 < budgets[name] for name, s in ((s.name, s) for s in b.sections)}
        if cut["recent_turns"]:
            assert n["retrieved"] == 0  # retrieved snippets go first
        if cut["summaries"]:
            assert n["retrieved"] == 0 and n["recent_turns"] == 0  # then recent turns, then summaries
        if 0 < n["recent_turns"] < 60:
            assert b.section("recent_turns").items[-1].citation.seq == 59  # the oldest turns go first
        seen.add((cut["retrieved"] or n["retrieved"] == 0, cut["recent_turns"]))
    assert {(True, False), (True, True)} <= seen


def test_the_trim_drops_retrieved_then_recent_turns_then_summaries():
    # The design's order at the trim itself, over sections filled past the total (build_context
    # fits their budgets to it first, so there only the rendering overhead reaches the trim).
    from chatmem.memory.context import _Draft, _fit

    def item(text: str, seq: int | None = None, role: str | None = None) -> ContextItem:
        return ContextItem(
            text=text, tokens=COUNTER.count(text) + 1, role=role, citation=None if seq is None else cite(seq)
        )

    def drafts() -> dict:
        d = {name: _Draft(name, 10**6) for name in ("system", "running", "summaries", "recent_turns")}
        d |= {name: _Draft(name, 10**6) for name in ("facts", "artifacts", "retrieved")}
        d["running"].items.append(item("running summary of the talk"))
        d["summaries"].items += [item(f"summary {i}: we discussed the garden plan in detail") for i in range(6)]
        d["recent_turns"].items += [
            item(f"turn number {i} about the garden and tomatoes", i, "user") for i in range(30)
        ]
        d["retrieved"].items += [item(f"- old message {i} about seeds", 100 + i) for i in range(10)]
        return d

    _, whole = _fit(drafts(), 10**6, COUNTER.count)
    seen = set()
    for total in range(whole, 0, -7):
        d = drafts()
        _, used = _fit(d, total, COUNTER.count)
        n = {name: len(x.items) for name, x in d.items()}
        assert used <= total
        if n["recent_turns"] < 30:
            assert n["retrieved"] == 0  # retrieved snippets go first
        if n["summaries"] < 6:
            assert n["retrieved"] == 0 and n["recent_turns"] == 0  # then recent turns, then summaries
        if 0 < n["recent_turns"] < 30:
            assert d["recent_turns"].items[-1].citation.seq == 29  # the oldest turns go first
        seen.add((n["retrieved"] < 10, n["recent_turns"] < 30, n["summaries"] < 6))
    assert {(True, False, False), (True, True, False), (True, True, True)} <= seen


def test_a_smaller_total_is_shared_by_every_section():
    # A bot asking for half the default tokens: the system text takes what it needs, the largest
    # budgets share the rest at one level, and the earlier messages its question is about are
    # still there (the trim alone took all of them).
    turns = [f"turn number {i} about the garden and tomatoes, watering and the weather" for i in range(400)]
    retrieved = [(1000 + i, f"old message {i} about the seeds we ordered in spring") for i in range(20)]
    store = make_store(turns, ["we planned the garden"], ["likes tomatoes"], "talking about the garden")
    b = build_context(
        store, FakeRecall(retrieved), COUNTER, thread_id="t", user_id="u1", query="seeds", max_tokens=4000
    )
    need = COUNTER.count(DEFAULT_SYSTEM) + 1
    level = (4000 - need) // 3
    budgets = {s.name: s.budget for s in b.sections}
    assert budgets.pop("system") == need and set(budgets.values()) == {level}
    assert b.tokens <= 4000
    assert len(b.section("retrieved").items) >= 10
    assert 0 < len(b.section("recent_turns").items) < 400
    # a section given less than the level keeps it
    b = build_context(
        store,
        FakeRecall(retrieved),
        COUNTER,
        thread_id="t",
        user_id="u1",
        query="seeds",
        max_tokens=600,
        budgets=Budgets(recent_turns=30),
    )
    level = (600 - 30 - need) // 2
    assert {s.name: s.budget for s in b.sections if s.name != "running"} == {
        "system": need,
        "summaries": level,
        "recent_turns": 30,
        "facts": level,
        "artifacts": level,
        "retrieved": level,
    }
    # budgets that fit the total are kept as given
    whole = Budgets(total=4000, system=500, summaries=1000, recent_turns=1500, snippets=1000)
    b = build_context(store, FakeRecall(retrieved), COUNTER, thread_id="t", user_id="u1", query="seeds", budgets=whole)
    assert b.section("recent_turns").budget == 1500 and b.section("retrieved").budget == 1000


def test_sections_render_as_chat_messages_in_priority_order():
    store = make_store(
        ["hello there", "hi, how can I help?"], ["we planned a trip to Lisbon"], ["likes tea"], "talking about the trip"
    )
    b = build_context(
        store,
        FakeRecall([(50, "the flight is on Friday")]),
        COUNTER,
        thread_id="t",
        user_id="u1",
        query="flight",
        system="You are Bot.",
    )
    system = b.messages[0]
    assert system["role"] == "system"
    text = system["content"]
    order = [
        text.index(x)
        for x in (
            "You are Bot.",
            "talking about the trip",
            "Open: pick a date",
            "we planned a trip to Lisbon",
            "likes tea",
            "the flight is on Friday",
        )
    ]
    assert order == sorted(order)
    assert [m["content"] for m in b.messages[1:]] == ["hello there", "hi, how can I help?"]
    assert b.messages[2]["role"] == "user" and b.messages[2]["name"] == "u1"
    assert {c.seq for c in b.citations} >= {0, 1, 50}


def test_the_persona_is_shown_with_its_words_one_space_apart_cut_to_its_budget_or_left_out_when_empty():
    store = make_store(["hello there"], [], [], None)

    def persona(system: str, budget: int) -> list[str]:
        b = build_context(
            store, None, COUNTER, thread_id="t", user_id="u1", system=system, budgets=Budgets(system=budget)
        )
        return [i.text for i in b.section("system").items]

    assert persona("You are Bot.\n\n  Be   brief.", 1500) == ["You are Bot. Be brief."]
    assert persona("", 1500) == [] and persona("   ", 1500) == []
    long = " ".join(f"word{i}" for i in range(400))
    (cut,) = persona(long, 50)
    assert long.startswith(cut) and COUNTER.count(cut) + 1 <= 50 < COUNTER.count(long)
    assert persona(long, 0) == []


def test_a_thread_the_user_never_wrote_in_is_not_readable():
    store = make_store(["x"], [], [], None)
    with pytest.raises(NotReadable):
        build_context(store, None, COUNTER, thread_id="t", user_id="someone-else")
    with pytest.raises(NotReadable):
        build_context(store, None, COUNTER, thread_id="other", user_id="u1")


def test_duplicate_texts_are_pruned():
    store = make_store(["I like green tea"], [], ["I like green tea", "lives in Porto"], None)
    b = build_context(store, FakeRecall([(7, "I like green tea")]), COUNTER, thread_id="t", user_id="u1", query="tea")
    texts = [i.text.lstrip("- ") for s in b.sections for i in s.items]
    assert texts.count("I like green tea") == 1


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.tuples(*(st.integers(0, 5000) for _ in range(4))),
    total=st.integers(1, 12000),
    need=st.integers(1, 3000),
)
def test_fitted_budgets_fit_the_total_and_keep_their_order(sizes, total, need):
    from chatmem.memory.context import SECTION_BUDGETS, shared

    b = Budgets(total=total, **dict(zip(SECTION_BUDGETS, sizes, strict=True)))
    fitted = {n: getattr(shared(b, total, {"system": need}), n) for n in SECTION_BUDGETS}
    given_ = dict(zip(SECTION_BUDGETS, sizes, strict=True))
    if sum(sizes) <= total:
        assert fitted == given_  # budgets that fit are used as given
        return
    wants = given_ | {"system": min(given_["system"], need)}
    assert sum(fitted.values()) <= total
    assert all(0 <= fitted[n] <= wants[n] for n in SECTION_BUDGETS)
    # one level: a section cut below what it wants holds at least as much as any other section
    cut = [n for n in SECTION_BUDGETS if fitted[n] < wants[n]]
    assert all(fitted[c] >= fitted[n] for c in cut for n in SECTION_BUDGETS)
    # and nothing is left over that a cut section could have had
    assert not cut or total - sum(fitted.values()) < len(cut)
