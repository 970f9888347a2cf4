"""Facts with real mem0 on the real Postgres: conflict resolution, remember / forget, citations,
isolation between users, and retried jobs that write nothing twice."""

from datetime import timedelta

import pytest

from chatmem.memory.fact_jobs import write_episode_facts
from chatmem.schemas.events import InvalidEvent, MessageEvent
from tests.integration.test_episodes import Driver
from tests.scripted import T0, command

pytestmark = pytest.mark.integration


def say(thread, user, n, text, minute):
    return MessageEvent(
        event_id=f"{thread}-{n}", thread_id=thread, user_id=user, text=text, occurred_at=T0 + timedelta(minutes=minute)
    )


def facts(c, user, history=False):
    return [
        (f["category"], f["key"], f["value"], f["is_active"], f["archived_reason"])
        for f in c.fact_store.user_facts(user, include_history=history)
    ]


def test_name_conflicts_resolve_by_confidence_and_keep_history(container):
    d = Driver(container)
    d.publish(
        [
            say("t", "alex", 1, "Hello! My name is Alex.", 0),
            command("t", "close_episode", 1, 1),
            say("t", "alex", 2, "You can call me Al.", 2),
            command("t", "close_episode", 2, 3),
            say("t", "alex", 3, "For the forms: my full name is Alexander.", 4),
            command("t", "close_episode", 3, 5),
        ]
    )
    d.advance("t")
    d.run_jobs(with_facts=True)
    assert facts(container, "alex") == [("identity", "name", "Alexander", True, None)]
    assert facts(container, "alex", history=True) == [
        ("identity", "name", "Alex", False, "replaced"),
        ("identity", "name", "Alexander", True, None),
    ]  # "call me Al" (confidence 0.6 < 0.9) was ignored
    hits = container.mem0.search("what is my name", user_id="alex")
    assert [h["memory"] for h in hits] == ["For the forms: my full name is Alexander."]
    meta = hits[0]["metadata"]
    assert meta["thread_id"] == "t" and meta["episode_id"] == "t#3" and meta["source_event_ids"] == ["t-3"]


def test_remember_and_forget_round_trip_through_events(container):
    d = Driver(container)
    d.publish(
        [
            say("t", "ann", 1, "Let's plan dinner.", 0),
            command("t", "remember", 1, 1, "ann", text="I am vegetarian"),
            command("t", "forget", 2, 2, "ann", text="unicorns"),
        ]
    )
    d.advance("t")
    d.run_jobs()
    assert [f[2] for f in facts(container, "ann")] == ["I am vegetarian"]
    assert container.mem0.search("vegetarian", user_id="ann")
    d.publish([command("t", "forget", 3, 3, "ann", text="vegetarian")])
    d.advance("t")
    d.run_jobs()
    with container.pool.connection() as conn:
        details = dict(
            conn.execute(
                "SELECT event_id, detail FROM commands_applied WHERE command IN ('remember', 'forget')"
            ).fetchall()
        )
    assert details["t-cmd-1"].startswith("remember: instruction/")
    assert details["t-cmd-2"] == "forget: nothing matched"
    assert details["t-cmd-3"] == "forget: archived 1 fact(s)"
    assert facts(container, "ann") == []
    assert facts(container, "ann", history=True)[0][4] == "forgotten"
    assert container.mem0.search("vegetarian", user_id="ann") == []


def test_a_fact_typed_with_a_phone_s_apostrophe_is_stored_plain_and_forgotten_either_way(container):
    d = Driver(container)
    d.publish(
        [
            say("t", "cy", 1, "I\u2019m from Saint Peter\u2019s.", 0),  # as a phone's keyboard types it
            say("t", "cy", 2, "I live in O'Fallon.", 1),
            command("t", "close_episode", 1, 2, "cy"),
        ]
    )
    d.advance("t")
    d.run_jobs(with_facts=True)
    assert sorted(f[2] for f in facts(container, "cy")) == ["O'Fallon", "Saint Peter's"]
    d.publish(
        [
            command("t", "forget", 2, 3, "cy", text="Saint Peter's"),
            command("t", "forget", 3, 4, "cy", text="O\u2019Fallon"),
        ]
    )
    d.advance("t")
    d.run_jobs()
    assert facts(container, "cy") == []
    assert [f[4] for f in facts(container, "cy", history=True)] == ["forgotten", "forgotten"]


