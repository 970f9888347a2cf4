"""Recall's indexing of dates and its second hop on real Postgres: relative dates resolved into
the full-text vector (the shown text unchanged), turns of the day a question names, of the
summaries' ranges and of fact sources brought into the pool, the author a query names; and how
the first stage reads a scope: BM25's figures, ties, plans, the vector path, and the text index
that holds short turns' vectors (long turns found beside it)."""

import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.memory.dates import day
from chatmem.memory.recall import Hops
from chatmem.memory.recall_tool import format_hits
from chatmem.schemas.read import Scope
from tests.conftest import scalar
from tests.integration.test_episodes import Driver
from tests.integration.test_read_path import conversation

pytestmark = pytest.mark.integration
MAY8 = datetime(2023, 5, 8, 10, 0, tzinfo=UTC)  # a Monday
JUNE = datetime(2023, 6, 20, 10, 0, tzinfo=UTC)

LINES = [
    "I ran a charity race yesterday, it was exhausting.",
    "Well done! Which charity was it for?",
    "A mental health charity, my cousin organised it.",
]
LATER = [
    "Do you know a good pasta recipe?",
    "Try garlic, olive oil and chilli.",
]


def remember(container):
    d = Driver(container)
    # Two sittings six weeks apart.
    events = conversation("race", "mel", LINES) + conversation("race", "mel", LATER, start=10)
    at = [MAY8 + timedelta(minutes=i) for i in range(len(LINES))] + [JUNE + timedelta(minutes=i) for i in range(2)]
    d.publish([e.model_copy(update={"occurred_at": t}) for e, t in zip(events, at, strict=True)])
    d.advance("race")
    return container


@pytest.fixture
def memory(container):
    return remember(container)


def test_relative_dates_are_indexed_but_not_shown(memory):
    c = memory
    with c.pool.connection() as conn:
        row = conn.execute("SELECT text, dates FROM messages WHERE thread_id = 'race' AND seq = 1").fetchone()
    assert row == (LINES[0], "7 May 2023")
    # The date is in the full-text vector, so a question naming it matches.
    assert scalar(c, "SELECT count(*) FROM messages WHERE tsv @@ to_tsquery('english', '7 & may & 2023')") == 1
    hit = c.recall("mel", "charity race on 7 May 2023", limit=3).hits[0]
    assert hit.citation.platform_message_id == "race-m0" and "[7 May" not in hit.snippet


def test_a_server_in_another_time_zone_gives_the_same_days_and_times(settings_factory):
    """A message's day is its UTC day, whatever the server's TimeZone (an external server's
    setting, or the machine's zone that initdb copied). At UTC+14 the first message, sent at 10:00
    UTC on 8 May, was read back as 9 May 00:00: its "yesterday" was indexed as 8 May, where a
    question naming 7 May looks, and recall showed its time 14 hours on."""
    settings = settings_factory()
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(sql.SQL("ALTER DATABASE {} SET timezone = 'Pacific/Kiritimati'").format(sql.Identifier(name)))
    c = Container(settings, ServiceUrls(settings.database_url, settings.redis_url, False, False))
    try:
        remember(c)
        with c.pool.connection() as conn:
            row = conn.execute("SELECT text, dates FROM messages WHERE thread_id = 'race' AND seq = 1").fetchone()
        assert row == (LINES[0], "7 May 2023")
        found = c.recall("mel", "charity race on 7 May 2023", limit=3)
        assert found.hits[0].citation.occurred_at == MAY8
        assert "2023-05-08 10:00" in format_hits(found)
    finally:
        c.close()


