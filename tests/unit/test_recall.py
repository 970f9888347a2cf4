"""Recall's ranking (pure), the recall_memory tool and token counting, without I/O."""

import json
from datetime import UTC, datetime

import numpy as np
import pytest

from chatmem.memory.dates import query_period
from chatmem.memory.recall import (
    FoundFact,
    Hops,
    Inline,
    RankParams,
    TermStats,
    TurnCandidate,
    bm25,
    bm25_all,
    capped,
    clip,
    rank_turns,
)
from chatmem.memory.recall_tool import execute, format_hits, tool_definition
from chatmem.memory.tokens import EstimateCounter, TiktokenCounter, default_counter
from chatmem.schemas.read import Citation, RecallHit, RecallResult, Scope

AT = datetime(2026, 1, 1, tzinfo=UTC)


def turn(seq, sim=0.0, tf=(0,), length=8, episode="t#1", thread="t", at=AT, named=False):
    return TurnCandidate(
        thread, seq, episode, f"e{seq}", f"p{seq}", "u", "user", f"text {seq}", at, True, sim, tf, length, named
    )


def test_bm25_prefers_rare_terms_and_short_documents():
    stats = TermStats(docs=100, avg_len=10, df=(2, 60))
    rare = bm25((1, 0), 10, stats, 0.9, 0.4)
    common = bm25((0, 1), 10, stats, 0.9, 0.4)
    assert rare > common > 0
    assert bm25((1, 0), 5, stats, 0.9, 0.4) > bm25((1, 0), 40, stats, 0.9, 0.4)
    assert bm25((0, 0), 10, stats, 0.9, 0.4) == 0


def test_term_counts_are_read_from_a_text_vector():
    from chatmem.adapters.recall_pg import term_counts

    # Positions (weights after them) count; quote and backslash come doubled in the text form.
    text = "'go':1A,5A,9A 'it''s':2A 'a\\\\b':4A 'tim':3A 'nopos'"
    assert term_counts(text, ["go", "tim", "it's", "a\\b", "nopos", "absent"]) == (3, 1, 1, 1, 1, 0)
    assert term_counts(None, ["go", "tim"]) == (0, 0) and term_counts("", []) == ()


def test_bm25_for_all_candidates_matches_the_formula():
    stats = TermStats(docs=40, avg_len=9, df=(3, 0, 25))
    turns = [turn(i, tf=tf, length=n) for i, (tf, n) in enumerate([((1, 0, 2), 7), ((0, 0, 0), 12), ((3, 0, 1), 30)])]
    expected = [bm25(t.tf, t.length, stats, 0.9, 0.4) for t in turns]
    assert bm25_all(turns, stats, 0.9, 0.4) == pytest.approx(expected)


def test_a_turn_next_to_a_strong_match_outranks_an_isolated_equal_one():
    stats = TermStats(docs=50, avg_len=8, df=(3,))
    turns = [turn(1, sim=0.9, tf=(2,)), turn(2, sim=0.5), turn(10, sim=0.5), turn(20, sim=0.1), turn(30, sim=0.1)]
    ranked = [t.seq for t, _ in rank_turns(turns, stats, RankParams())]
    assert ranked[0] == 1
    assert ranked.index(2) < ranked.index(10)  # the answer next to the question


def test_a_summary_boost_lifts_its_whole_episode():
    stats = TermStats(docs=10, avg_len=8, df=(0,))
    turns = [turn(1, sim=0.5, episode="t#1"), turn(5, sim=0.5, episode="t#2")]
    plain = [t.seq for t, _ in rank_turns(turns, stats, RankParams())]
    boosted = [t.seq for t, _ in rank_turns(turns, stats, RankParams(), {"t#2": 1.0})]
    assert plain[0] == 1 and boosted[0] == 5