def test_users_never_see_each_others_facts(container):
    d = Driver(container)
    d.publish(
        [
            say("a", "alice", 1, "I live in Lisbon and I'm allergic to peanuts.", 0),
            command("a", "close_episode", 1, 1, "alice"),
            say("b", "bob", 1, "I live in Riga.", 0),
            command("b", "close_episode", 1, 1, "bob"),
        ]
    )
    d.advance("a")
    d.advance("b")
    d.run_jobs(with_facts=True)
    bob_sees = [h["memory"] for h in container.mem0.search("where do I live, allergies", user_id="bob", limit=10)]
    assert bob_sees == ["I live in Riga."]
    assert all(f[2] != "Lisbon" for f in facts(container, "bob"))
    for hostile in ["*", "%", "' OR 1=1 --", "alice' --", ""]:
        with pytest.raises(InvalidEvent):
            container.mem0.search("anything", user_id=hostile)
        assert container.fact_store.user_facts(hostile) == []


def test_a_retried_facts_job_writes_nothing_twice(container):
    d = Driver(container)
    d.publish([say("t", "zoe", 1, "I work at Acme Robotics.", 0), command("t", "close_episode", 1, 1, "zoe")])
    d.advance("t")
    d.run_jobs()  # the final summary
    first = write_episode_facts(
        container.fact_store, container.mem0, container.llm("facts"), thread_id="t", generation=1, episode_id="t#1"
    )
    assert first == {"insert": 1}
    # A crash after the mem0 write, before its id and the ledger entry were recorded: the retry
    # must find mem0's copy instead of adding a second one.
    with container.pool.connection() as conn:
        conn.execute("DELETE FROM fact_ledger")
        conn.execute("UPDATE facts SET mem0_id = 'pending'")
    again = write_episode_facts(
        container.fact_store, container.mem0, container.llm("facts"), thread_id="t", generation=1, episode_id="t#1"
    )
    assert again == {"same": 1}
    assert write_episode_facts(
        container.fact_store, container.mem0, container.llm("facts"), thread_id="t", generation=1, episode_id="t#1"
    )["duplicate"]
    assert len(container.mem0.memory.get_all(filters={"user_id": "zoe"})["results"]) == 1
    assert len(facts(container, "zoe", history=True)) == 1
    # A crash after the Postgres commit, before mem0 was written at all: the retry writes it.
    with container.pool.connection() as conn:
        mem0_id = conn.execute("SELECT mem0_id FROM facts").fetchone()[0]
        conn.execute("DELETE FROM fact_ledger")
        conn.execute("UPDATE facts SET mem0_id = NULL")
    container.mem0.delete(mem0_id)
    write_episode_facts(
        container.fact_store, container.mem0, container.llm("facts"), thread_id="t", generation=1, episode_id="t#1"
    )
    assert len(container.mem0.memory.get_all(filters={"user_id": "zoe"})["results"]) == 1


def test_postgres_briefly_unavailable_is_retried_without_duplicates(settings_factory, embedded):
    from chatmem.adapters.errors import TRANSIENT_ERRORS
    from chatmem.adapters.services import ServiceUrls
    from chatmem.bootstrap import Container

    s = settings_factory(db_timeout_s=2)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    d = Driver(c)
    d.publish([say("t", "kim", 1, "I live in Oslo. I prefer trains.", 0), command("t", "close_episode", 1, 1, "kim")])
    d.advance("t")
    d.run_jobs()
    c.mem0  # noqa: B018 - built while Postgres is up, as in a running worker
    embedded["pg"].stop()
    try:
        with pytest.raises(TRANSIENT_ERRORS):  # what makes the facts task retry with backoff
            write_episode_facts(c.fact_store, c.mem0, c.llm("facts"), thread_id="t", generation=1, episode_id="t#1")
    finally:
        embedded["pg"].start()
    assert write_episode_facts(c.fact_store, c.mem0, c.llm("facts"), thread_id="t", generation=1, episode_id="t#1") == {
        "insert": 2
    }
    assert write_episode_facts(c.fact_store, c.mem0, c.llm("facts"), thread_id="t", generation=1, episode_id="t#1")[
        "duplicate"
    ]
    assert sorted(f[2] for f in facts(c, "kim", history=True)) == ["Oslo", "trains"]
    assert len(c.mem0.memory.get_all(filters={"user_id": "kim"})["results"]) == 2
    c.close()