def test_second_hop_turns_join_the_pool(memory):
    c = memory
    reader = c.recall_reader
    q = "garlic"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    event = scalar(c, "SELECT event_id FROM messages WHERE thread_id = 'race' AND seq = 2")
    may8 = day(MAY8.date())
    hops = Hops(ranges=(("race", 1, 1),), events=(event,))
    with reader.session():
        alone, stats = reader.turn_candidates(["race"], lexemes, qvec, 1, None)
        hopped = reader.hop_turns(["race"], lexemes, qvec, 1, hops)
        dated, _ = reader.turn_candidates(["race"], lexemes, qvec, 1, may8)
        assert reader.hop_turns(["race"], lexemes, qvec, 1, Hops()) == []
    assert {t.seq for t in alone} == {5}  # "Try garlic, ...": the lexical and the dense top 1
    assert {t.seq for t in hopped} == {1, 2}  # the summary's range and the fact's source
    assert stats.docs == 5  # collection figures stay those of the whole scope
    assert {t.seq for t in dated} - {5} and all(t.seq in (1, 2, 3, 5) for t in dated)  # a turn of 8 May
    # A hop turn is read as a first-stage one is: same similarity and term frequencies.
    both = reader.hop_turns(["race"], lexemes, qvec, 5, Hops(events=(event,)))
    first, _ = reader.turn_candidates(["race"], lexemes, qvec, 5, None)
    assert [t.seq for t in both] == [2] and both[0] == {t.seq: t for t in first}[2]


def test_the_author_a_query_names_is_flagged(memory):
    c = memory
    reader = c.recall_reader
    q = "what did Mel say about the race?"
    with reader.session():
        turns, _ = reader.turn_candidates(["race"], reader.lexemes(q), c.query_embedder.embed([q])[0], 10, None)
    flagged = {t.seq: t.author_named for t in turns}
    assert flagged[1] and not flagged[2]  # mel wrote turn 1, the bot turn 2


def test_collection_figures_are_those_of_the_scope_counted_row_by_row(memory):
    # BM25's figures come from SQL (docs from the threads' counts, df through the rows matching
    # the query); here they are counted from every message's lexemes in Python.
    c = memory
    reader = c.recall_reader
    q = "charity race with garlic pasta"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    with c.pool.connection() as conn:
        rows = [set(r[0]) for r in conn.execute("SELECT tsvector_to_array(tsv) FROM messages WHERE thread_id = 'race'")]
        lengths = [r[0] for r in conn.execute("SELECT length(tsv) FROM messages WHERE thread_id = 'race'")]
    with reader.session():
        _, stats = reader.turn_candidates(["race"], lexemes, qvec, 3, None)
    assert stats.docs == len(rows) == 5
    assert stats.df == tuple(sum(lex in r for r in rows) for lex in lexemes) and max(stats.df) == 3
    assert stats.avg_len == pytest.approx(sum(lengths) / len(lengths))


def test_document_frequencies_keep_the_query_s_order_and_count_a_backslash_lexeme_as_no_match(memory):
    c = memory
    reader = c.recall_reader
    # As the reader's caller may pass them: a lexeme no query can hold sits between two others.
    lexemes = ["race", "a\\b", "chariti", "zebra"]
    qvec = c.query_embedder.embed(["charity race"])[0]
    with c.pool.connection() as conn:
        rows = [set(r[0]) for r in conn.execute("SELECT tsvector_to_array(tsv) FROM messages WHERE thread_id = 'race'")]
    with reader.session():
        _, turns_stats = reader.turn_candidates(["race"], lexemes, qvec, 3, None)
        _, summary_stats = reader.summary_candidates(["race"], lexemes, qvec, 3)
    assert turns_stats.df == (sum("race" in r for r in rows), 0, sum("chariti" in r for r in rows), 0)
    assert turns_stats.df[0] >= 1 and turns_stats.df[2] >= 2
    assert len(summary_stats.df) == 4 and summary_stats.df[1] == summary_stats.df[3] == 0