def test_a_question_naming_a_day_lifts_the_turns_sent_that_day():
    stats = TermStats(docs=10, avg_len=8, df=(0,))
    may7 = datetime(2023, 5, 7, 15, 0, tzinfo=UTC)
    later = datetime(2023, 6, 20, 15, 0, tzinfo=UTC)
    turns = [turn(1, sim=0.6, at=later), turn(40, sim=0.5, at=may7), turn(80, sim=0.2, at=later)]
    assert rank_turns(turns, stats, RankParams())[0][0].seq == 1
    period = query_period("What did she bake on 7 May, 2023?")
    assert rank_turns(turns, stats, RankParams(), period=period)[0][0].seq == 40


def test_a_question_naming_a_participant_lifts_their_turns():
    stats = TermStats(docs=10, avg_len=8, df=(0,))
    turns = [turn(1, sim=0.52), turn(40, sim=0.5, named=True), turn(80, sim=0.1)]
    assert rank_turns(turns, stats, RankParams(speaker_boost=0.0))[0][0].seq == 1
    assert rank_turns(turns, stats, RankParams())[0][0].seq == 40


def test_one_sitting_cannot_fill_the_answer():
    # Ten strong turns of one sitting (consecutive, a minute apart) and a weaker one days later.
    stats = TermStats(docs=20, avg_len=8, df=(0,))
    sitting = [turn(i, sim=0.9 - i * 0.01, at=AT.replace(minute=i)) for i in range(1, 11)]
    other = turn(50, sim=0.6, at=AT.replace(day=9))
    uncapped = [t.seq for t, _ in rank_turns([*sitting, other], stats, RankParams(episode_cap=100))]
    capped_ = [t.seq for t, _ in rank_turns([*sitting, other], stats, RankParams(episode_cap=3))]
    assert uncapped.index(50) == 10
    assert capped_.index(50) < 10 and capped_[:3] == [1, 2, 3]


def test_the_cap_only_reorders():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    turns = [turn(i) for i in range(5)]
    assert capped(scores, [0, 0, 0, 1, 1], 2, 10.0, turns) == [0, 1, 3, 4, 2]
    assert capped(scores, [0, 0, 0, 1, 1], 2, 0.0, turns) == [0, 1, 2, 3, 4]
    assert capped(scores, [0, 0, 0, 1, 1], 2, 10.0, turns, limit=2) == [0, 1, 2, 3, 4]  # the rest by score
    assert capped(np.array([]), [], 2, 1.0, []) == []


def test_snippets_are_clipped_to_the_limit():
    text = "word " * 200
    assert len(clip(text, 300)) <= 300 and clip("short   text", 300) == "short text"


def test_tool_definition_is_an_openai_function_schema():
    spec = tool_definition()
    assert spec["type"] == "function" and spec["function"]["name"] == "recall_memory"
    params = spec["function"]["parameters"]
    assert params["required"] == ["query"] and set(params["properties"]["scope"]["enum"]) == {s.value for s in Scope}
    json.dumps(spec)  # serialisable as sent to the API


class RecordingRecall:
    def __init__(self):
        self.calls = []

    def __call__(self, user_id, query, *, scope, limit, thread_id=None):
        self.calls.append((user_id, query, scope, limit, thread_id))
        hit = RecallHit(
            kind="message",
            score=1.0,
            snippet="We booked the Lisbon flight for May 3.",
            author="anna",
            before="anna: when do we fly?",
            citation=Citation(
                source="message",
                thread_id="t1",
                episode_id="t1#2",
                seq=14,
                platform_message_id="m-881",
                event_id="ev-14",
                occurred_at=AT,
            ),
        )
        return RecallResult(query=query, scope=scope, hits=[hit])


def test_tool_executor_runs_the_call_for_the_bots_user_and_formats_citations():
    recall = RecordingRecall()
    out = execute(recall, '{"query": "flight", "scope": "messages", "limit": 3}', user_id="anna", thread_id="t1")
    assert out.error is None and recall.calls == [("anna", "flight", Scope.MESSAGES, 3, "t1")]
    assert out.content.startswith("[1] (message · 2026-01-01 00:00 · anna · thread t1, message m-881)")
    assert "We booked the Lisbon flight" in out.content and "before: anna: when do we fly?" in out.content
    assert out.tool_message("call_1") == {"role": "tool", "tool_call_id": "call_1", "content": out.content}


