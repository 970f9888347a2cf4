"""The read path on real Postgres (pgvector, full text), the real embedder and mem0: recall
over archived messages, citations back to the log, isolation between users, the context."""

from datetime import UTC, datetime, timedelta

import pytest

from chatmem.memory.recall import NotReadable
from chatmem.schemas.events import CommandEvent, InvalidEvent, MessageEvent
from chatmem.schemas.read import Budgets, Scope
from tests.conftest import logged_events, scalar
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

ALICE = [
    "Hi! I need help planning my garden this spring.",
    "Sure, what would you like to grow?",
    "Tomatoes and basil, and my locker code at the allotment is 4512 by the way.",
    "Noted. Tomatoes need full sun and regular watering.",
    "I prefer organic fertiliser, no chemicals please.",
    "Then compost and worm castings are a good choice.",
]
BOB = [
    "Can you help me pick a laptop for video editing?",
    "Sure: look for 32 GB of memory and a strong GPU.",
    "My budget is about 1500 euros.",
]


def conversation(thread, user, lines, start=0):
    return [
        MessageEvent(
            event_id=f"{thread}-{start + i}",
            thread_id=thread,
            user_id=user if i % 2 == 0 else "bot",
            role="user" if i % 2 == 0 else "assistant",
            text=text,
            platform_message_id=f"{thread}-m{start + i}",
            occurred_at=T0 + timedelta(minutes=start + i),
        )
        for i, text in enumerate(lines)
    ]


@pytest.fixture
def memory(container):
    d = Driver(container)
    close = CommandEvent(
        event_id="garden-close",
        thread_id="garden",
        user_id="alice",
        command="close_episode",
        occurred_at=T0 + timedelta(minutes=30),
    )
    d.publish(
        conversation("garden", "alice", ALICE)
        + [close]
        + conversation("garden", "alice", ["What about the new shed colour? I like dark green."], start=40)
    )
    d.publish(conversation("laptops", "bob", BOB))
    for thread in ("garden", "laptops"):
        d.advance(thread)
    d.run_jobs(with_facts=True)
    return container


def test_archived_messages_are_still_recalled_with_citations_to_the_log(memory):
    c = memory
    archived = """SELECT count(*) FROM messages m JOIN episodes e USING (episode_id, generation)
                  WHERE m.thread_id = 'garden' AND e.archived"""
    assert scalar(c, archived) == len(ALICE)
    result = c.recall("alice", "what is the locker code at the allotment?", limit=5)
    top = result.hits[0]
    assert top.kind == "message" and "4512" in top.snippet and top.archived
    logged = {e["event_id"]: e for e in logged_events(c)}
    for hit in [h for h in result.hits if h.kind == "message"]:
        cit = hit.citation
        payload, thread = logged[cit.event_id]["payload"], logged[cit.event_id]["thread_id"]
        with c.pool.connection() as conn:
            seq = conn.execute(
                "SELECT seq FROM messages WHERE event_id = %s AND generation = 1", (cit.event_id,)
            ).fetchone()[0]
        assert thread == cit.thread_id and seq == cit.seq
        assert payload["platform_message_id"] == cit.platform_message_id
        assert hit.snippet == " ".join(payload["text"].split())[:300]
        assert len(hit.snippet) <= 300 and cit.episode_id.startswith("garden#")


def test_neighbouring_turns_give_context(memory):
    hit = memory.recall("alice", "locker code", scope=Scope.MESSAGES, limit=1).hits[0]
    assert hit.before == "assistant: Sure, what would you like to grow?"
    assert hit.after.startswith("assistant: Noted. Tomatoes need full sun") and hit.author == "alice"