def test_the_first_stage_run_ahead_with_large_scope_settings_finds_the_same_turns(memory, monkeypatch):
    # A scope large enough (`searches_graph`) takes the HNSW index in the first stage, with
    # settings local to its transaction; run ahead, that transaction is the spare connection's own.
    from chatmem.adapters import recall_pg

    c = memory
    reader = c.recall_reader
    q = "charity race"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]

    def first() -> tuple[int, set[int]]:
        with reader._conn() as conn:
            pid = conn.info.backend_pid
        turns, _ = reader.turn_candidates(["race"], lexemes, qvec, 10, None)
        return pid, {t.seq for t in turns}

    with reader.session():
        exact = first()[1]
    monkeypatch.setattr(recall_pg, "searches_graph", lambda size, table_rows: True)
    c.pool.resize(min_size=2, max_size=max(2, c.pool.max_size))
    c.pool.wait()  # a spare connection is there
    with reader.session():
        mine = first()[0]
        pending = reader.ahead(first)
        time.sleep(0.2)  # the read's own queries, meanwhile
        pid, found = pending.result()
    assert pid != mine and found == exact == {1, 2, 3, 4, 5}


def test_recall_gives_the_same_answer_with_its_searches_side_by_side_or_one_after_another(memory):
    import dataclasses

    c = memory
    c.pool.resize(min_size=2, max_size=max(2, c.pool.max_size))
    c.pool.wait()
    side_by_side, one_by_one = c.recall, dataclasses.replace(c.recall, store=c.recall_reader.serial())
    for q in ("charity race", "what pasta recipe did mel get?", "who organised the race on 7 May 2023?"):
        for scope in (Scope.ALL, Scope.MESSAGES):
            assert side_by_side("mel", q, scope=scope, limit=5) == one_by_one("mel", q, scope=scope, limit=5)


# Lexemes the english parser keeps (repeated, stemmed, accented, non-Latin) and, as a vector
# literal, lexemes with the quote and the backslash its text form doubles.
COUNTED = [
    "to_tsvector('english', %(t)s)",
    "%(t)s::tsvector",
]
TEXTS = [
    ("Jon's studio: Jon runs it, Jon's running it and ran it. Café, CAFÉ, 東京 東京 🎉", "english"),
    ("'it''s':1,4,9 'a\\\\b':2 'o''brien''s':3A,7 plain:5 'sp ace':6", "literal"),
]


@pytest.mark.parametrize(("text", "kind"), TEXTS)
def test_term_counts_read_from_the_text_vector_are_postgres_own(container, text, kind):
    # Recall reads a row's term frequencies from its text vector cut to the query's lexemes, in
    # text form (adapters/recall_pg.py); Postgres's own count is the number of positions.
    from chatmem.adapters.recall_pg import _TERM_FREQUENCIES, term_counts

    vector = COUNTED[0] if kind == "english" else COUNTED[1]
    with container.pool.connection() as conn:
        lexemes = conn.execute(f"SELECT tsvector_to_array({vector})", {"t": text}).fetchone()[0]
        asked = [*lexemes, "absent"]
        params = {"t": text, "lex": asked}
        own = conn.execute(
            f"""SELECT ARRAY(SELECT coalesce(array_length(u.positions, 1), 0)
                             FROM unnest(%(lex)s::text[]) WITH ORDINALITY x(l, i)
                             LEFT JOIN unnest({vector}) u ON u.lexeme = x.l ORDER BY x.i)""",
            params,
        ).fetchone()[0]
        shown = conn.execute(
            f"SELECT {_TERM_FREQUENCIES.format(t='v')} FROM (SELECT {vector} AS tsv) v", params
        ).fetchone()[0]
        cut = conn.execute(
            f"SELECT {_TERM_FREQUENCIES.format(t='v')} FROM (SELECT {vector} AS tsv) v",
            {"t": text, "lex": lexemes[:1]},
        ).fetchone()[0]
    assert term_counts(shown, asked) == tuple(own)
    assert max(own) >= 2 and own[-1] == 0  # a repeated lexeme is counted; one it lacks is 0
    if kind == "literal":
        assert {"it's", "a\\b", "o'brien's", "sp ace"} <= set(lexemes)
    # Asked for one lexeme, the count is the same (a weight stored with another lexeme may bring
    # that one back too; only the asked lexemes are read).
    assert term_counts(cut, asked[:1]) == (own[0],)