def test_replay_replaces_only_that_threads_facts(container):

    d = Driver(container)
    d.publish(
        [
            say("a", "max", 1, "I live in Porto.", 0),
            command("a", "close_episode", 1, 1, "max"),
            say("b", "max", 1, "I work at Globex.", 0),
            command("b", "close_episode", 1, 1, "max"),
            say("c", "eva", 1, "I live in Graz.", 0),
            command("c", "close_episode", 1, 1, "eva"),
        ]
    )
    for t in "abc":
        d.advance(t)
    d.run_jobs(with_facts=True)
    before = {f["key"]: f for f in container.fact_store.user_facts("max")}
    eva_before = container.fact_store.user_facts("eva")
    container.replay("a", container.llm("maintenance"), "replay")
    after = {f["key"]: f for f in container.fact_store.user_facts("max")}
    # re-derived unchanged: the same row and mem0 entry, now belonging to generation 2
    assert after["location"]["id"] == before["location"]["id"] and after["location"]["value"] == "Porto"
    with container.pool.connection() as conn:
        assert conn.execute("SELECT generation FROM facts WHERE id = %s", (after["location"]["id"],)).fetchone()[0] == 2
    assert after["employer"] == before["employer"]  # thread b untouched
    assert container.fact_store.user_facts("eva") == eva_before  # another user untouched
    assert all(f["is_active"] for f in container.fact_store.user_facts("max", include_history=True))
    # A fact the rebuild no longer derives is retired, in Postgres and in mem0: simulate a rule
    # change by planting one the log does not support.
    from chatmem.memory.fact_jobs import store_fact
    from chatmem.memory.facts import FactCandidate

    ghost = FactCandidate("preference", "opera", "opera", 0.8, 0.5, "I love opera.")
    store_fact(
        container.fact_store,
        container.mem0,
        user_id="max",
        thread_id="a",
        generation=2,
        episode_id="a#1",
        fact=ghost,
        event_ids=[],
        source="extracted",
    )
    with container.pool.connection() as conn:
        conn.execute("UPDATE facts SET generation = 1 WHERE key = 'opera'")
    container.replay("a", container.llm("maintenance"), "replay")
    retired = [f for f in container.fact_store.user_facts("max", include_history=True) if f["key"] == "opera"]
    assert [(f["is_active"], f["archived_reason"]) for f in retired] == [(False, "rebuilt")]
    mem = container.mem0.memory.get_all(filters={"user_id": "max"})["results"]
    assert sorted(m["memory"] for m in mem) == ["I live in Porto.", "I work at Globex."]
    assert {m["id"] for m in mem} == {after["location"]["mem0_id"], after["employer"]["mem0_id"]}


def test_with_an_llm_configured_extraction_is_the_models_in_the_same_schema(container):
    from chatmem.memory.prompts import FactItem, FactList

    class ModelLike:
        """Stands in for an OpenAI-compatible model (what the unit tests check against HTTP)."""

        model = "model-like"

        def complete(self, prompt, response_model):
            assert prompt.name == "extract_facts" and response_model is FactList
            (line,) = prompt.input["messages"]
            return FactList(
                facts=[
                    FactItem(
                        seq=line["seq"],
                        category="preference",
                        key="diet",
                        value="vegan",
                        confidence=0.9,
                        importance=0.8,
                        text=line["text"],
                    ),
                    FactItem(
                        seq=999,
                        category="identity",
                        key="name",
                        value="Ghost",
                        confidence=1,
                        importance=1,
                        text="not in this episode",
                    ),
                ]
            )

    d = Driver(container)
    d.publish([say("t", "lea", 1, "No animal products for me, ever.", 0), command("t", "close_episode", 1, 1, "lea")])
    d.advance("t")
    d.run_jobs()
    out = write_episode_facts(
        container.fact_store, container.mem0, ModelLike(), thread_id="t", generation=1, episode_id="t#1"
    )
    assert out == {"insert": 1}  # the fact attributed to no message of the episode is dropped
    assert facts(container, "lea") == [("preference", "diet", "vegan", True, None)]
    assert [h["memory"] for h in container.mem0.search("diet", user_id="lea")] == ["No animal products for me, ever."]