def test_scopes_summaries_and_facts(memory):
    c = memory
    summaries = c.recall("alice", "garden tomatoes basil", scope=Scope.SUMMARIES).hits
    assert summaries and all(h.kind == "summary" for h in summaries)
    final = summaries[0].citation
    assert final.source_ids[0] == "garden-m0" and final.upto_seq >= final.seq
    facts = c.recall("alice", "fertiliser", scope=Scope.FACTS).hits
    assert facts and facts[0].kind == "fact" and "organic" in facts[0].snippet.lower()
    assert facts[0].citation.platform_message_id == "garden-m4"
    assert c.recall("alice", "fertiliser", scope=Scope.ARTIFACTS).hits == []


def test_user_a_never_sees_user_b(memory):
    c = memory
    for query in ("locker code 4512", "organic fertiliser", "garden"):
        hits = c.recall("bob", query, limit=25).hits
        assert all(h.citation.thread_id == "laptops" for h in hits), query
        assert not c.recall("bob", query, scope=Scope.FACTS).hits
    with pytest.raises(NotReadable):
        c.recall("bob", "locker", thread_id="garden")
    with pytest.raises(NotReadable):
        c.build_context("garden", "bob", "locker")
    for evil in ("*", "%", "alice' OR '1'='1", "", "a" * 300, "alice\x00"):
        with pytest.raises(InvalidEvent):
            c.recall(evil, "locker code")
        with pytest.raises(InvalidEvent):
            c.recall("bob", "locker code", thread_id=evil)
    assert c.recall("nobody", "locker code 4512").hits == []


@pytest.mark.parametrize("query", ["👍", "?", "!!!", "the the the", "'", "a:* & !", "\u200b"])
def test_a_message_with_no_searchable_word_still_gets_context_and_recall(memory, query):
    # Only stop words, punctuation or emoji: no text lexeme. These once raised TypeError from
    # every scope, so a bot building context for a "👍" got an error (the API a 500).
    c = memory
    for scope in Scope:
        for thread_id in (None, "garden"):
            assert isinstance(c.recall("alice", query, scope=scope, limit=3, thread_id=thread_id).hits, list)
    assert c.recall("alice", query, scope=Scope.MESSAGES).hits  # found by meaning alone
    bundle = c.build_context("garden", "alice", query)
    assert bundle.messages[-1]["content"].startswith("What about the new shed colour")


def test_a_nul_in_a_query_is_dropped_not_sent_to_postgres(memory):
    c = memory
    assert "4512" in c.recall("alice", "locker\x00 code", limit=1).hits[0].snippet
    with_nul = c.build_context("garden", "alice", "\x00locker code?")
    assert with_nul.messages == c.build_context("garden", "alice", "locker code?").messages


def test_context_bundle_from_real_memory(memory):
    c = memory
    b = c.build_context("garden", "alice", "what was my locker code?", max_tokens=600, budgets=Budgets(recent_turns=30))
    assert b.tokens <= 600 and len(b.section("recent_turns").items) < 3
    recent = [i.text for i in b.section("recent_turns").items]
    assert recent[-1].startswith("What about the new shed colour")
    assert b.section("summaries").items  # the closed episode's final summary
    assert any("4512" in i.text for i in b.section("retrieved").items)
    assert any("organic" in i.text.lower() for i in b.section("facts").items)
    seqs = [i.citation.seq for n in ("recent_turns", "retrieved") for i in b.section(n).items]
    assert len(seqs) == len(set(seqs))  # nothing twice
    assert b.messages[0]["role"] == "system" and b.messages[-1]["content"].startswith("What about the new shed")


def test_warm_up_loads_the_read_path_and_writes_nothing(memory):
    c = memory
    tables = ("events", "messages", "summaries", "facts", "embedding_cache", "llm_cache")
    counts = {t: scalar(c, f"SELECT count(*) FROM {t}") for t in tables}
    for loaded in ("recall", "mem0", "token_counter"):
        vars(c).pop(loaded, None)
    c.warm_up()
    assert {"recall", "mem0", "token_counter"} <= vars(c).keys()
    assert {t: scalar(c, f"SELECT count(*) FROM {t}") for t in tables} == counts