@pytest.fixture
def repeats(container):
    # Eight turns with one text: each ties with every other on text rank and on vector.
    d = Driver(container)
    d.publish(conversation("again", "mel", ["Pasta night again!"] * 8))
    d.advance("again")
    return container


PLANS = ((), ("SET enable_bitmapscan = off", "SET enable_indexscan = off"), ("SET enable_seqscan = off",))


def under_each_plan(reader, read):
    """What `read()` returns with the reader's connection steered to each of PLANS in turn."""
    out = []
    with reader.session():
        for plan in PLANS:
            with reader._conn() as conn:
                for setting in ("RESET ALL", *plan):
                    conn.execute(setting)
            out.append(read())
        with reader._conn() as conn:
            conn.execute("RESET ALL")
    return out


def test_tied_turns_enter_the_pool_newest_first_whatever_the_plan(repeats):
    c = repeats
    reader = c.recall_reader
    q = "pasta night"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    seqs = sorted(scalar(c, "SELECT array_agg(seq) FROM messages WHERE thread_id = 'again'"))

    def read():
        first, _ = reader.turn_candidates(["again"], lexemes, qvec, 2, None)
        hop = reader.hop_turns(["again"], lexemes, qvec, 2, Hops(ranges=(("again", seqs[0], seqs[-1]),)))
        return {t.seq for t in first}, {t.seq for t in hop}

    found = under_each_plan(reader, read)
    newest = set(seqs[-2:])
    assert found == [(newest, newest)] * len(PLANS)


def test_the_mean_length_of_a_large_scope_is_its_threads_newest_rows_whatever_the_plan(memory, monkeypatch):
    from chatmem.adapters import recall_pg

    c = memory
    reader = c.recall_reader
    monkeypatch.setattr(recall_pg, "AVG_LEN_ROWS", 2)  # the thread's five turns are a large scope now
    q = "charity race"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    with c.pool.connection() as conn:
        rows = conn.execute("SELECT length(tsv) FROM messages WHERE thread_id = 'race' ORDER BY seq DESC")
        newest = [r[0] for r in rows]
    means = under_each_plan(reader, lambda: reader.turn_candidates(["race"], lexemes, qvec, 3, None)[1].avg_len)
    assert newest[:2] != newest[-2:]  # the oldest two would give another figure
    assert means == [pytest.approx(sum(newest[:2]) / 2)] * len(PLANS)


def test_a_scope_within_the_mean_length_cap_counts_every_row(memory, repeats, monkeypatch):
    from chatmem.adapters import recall_pg

    c = memory
    reader = c.recall_reader
    # 5 + 8 turns within a cap of 13: every row counts, though an equal share would be 6 a thread.
    monkeypatch.setattr(recall_pg, "AVG_LEN_ROWS", 13)
    q = "charity race"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    with c.pool.connection() as conn:
        lengths = [r[0] for r in conn.execute("SELECT length(tsv) FROM messages WHERE thread_id IN ('race', 'again')")]
    read = lambda: reader.turn_candidates(["race", "again"], lexemes, qvec, 3, None)[1].avg_len  # noqa: E731
    assert len(lengths) == 13
    assert under_each_plan(reader, read) == [pytest.approx(sum(lengths) / 13)] * len(PLANS)


