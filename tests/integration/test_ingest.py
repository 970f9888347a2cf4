import json
import threading

import psycopg
import pytest

from chatmem.adapters import migrate
from chatmem.adapters.redis_stream import EVENT_FIELD
from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from chatmem.workers.ingest import IngestRunner
from tests.conftest import scalar

pytestmark = pytest.mark.integration


def xadd_raw(c, payload: bytes) -> str:
    return c.redis.xadd(c.settings.stream_key, {EVENT_FIELD: payload}).decode()


def ingest_all(c) -> IngestRunner:
    runner = IngestRunner(c, "test-consumer")
    runner.run(threading.Event(), until_idle=True)
    return runner


def msg(i, thread="t1", **extra):
    return MessageEvent(event_id=f"e{i}", thread_id=thread, user_id="u1", text=f"message {i}", **extra)


def test_duplicate_event_id_is_stored_once(container):
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    pub.publish_many([msg(1), msg(2), msg(1)])
    ingest_all(container)
    pub.publish(msg(2))  # a producer retry, later
    ingest_all(container)
    assert scalar(container, "SELECT count(*) FROM events") == 2
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0


def test_bad_entries_go_to_dead_letters_with_reasons_and_block_nothing(settings_factory):
    from chatmem.adapters.services import ServiceUrls
    from chatmem.bootstrap import Container

    s = settings_factory(max_text_chars=100)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    good = lambda i: msg(i).model_dump_json().encode()  # noqa: E731
    base = {"type": "message", "event_id": "x", "thread_id": "t1", "user_id": "u1", "text": "hi"}
    bad = {
        b"{not json": "malformed JSON",
        json.dumps({**base, "type": "sticker", "event_id": "b1"}).encode(): "unknown event type 'sticker'",
        json.dumps(
            {k: v for k, v in base.items() if k != "user_id"} | {"event_id": "b2"}
        ).encode(): "user_id: field required",
        json.dumps({**base, "event_id": "b3", "text": 42}).encode(): "text: Input should be a valid string",
        json.dumps({**base, "event_id": "b4", "text": "x" * 101}).encode(): "above the limit of 100",
        json.dumps({**base, "event_id": "b5", "schema_version": 7}).encode(): "unsupported schema_version 7",
        # Python's json writes Infinity; Postgres refuses it, and the model's own JSON would log null.
        json.dumps({**base, "event_id": "b6", "metadata": {"score": float("inf")}}).encode(): "metadata: /score is inf",
        # A command's arguments reach Postgres text and jsonb, which cannot hold NUL.
        json.dumps(
            {"type": "command", "event_id": "b7", "thread_id": "t1", "user_id": "u1", "command": "remember"}
            | {"args": {"text": "a\u0000b"}}
        ).encode(): "args: /text contains a NUL character",
    }
    xadd_raw(c, good(1))
    for payload in bad:
        xadd_raw(c, payload)
    xadd_raw(c, good(2))
    ingest_all(c)
    assert scalar(c, "SELECT count(*) FROM events") == 2
    with c.pool.connection() as conn:
        rows = conn.execute("SELECT raw, reason, delivery_count, first_seen FROM dead_letters").fetchall()
    assert len(rows) == len(bad)
    by_raw = {bytes(r[0]): r for r in rows}
    for payload, expected in bad.items():
        assert expected in by_raw[payload][1]
        assert by_raw[payload][2] == 1 and by_raw[payload][3] is not None
    assert c.stream.pending_count() == 0
    c.close()


def test_a_row_postgres_refuses_is_dead_lettered_alone(settings_factory):
    # JSON allows \u0000 in a metadata value; Postgres jsonb does not (sealed, it is ciphertext:
    # that case is below).
    settings = settings_factory(encrypt_events=False)
    container = Container(settings, ServiceUrls(settings.database_url, settings.redis_url, False, False))
    try:
        pub = Publisher(container.sink, container.settings.resolved_spool_dir)
        pub.publish_many([msg(1), msg(2, metadata={"note": "a\u0000b"}), msg(3)])
        ingest_all(container)
        assert scalar(container, "SELECT count(*) FROM events") == 2
        reason = scalar(container, "SELECT reason FROM dead_letters")
        assert "refused by Postgres" in reason
    finally:
        container.close()


def test_sealed_content_takes_what_jsonb_refuses(container):
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    pub.publish_many([msg(1), msg(2, metadata={"note": "a\u0000b"})])
    ingest_all(container)
    assert scalar(container, "SELECT count(*) FROM events") == 2
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0
    [second] = [e for e in container.thread_log.pending_events("t1", 0, 10) if e.event_id == "e2"]
    assert second.payload["metadata"] == {"note": "a\u0000b"}