def test_tool_executor_reports_bad_arguments_without_calling_recall():
    recall = RecordingRecall()
    for bad in (
        "{not json",
        '{"query": ""}',
        '{"query": "x", "scope": "everything"}',
        '{"query": "x", "user_id": "b"}',
        '{"query": "x", "limit": 500}',
        "[]",
    ):
        out = execute(recall, bad, user_id="anna")
        assert out.result is None and out.content.startswith("recall_memory: invalid arguments")
    assert recall.calls == []


def test_no_hits_reads_as_such():
    assert format_hits(RecallResult(query="zebra", scope=Scope.ALL, hits=[])) == 'No memory found for "zebra".'


def test_estimate_counts_words_symbols_and_other_scripts():
    est = EstimateCounter()
    assert est.count("") == 0
    assert est.count("hello world") == 2
    assert est.count("internationalization") == 4  # long words split
    assert est.count("привет мир") == 5  # Cyrillic counts finer
    assert est.count("2026-11-22!") == 2 + 1 + 1 + 1 + 1 + 1


def test_without_a_local_encoding_the_estimate_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: nothing cached, no download tried
    default_counter.cache_clear()
    try:
        assert isinstance(default_counter(), EstimateCounter)
    finally:
        default_counter.cache_clear()


def test_tiktoken_counter_wraps_an_encoding():
    class Enc:
        name = "fake"

        def encode(self, text, disallowed_special=()):
            return text.split()

    assert TiktokenCounter(Enc()).count("a b c") == 3 and TiktokenCounter(Enc()).name == "tiktoken:fake"


def recall_over_fakes():
    from chatmem.memory.recall import Recall
    from tests.fakes import FakeEmbedder, FakeRecallStore

    store = FakeRecallStore(FakeEmbedder())
    store.add_turn("t1", "alice", "I booked the flight to Lisbon for May", platform_message_id="m1")
    store.add_turn("t1", "bot", "Great, enjoy Lisbon!", role="assistant", platform_message_id="m2")
    store.add_turn("t1", "alice", "My cat is called Miso", platform_message_id="m3")
    store.add_turn("t2", "bob", "Bob's secret flight to Lisbon plans", platform_message_id="b1")
    store.add_summary("t1", "Alice planned a trip to Lisbon.", 1, 2)
    store.add_fact("alice", "t1", "cat is called Miso", "identity")
    return Recall(store, FakeEmbedder()), store


def test_recall_over_the_fake_store_cites_the_platform_message_and_stays_in_the_users_threads():
    from chatmem.memory.recall import NotReadable

    recall, _ = recall_over_fakes()
    result = recall("alice", "flight to Lisbon", limit=5)
    messages = [h for h in result.hits if h.kind == "message"]
    assert messages[0].citation.platform_message_id == "m1"
    assert {h.citation.thread_id for h in result.hits} == {"t1"}  # never bob's thread
    assert recall("alice", "Miso", scope=Scope.FACTS).hits[0].snippet == "cat is called Miso"
    summaries = recall("alice", "trip to Lisbon", scope=Scope.SUMMARIES).hits
    assert summaries[0].citation.source_ids == ["m1", "m2"]
    with pytest.raises(NotReadable):
        recall("alice", "plans", thread_id="t2")


class HopRecorder:
    """Wraps the fake store and keeps the periods and second-hop requests the ranking sent."""

    def __init__(self, store):
        self.store = store
        self.periods: list = []
        self.hops: list[Hops] = []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def turn_candidates(self, threads, lexemes, qvec, limit, period):
        self.periods.append(period)
        return self.store.turn_candidates(threads, lexemes, qvec, limit, period)

    def hop_turns(self, threads, lexemes, qvec, limit, hops):
        self.hops.append(hops)
        return self.store.hop_turns(threads, lexemes, qvec, limit, hops)