@pytest.fixture
def crowded(memory):
    # Twenty long threads of other users, 10,000 turns that all say "pasta", written straight
    # into the tables (the pipeline would take minutes), with the statistics a live database has.
    with memory.pool.connection() as conn:
        conn.execute(
            """INSERT INTO threads (thread_id, generation, message_count, episode_count)
               SELECT 'other' || t, 1, 500, 1 FROM generate_series(1, 20) t"""
        )
        conn.execute(
            """INSERT INTO messages (thread_id, generation, seq, event_id, stream_pos, episode_id, user_id, role,
                                     text, occurred_at)
               SELECT 'other' || t, 1, s, 'other' || t || '-' || s, 1000000 + t * 1000 + s, 'other' || t || '#1',
                      'u' || t % 7, 'user', 'Pasta with garlic for dinner, take ' || s, now()
               FROM generate_series(1, 20) t, generate_series(1, 500) s"""
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE messages")
    return memory


def _text_tests(plan: dict) -> list[tuple[float, float]]:
    """(estimated, actual) rows, per loop as EXPLAIN gives both, of each node of an EXPLAIN
    (ANALYZE, FORMAT JSON) plan that tests rows against the text query (not those testing one
    lexeme, which count document frequencies among the matches)."""
    keys = ("Filter", "Join Filter", "Recheck Cond", "Index Cond")
    conditions = " ".join(str(plan.get(k, "")) for k in keys)
    here = (
        [(plan["Plan Rows"], plan["Actual Rows"])]
        if "tsv @@" in conditions and "quote_literal" not in conditions
        else []
    )
    return here + [test for child in plan.get("Plans", []) for test in _text_tests(child)]


def test_the_planner_sees_the_text_query(crowded, monkeypatch):
    from chatmem.adapters import recall_pg

    c = crowded
    reader = c.recall_reader
    q = "pasta and garlic"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    scope = ["other1", "other2", "other3"]  # 1,500 turns of the 10,005 that match
    statements = []
    planned = recall_pg._planned
    monkeypatch.setattr(
        recall_pg, "_planned", lambda conn, sql, p: statements.append((sql, p)) or planned(conn, sql, p)
    )
    _, stats = reader.turn_candidates(scope, lexemes, qvec, 3, None)
    assert (stats.docs, stats.df) == (1500, (1500, 1500))
    with c.pool.connection() as conn:
        sql, params = statements[0]
        plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()[0][0]["Plan"]
    # How many rows match is known when planning, so a scope's matches are read the cheap way
    # (through the thread index once the table is large), never every user's through the text
    # index. A query built inside the statement was planned for 0.5% of the table (2 rows here).
    tests = _text_tests(plan)
    # (A plan never estimates fewer than one row: the long turns' branch finds none here.)
    assert tests and all(actual / 2 <= estimated <= max(actual * 2, 1) for estimated, actual in tests)


def test_a_scope_s_nearest_turns_go_through_the_graph_by_its_share_of_the_table(crowded, monkeypatch):
    from chatmem.adapters import recall_pg

    c = crowded
    reader = c.recall_reader
    rule = recall_pg.searches_graph
    seen: list[tuple[int, float, bool]] = []
    monkeypatch.setattr(recall_pg, "searches_graph", lambda *a: seen.append((*a, rule(*a))) or seen[-1][2])
    lexemes, qvec = reader.lexemes("pasta"), c.query_embedder.embed(["pasta"])[0]

    def choose() -> tuple[int, float, bool]:
        with reader.session():
            reader.turn_candidates(["other1", "other2"], lexemes, qvec, 5, None)
        return seen[-1]

    with c.pool.connection() as conn:
        table = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    size, table_rows, graph = choose()
    # The scope's size, and the table's from the planner's statistics (ANALYZE ran).
    assert size == 1000 and table_rows == pytest.approx(table, rel=0.05) and not graph
    monkeypatch.setattr(recall_pg, "EXACT_SCAN_MAX", 999)  # large enough, and a tenth of the table
    assert choose()[2]
    monkeypatch.setattr(recall_pg, "GRAPH_MIN_SHARE", 0.2)  # large enough, too small a share
    assert not choose()[2]


def test_recall_statements_are_planned_for_their_own_query(crowded):
    c = crowded
    reader = c.recall_reader
    # Past psycopg's threshold for preparing a statement and Postgres' five custom plans, after
    # which a prepared statement may get a generic plan, blind to the text query.
    with reader.session():
        for q in ["pasta and garlic", "charity race", "cousin organised"] * 4:
            lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
            reader.turn_candidates(["race"], lexemes, qvec, 3, None)
            reader.summary_candidates(["race"], lexemes, qvec, 3)
            reader.fact_candidates("mel", lexemes, 3)
        with reader._conn() as conn:
            generic = conn.execute(
                "SELECT statement FROM pg_prepared_statements WHERE generic_plans > 0 AND statement LIKE '%tsquery%'"
            ).fetchall()
    assert generic == []


def test_the_text_query_matches_each_lexeme_as_it_is(container):
    from chatmem.adapters.recall_pg import or_query

    query = or_query(["go", "it's", "a\\b"])
    with container.pool.connection() as conn:
        found = [
            conn.execute("SELECT array_to_tsvector(ARRAY[%s]) @@ %s::tsquery", (lexeme, query)).fetchone()[0]
            for lexeme in ("go", "it's", "a\\b", "it")
        ]
    assert found == [True, True, False, False]  # a lexeme with a backslash is left out


def test_a_large_scope_s_nearest_turns_searched_beside_give_the_same_candidates(memory, repeats, monkeypatch):
    from chatmem.adapters import recall_pg

    c = memory
    reader = c.recall_reader
    # CHATMEM_RECALL_PARALLEL=false: one connection, whatever the scope.
    serial = reader.serial()
    monkeypatch.setattr(serial, "ahead", lambda work: pytest.fail("a second connection"))

    def candidates(reader, q, period=None):
        lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
        with reader.session():
            turns, stats = reader.turn_candidates(["race", "again"], lexemes, qvec, 3, period)
        return sorted(turns, key=lambda t: (t.thread_id, t.seq)), stats

    queries = [("charity race",), ("pasta night",), ("what did we do on 8 May?", day(MAY8.date())), ("zebra",)]
    one_statement = [candidates(reader, *q) for q in queries]
    monkeypatch.setattr(recall_pg, "SPLIT_MIN", 0)  # these 13 turns are a large scope now
    beside = [candidates(reader, *q) for q in queries]
    assert beside == one_statement
    assert all(turns for turns, _ in beside) and one_statement[-1][1].df == (0,)  # "zebra": vectors only
    assert [candidates(serial, *q) for q in queries] == one_statement
    # The same on the HNSW path (`searches_graph`), the nearest turns on a spare connection.
    monkeypatch.setattr(recall_pg, "searches_graph", lambda size, table_rows: True)
    c.pool.resize(min_size=2, max_size=max(2, c.pool.max_size))
    c.pool.wait()  # a spare connection is there
    hnsw_beside = [candidates(reader, *q) for q in queries]
    monkeypatch.setattr(recall_pg, "SPLIT_MIN", 10**9)
    assert hnsw_beside == [candidates(reader, *q) for q in queries]


# A long turn: a story whose text vector's text form is over TEXT_INDEX_MAX bytes (checked below),
# kept out of the index that holds the short turns' vectors.
LONG_TURN = "Our zebra safari diary: " + " ".join(f"day{i} drove past waterhole{i} and campsite{i}" for i in range(40))


@pytest.fixture
def long_turn(memory):
    d = Driver(memory)
    d.publish(conversation("diary", "mel", [LONG_TURN, "What a trip!", "The zebra herd was my favourite part."]))
    d.advance("diary")
    return memory


def test_a_long_turn_s_text_matches_are_found_beside_the_short_ones(long_turn):
    from chatmem.adapters.recall_pg import TEXT_INDEX_MAX

    c = long_turn
    reader = c.recall_reader
    with c.pool.connection() as conn:
        sizes = dict(conn.execute("SELECT seq, octet_length(tsv::text) FROM messages WHERE thread_id = 'diary'"))
    assert sizes[1] > TEXT_INDEX_MAX >= max(sizes[2], sizes[3])
    q = "zebra safari"
    lexemes, qvec = reader.lexemes(q), c.query_embedder.embed([q])[0]
    with reader.session():
        turns, stats = reader.turn_candidates(["diary", "race"], lexemes, qvec, 10, None)
    # Both turns that say "zebra" are matched and counted, the long one and the short one.
    assert dict(zip(lexemes, stats.df, strict=True)) == {"zebra": 2, "safari": 1} and stats.docs == 8
    zebra = lexemes.index("zebra")
    assert {t.seq for t in turns if t.thread_id == "diary" and t.tf[zebra]} == {1, 3}
    hit = c.recall("mel", "zebra safari diary", limit=1).hits[0]
    assert hit.snippet.startswith("Our zebra safari") and not hit.archived  # its episode is still open


def test_a_scope_s_text_matches_are_read_from_the_index_alone(crowded, monkeypatch):
    from chatmem.adapters import recall_pg

    c = crowded
    reader = c.recall_reader
    with c.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("VACUUM messages")  # the visibility map a live table's old rows have
        index = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'messages_scope_text'").fetchone()[0]
    # The migration's bound is the one the statement spells.
    assert f"octet_length((tsv)::text) <= {recall_pg.TEXT_INDEX_MAX}" in index
    statements = []
    planned = recall_pg._planned
    monkeypatch.setattr(
        recall_pg, "_planned", lambda conn, sql, p: statements.append((sql, p)) or planned(conn, sql, p)
    )
    lexemes, qvec = reader.lexemes("pasta"), c.query_embedder.embed(["pasta"])[0]
    reader.turn_candidates(["other1", "other2"], lexemes, qvec, 3, None)
    with c.pool.connection() as conn:
        sql, params = statements[0]
        plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()[0][0]["Plan"]

    def scans(node: dict) -> list[tuple[str, str, int]]:
        here = [(node["Node Type"], node.get("Index Name", ""), node.get("Heap Fetches", 0))]
        return here + [s for child in node.get("Plans", []) for s in scans(child)]

    # The 1,000 turns are tested in the index; no row of the table is read for it.
    assert ("Index Only Scan", "messages_scope_text", 0) in scans(plan)


@pytest.mark.parametrize("words", ["digits", "pairs", "triples"])
def test_a_turn_just_within_the_text_bound_fits_the_index(container, words):
    from chatmem.adapters.recall_pg import TEXT_INDEX_MAX

    # Many short distinct lexemes give the largest stored vector for a text form's size (each
    # costs a fixed entry): the turn must still fit a btree entry with the longest thread id the
    # events allow, 128 letters of four bytes each.
    gen = {
        "digits": "string_agg(i::text, ' ')",
        "pairs": "string_agg(chr(97 + i / 26 % 26) || chr(97 + i % 26), ' ')",
        "triples": "string_agg(chr(97 + i / 676 % 26) || chr(97 + i / 26 % 26) || chr(97 + i % 26), ' ')",
    }[words]
    thread = "\U0001d49c" * 128  # a mathematical script A
    with container.pool.connection() as conn:
        text = conn.execute(f"SELECT {gen} FROM generate_series(1, 3000) i").fetchone()[0]
        # The longest prefix whose vector is within the bound.
        lo, hi = 1, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            size = conn.execute("SELECT octet_length(to_tsvector('english', %s)::text)", (text[:mid],)).fetchone()[0]
            lo, hi = (mid, hi) if size <= TEXT_INDEX_MAX else (lo, mid - 1)
        conn.execute("INSERT INTO threads (thread_id, generation) VALUES (%s, 1)", (thread,))
        conn.execute(
            """INSERT INTO messages (thread_id, generation, seq, event_id, stream_pos, episode_id, user_id, role,
                                     text, occurred_at)
               VALUES (%s, 1, 1, 'e', 1, 'ep', '', 'user', %s, now())""",
            (thread, text[:lo]),
        )
        stored = conn.execute("SELECT pg_column_size(tsv), octet_length(tsv::text) FROM messages").fetchone()
    assert stored[1] <= TEXT_INDEX_MAX and stored[0] > 1300  # as large a vector as the bound lets in