def test_event_log_is_append_only(container):
    Publisher(container.sink, container.settings.resolved_spool_dir).publish(msg(1))
    ingest_all(container)
    for sql in ("UPDATE events SET user_id = 'x'", "DELETE FROM events", "TRUNCATE events CASCADE"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"), container.pool.connection() as conn:
            conn.execute(sql)
    assert scalar(container, "SELECT count(*) FROM events") == 1


def test_migrations_are_recorded_and_idempotent(settings):
    assert migrate.migrate(settings.database_url) == []
    assert migrate.pending(settings.database_url) == []


def test_upgrading_moves_the_archived_flag_from_messages_to_their_episodes(embedded):
    from yoyo import read_migrations

    from tests.conftest import _with_db

    url = _with_db(embedded["pg_url"], "upgrade_0013")
    with psycopg.connect(embedded["admin"], autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS upgrade_0013")
        conn.execute("CREATE DATABASE upgrade_0013")
    # A database as the release before 0013 left it: one archived episode, one open.
    with migrate._backend(url) as backend, backend.lock():
        older = read_migrations(str(migrate.MIGRATIONS_DIR)).filter(lambda m: m.id < "0013")
        backend.apply_migrations(backend.to_apply(older))
    with psycopg.connect(url, autocommit=True) as conn:
        for ordinal, active in ((1, False), (2, True)):
            conn.execute(
                """INSERT INTO episodes (episode_id, generation, thread_id, ordinal, start_seq, status, opened_by,
                                         started_at) VALUES (%s, 1, 't', %s, %s, 'closed', 'first', now())""",
                (f"t#{ordinal}", ordinal, ordinal),
            )
            conn.execute(
                """INSERT INTO messages (thread_id, generation, seq, event_id, stream_pos, episode_id, user_id, role,
                                         text, occurred_at, is_active)
                   VALUES ('t', 1, %s, %s, %s, %s, 'u', 'user', 'hello', now(), %s)""",
                (ordinal, f"e{ordinal}", ordinal, f"t#{ordinal}", active),
            )
    later = sorted(m.id for m in read_migrations(str(migrate.MIGRATIONS_DIR)) if m.id >= "0013")
    assert migrate.migrate(url) == later and later[0] == "0013_episode_archived"
    with psycopg.connect(url) as conn:
        archived = conn.execute("SELECT episode_id, archived FROM episodes ORDER BY ordinal").fetchall()
        columns = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'messages'"
        )}  # fmt: skip
    assert archived == [("t#1", True), ("t#2", False)] and "is_active" not in columns


def test_trim_keeps_everything_not_yet_ingested(container):
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    pub.publish_many([msg(i) for i in range(300)])
    stream = container.stream
    stream.ensure_group()
    runner = IngestRunner(container, "c1")
    runner.service.process(stream.read_new("c1", 200, 10))
    held = stream.read_new("c2", 50, 10)  # delivered to a consumer that has not committed
    runner.service.trim()
    remaining = {e[0].decode() for e in container.redis.xrange(container.settings.stream_key)}
    assert {e.entry_id for e in held} <= remaining
    assert len(remaining) >= 100
    runner.service.process(held)
    runner.run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == 300


def test_stream_position_orders_a_thread_like_publishing(container):
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    pub.publish_many([msg(i, thread=f"t{i % 3}") for i in range(60)])
    ingest_all(container)
    with container.pool.connection() as conn:
        for t in ("t0", "t1", "t2"):
            got = [
                r[0]
                for r in conn.execute(
                    "SELECT event_id FROM events WHERE thread_id = %s ORDER BY stream_pos", (t,)
                ).fetchall()
            ]
            assert got == [f"e{i}" for i in range(60) if f"t{i % 3}" == t]


def test_doorbell_for_an_unknown_thread_is_not_busy(container):
    from chatmem.memory.sequencer import advance_thread

    res = advance_thread(container.thread_log, container.doorbell, "ghost", owner="w", lease_s=5, batch_size=10)
    assert res.unknown and not res.busy


def test_live_threads_rung_together_go_out_in_groups_and_bulk_ones_alone(container):
    from chatmem.adapters.redis_stream import RedisDoorbell

    singles, groups = [], []
    bell = RedisDoorbell(
        container.redis,
        lambda t, bulk: singles.append((t, bulk)),
        60,
        prefix="test:bell:",
        bulk_key="test:bulk",
        send_group=groups.append,
        group_size=2,
    )
    bell.classify(bulk=["imp"], live=[])
    assert bell.ring(["a", "b", "imp", "c", "d", "e"]) == 6
    assert groups == [["a", "b"], ["c", "d"], ["e"]] and singles == [("imp", True)]
    # Still pending: rung again, nothing goes out; cleared, it goes out again.
    bell.clear("c")
    assert bell.ring(["a", "c"]) == 1 and groups[-1] == ["c"]


def test_conflicts_and_clocks_out_of_range_are_noticed_listed_and_counted(container):
    from datetime import UTC, datetime

    from chatmem.status import table_counts
    from tests.conftest import spawn

    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    first = MessageEvent(event_id="e1", thread_id="t1", user_id="u1", text="I live in Porto")
    other = MessageEvent(event_id="e1", thread_id="t1", user_id="u1", text="I live in Lisbon")
    pub.publish_many([first, other, first])
    pub.publish(msg(2, occurred_at=datetime(9999, 12, 31, tzinfo=UTC)))
    ingest_all(container)
    pub.publish(other)  # the same conflicting version, published again later
    runner = ingest_all(container)
    assert runner.service.stats.conflicts == 0  # already noticed: once per distinct version
    logged = {e.event_id: e for e in container.thread_log.pending_events("t1", 0, 10)}
    kept = logged["e1"].payload["text"]
    at, original = logged["e2"].occurred_at, logged["e2"].payload["metadata"]["occurred_at_original"]
    notices = sorted((n.kind, n.event_id, (n.payload or {}).get("text")) for n in container.notices.notices(10))
    assert kept == "I live in Porto"
    assert notices == [("clock", "e2", None), ("conflict", "e1", "I live in Lisbon")]
    assert at.year == datetime.now(UTC).year and original == "9999-12-31T00:00:00+00:00"
    counts = table_counts(container)
    assert counts["event_conflicts"] == 1 and counts["clock_clamped"] == 1
    listing = spawn(container.settings, "dead-letters", "--json")
    out, _ = listing.communicate(timeout=60)
    shown = json.loads(out[out.index("{") :])
    assert sorted(n["kind"] for n in shown["notices"]) == ["clock", "conflict"]