def test_second_hop_asks_for_fact_sources_summary_ranges_and_the_named_day():
    from chatmem.memory.recall import Recall
    from tests.fakes import FakeEmbedder, FakeRecallStore

    store = FakeRecallStore(FakeEmbedder())
    may7 = datetime(2023, 5, 7, 10, 0, tzinfo=UTC)
    store.add_turn("t1", "alice", "Let us talk about gardens", platform_message_id="m1")
    store.add_turn("t1", "alice", "The roses finally bloomed", platform_message_id="m2", occurred_at=may7)
    store.add_turn("t1", "alice", "I adopted a greyhound named Pixel", platform_message_id="m3")
    store.add_summary("t1", "Alice talked about her gardens and roses.", 1, 2)
    store.add_summary("t1", "Small talk about the weather.", 3, 3, episode_id="t1#2")
    citation = Citation(source="fact", thread_id="t1", event_id="t1:3", platform_message_id="m3")
    store.facts.append(("alice", FoundFact(1, "t1", None, "alice has a dog, a greyhound", "identity", 0.0, citation)))
    recorder = HopRecorder(store)
    recall = Recall(recorder, FakeEmbedder())
    result = recall("alice", "gardens dog on 7 May 2023", limit=5)
    hops = recorder.hops[-1]
    assert hops.events == ("t1:3",) and hops.ranges == (("t1", 1, 2),) and hops.episodes == ("t1#1",)
    period = recorder.periods[-1]
    assert period is not None and period.first == may7.date()
    assert result.hits[0].citation.platform_message_id == "m2"  # sent on the day asked about
    # The fact's source turn is in the first stage's pool too: it counts once.
    turns = [h.citation.platform_message_id for h in result.hits if h.kind == "message"]
    assert "m3" in turns and len(turns) == len(set(turns))
    # A messages-only read asks for no facts, so facts add no hop there.
    recall("alice", "gardens", scope=Scope.MESSAGES)
    assert recorder.hops[-1].events == () and recorder.periods[-1] is None


class QueryVectors:
    """Wraps the fake store and keeps the query vector each candidate search was given."""

    def __init__(self, store):
        self.store = store
        self.turns: list[np.ndarray] = []
        self.summaries: list[np.ndarray] = []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def turn_candidates(self, threads, lexemes, qvec, limit, period):
        self.turns.append(qvec)
        return self.store.turn_candidates(threads, lexemes, qvec, limit, period)

    def summary_candidates(self, threads, lexemes, qvec, limit):
        self.summaries.append(qvec)
        return self.store.summary_candidates(threads, lexemes, qvec, limit)


def test_every_search_takes_the_one_query_vector_embedded_once():
    """Turns, summaries and the hop all search with the embedder's vector (the query encoder, in
    the composition root), computed once per recall."""
    from chatmem.memory.recall import Hops, Recall
    from tests.fakes import FakeEmbedder, FakeRecallStore

    store = FakeRecallStore(FakeEmbedder())
    store.add_turn("t1", "alice", "I adopted a greyhound named Pixel", platform_message_id="m1")
    store.add_turn("t1", "alice", "The roses finally bloomed", platform_message_id="m2")
    store.add_summary("t1", "Alice adopted a dog.", 1, 1)

    class Hopped(QueryVectors):
        hops: list[np.ndarray] = []

        def hop_turns(self, threads, lexemes, qvec, limit, hops: Hops):
            self.hops.append(qvec)
            return self.store.hop_turns(threads, lexemes, qvec, limit, hops)

    spy, calls = Hopped(store), []
    encoder = FakeEmbedder()
    embed = encoder.embed
    # Not the store's own vectors for the same text, so a vector from elsewhere would show.
    encoder.embed = lambda texts: (calls.append(list(texts)), embed(["greyhound " + t for t in texts]))[1]  # type: ignore[method-assign]
    result = Recall(spy, encoder)("alice", "what dog did she adopt", limit=2)
    want = embed(["greyhound what dog did she adopt"])[0]
    assert calls == [["what dog did she adopt"]]
    assert all(np.allclose(v[-1], want) for v in (spy.turns, spy.summaries, spy.hops))
    assert result.hits[0].citation.platform_message_id == "m1"