def test_the_sweeper_finds_a_facts_job_lost_after_its_final_summary(container):
    d = Driver(container)
    d.publish([say("t", "zoe", 1, "I work at Acme Robotics.", 0), command("t", "close_episode", 1, 1, "zoe")])
    d.advance("t")
    d.run_jobs()  # the final summary; its facts job was never run (its worker was killed holding it)
    store = container.fact_store
    assert store.missing_facts(60) == []  # the job may still be running
    with container.pool.connection() as conn:
        conn.execute("UPDATE summaries SET created_at = created_at - interval '61 seconds' WHERE kind = 'final'")
    assert store.missing_facts(60) == [("t", 1, "t#1")]
    write_episode_facts(store, container.mem0, container.llm("facts"), thread_id="t", generation=1, episode_id="t#1")
    assert store.missing_facts(60) == []


def test_a_users_memories_are_found_when_the_planner_takes_the_vector_index(settings_factory):
    # A large memory table, in miniature: with sequential scans priced out, the planner would take
    # mem0's HNSW index (as it does by itself at 100,000 memories), which filters by user only
    # after taking the nearest rows of all users.
    import uuid

    import numpy as np
    import psycopg

    from chatmem.adapters.services import ServiceUrls
    from chatmem.bootstrap import Container

    s = settings_factory()
    with psycopg.connect(s.database_url, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(f"ALTER DATABASE {name} SET enable_seqscan = off")  # this test's own database
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        users, each, query = 600, 5, "what do I like"
        # Every memory close to the query (mem0 drops hits under 0.1 similarity), none the same.
        noise = np.random.default_rng(0).normal(size=(users * each, c.embedder.dim)) / np.sqrt(c.embedder.dim)
        vectors = c.recall_query_embedder.embed([query])[0] + 0.8 * noise
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        c.mem0.memory.vector_store.insert(
            vectors=vectors.tolist(),
            payloads=[{"data": f"fact {i}", "user_id": f"u{i // each}"} for i in range(users * each)],
            ids=[str(uuid.uuid4()) for _ in range(users * each)],
        )
        with c.pool.connection() as conn:
            conn.execute("ANALYZE chatmem_memories")  # as autovacuum would after the load
        found = [len(c.mem0.search(query, user_id=f"u{u}", limit=each)) for u in range(0, users, 20)]
    finally:
        c.close()
    assert found == [each] * len(found)


def test_processes_that_start_together_on_a_new_database_make_mem0s_table_once(container):
    """Workers start together: each makes mem0's table when it starts. Made at once, the tables
    collided in Postgres's catalog (a unique violation on pg_type, logged with a traceback, and
    that worker's mem0 failed to start). Here three processes wait at the setup lock, held by the
    test, and are let go together."""
    import subprocess
    import sys

    import psycopg

    from chatmem.adapters.mem0_store import COLLECTION, SETUP_LOCK
    from tests.conftest import ROOT, scalar, settings_env, wait_for

    code = (
        "from chatmem.bootstrap import Container\n"
        "from chatmem.schemas.settings import Settings\n"
        "Container(Settings()).mem0.search('anything', user_id='nobody')\n"
    )
    url = container.settings.database_url
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND datname = current_database()"
    with psycopg.connect(url, autocommit=True) as held:
        held.execute("SELECT pg_advisory_lock(hashtext(%s))", (SETUP_LOCK,))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=settings_env(container.settings),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(3)
        ]
        assert wait_for(lambda: held.execute(waiting).fetchone() == (3,), timeout=90)
        assert held.execute("SELECT to_regclass(%s)", (COLLECTION,)).fetchone() == (None,)
        assert all(p.poll() is None for p in procs)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-4000:]
    assert not any("Error" in out or "Traceback" in out for out in outs), "\n".join(outs)[-4000:]
    assert scalar(container, "SELECT to_regclass(%s) IS NOT NULL", COLLECTION)