class CallOrder:
    """Wraps the fake store and keeps the order in which recall starts and runs its searches."""

    def __init__(self, store):
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def ahead(self, work):
        self.calls.append("ahead")
        return self.store.ahead(work)

    def turn_candidates(self, *args):
        self.calls.append("turns")
        return self.store.turn_candidates(*args)

    def summary_candidates(self, *args):
        self.calls.append("summaries")
        return self.store.summary_candidates(*args)


class AtOnce(CallOrder):
    """A store with a spare connection free at once: work handed ahead starts there and then."""

    def ahead(self, work):
        self.calls.append("ahead")
        done = work()
        return Inline(lambda: done)


@pytest.mark.parametrize("store_kind", [CallOrder, AtOnce])
def test_the_turn_search_starts_before_the_summary_search_and_gives_the_same_answer(store_kind):
    from chatmem.memory.recall import Recall
    from tests.fakes import FakeEmbedder, FakeRecallStore

    store = FakeRecallStore(FakeEmbedder())
    store.add_turn("t1", "alice", "I adopted a greyhound named Pixel", platform_message_id="m1")
    store.add_turn("t1", "alice", "The roses finally bloomed", platform_message_id="m2")
    store.add_summary("t1", "Alice adopted a dog.", 1, 1)
    spy = store_kind(store)
    answer = Recall(spy, FakeEmbedder())("alice", "what dog did she adopt", limit=2)
    # Handed to the store before the summary search; when it runs is the store's to say (a
    # serial store runs it when asked for, `recall_parallel`).
    if store_kind is AtOnce:
        assert spy.calls == ["ahead", "turns", "summaries"]
    else:
        assert spy.calls == ["ahead", "summaries", "turns"]
    alone = Recall(store, FakeEmbedder())("alice", "what dog did she adopt", limit=2)
    assert answer == alone and answer.hits[0].citation.platform_message_id == "m1"


class CancelSpy:
    def __init__(self, work):
        self.work, self.cancelled, self.taken = work, False, False

    def result(self):
        self.taken = True
        return self.work()

    def cancel(self):
        self.cancelled = True


def test_a_read_that_fails_cancels_the_turn_search_it_started():
    from chatmem.memory.recall import Recall
    from tests.fakes import FakeEmbedder, FakeRecallStore

    store = FakeRecallStore(FakeEmbedder())
    store.add_turn("t1", "alice", "I adopted a greyhound named Pixel", platform_message_id="m1")
    store.add_summary("t1", "Alice adopted a dog.", 1, 1)

    class Recording(CallOrder):
        def ahead(self, work):
            self.pending = CancelSpy(work)
            return self.pending

    class Failing(Recording):
        def summary_candidates(self, *args):
            raise RuntimeError("the summary search failed")

    spy = Failing(store)
    with pytest.raises(RuntimeError, match="summary search failed"):
        Recall(spy, FakeEmbedder())("alice", "what dog did she adopt")
    assert spy.pending.cancelled and not spy.pending.taken
    ok = Recording(store)
    assert Recall(ok, FakeEmbedder())("alice", "what dog did she adopt").hits
    assert ok.pending.taken  # the cancel that follows is a no-op for work already taken


def test_a_scope_reads_its_nearest_turns_through_the_graph_only_when_large_and_a_fair_share():
    from chatmem.adapters.recall_pg import EXACT_SCAN_MAX, searches_graph

    # docs/benchmarks.md, 1M messages: 25,000 in scope took 29 ms exact against 121 ms through
    # HNSW; 250,000 took 322 against 121.
    assert not searches_graph(25_000, 1_000_000)
    assert searches_graph(250_000, 1_000_000)
    assert not searches_graph(EXACT_SCAN_MAX, EXACT_SCAN_MAX)  # the whole table, and still small
    assert searches_graph(EXACT_SCAN_MAX + 1, EXACT_SCAN_MAX + 1)
    assert not searches_graph(200_000, 10_000_000)  # 2% of the table: the graph visits 50 rows per turn found
    assert not searches_graph(10**6, -1)  # a table never analysed: no estimate, exact
