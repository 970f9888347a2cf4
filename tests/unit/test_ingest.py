import json
import re

import pytest

from chatmem.memory.ingest import IngestLimits, IngestService
from chatmem.memory.ports import TransientError
from chatmem.memory.sequencer import advance_thread, sweep
from tests.fakes import FakeDoorbell, FakeEventStore, FakeEventStream, FakeThreadLog

KEY = "chatmem:events"


def msg(event_id, thread="t1", text="hi", **extra):
    return json.dumps(
        {"type": "message", "event_id": event_id, "thread_id": thread, "user_id": "u", "text": text, **extra}
    ).encode()


@pytest.fixture
def parts():
    stream, store, bell = FakeEventStream(), FakeEventStore(), FakeDoorbell()
    svc = IngestService(stream, store, bell, stream_key=KEY, limits=IngestLimits(50, 1000))
    return stream, store, bell, svc


def test_duplicates_stored_once_and_bad_entries_dead_lettered(parts):
    stream, store, bell, svc = parts
    stream.add_many([msg("a"), msg("a"), b"{oops", msg("b", text="x" * 60), msg("c")])
    svc.process(stream.read_new("c1", 100, 0))
    assert sorted(store.events) == ["a", "c"]
    reasons = sorted(d.reason for d in store.dead.values())
    assert reasons[0].startswith("malformed JSON")
    assert reasons[1] == "text: is 60 characters, above the limit of 50"
    assert [d.raw for d in store.dead.values()][0] == b"{oops"
    assert stream.pending == {}  # every entry acknowledged, the bad ones too
    assert bell.sent == ["t1"]


def test_nothing_is_acknowledged_when_the_commit_fails(parts):
    stream, store, bell, svc = parts
    stream.add_many([msg("a"), msg("b")])
    entries = stream.read_new("c1", 100, 0)
    store.fail_next = TransientError("db down")
    with pytest.raises(TransientError):
        svc.process(entries)
    assert len(stream.pending) == 2 and store.events == {}
    svc.process(stream.read_own_pending("c1", 100))  # what a restarted consumer does first
    assert sorted(store.events) == ["a", "b"] and stream.pending == {}


def test_watermark_waits_for_a_slower_consumer_and_then_rings_its_threads(parts):
    stream, store, bell, svc = parts
    stream.add_many([msg("a1", thread="A"), msg("b1", thread="B")])
    slow = stream.read_new("slow", 1, 0)  # A's event, held by a consumer that has not committed
    svc.process(stream.read_new("fast", 10, 0))  # B's event committed first
    assert "b1" in store.events
    assert bell.sent == []  # B's event lies above the uncommitted A entry: not final yet
    svc.process(slow)
    assert sorted(bell.sent) == ["A", "B"]


def test_dead_consumer_entries_are_reclaimed(parts):
    stream, store, bell, svc = parts
    stream.add_many([msg("a"), msg("b")])
    stream.read_new("dead", 10, 0)
    for entry_id in stream.pending:
        stream.idle_ms[entry_id] = 60_000
    svc.process(stream.claim_stale("alive", 30_000, 10))
    assert sorted(store.events) == ["a", "b"] and stream.pending == {}


def test_trim_never_drops_uningested_entries(parts):
    stream, store, bell, svc = parts
    stream.add_many([msg("a"), msg("b"), msg("c")])
    svc.process(stream.read_new("c1", 1, 0))
    stream.read_new("c2", 1, 0)  # delivered, not committed
    svc.trim()
    remaining = [i for i, _ in stream.entries]
    assert len(remaining) == 2  # only the committed first entry went


def test_doorbell_applies_in_publish_order_and_never_twice(parts):
    stream, store, bell, svc = parts
    log = FakeThreadLog(store)
    stream.add_many([msg(f"e{i}") for i in range(7)])
    svc.process(stream.read_new("c1", 3, 0))
    res = advance_thread(log, bell, "t1", owner="w1", lease_s=60, batch_size=2)
    assert res.applied == 3
    svc.process(stream.read_new("c1", 10, 0))
    assert advance_thread(log, bell, "t1", owner="w1", lease_s=60, batch_size=2).applied == 4
    assert advance_thread(log, bell, "t1", owner="w1", lease_s=60, batch_size=2).applied == 0
    assert log.applied["t1"] == [f"e{i}" for i in range(7)]


def test_busy_thread_is_left_to_its_holder(parts):
    stream, store, bell, svc = parts
    log = FakeThreadLog(store)
    stream.add_many([msg("e1")])
    svc.process(stream.read_new("c1", 10, 0))
    log.acquire_lease("t1", "other", 60)
    assert advance_thread(log, bell, "t1", owner="w1", lease_s=60, batch_size=10).busy


def test_doorbell_for_an_unknown_thread_is_ignored_not_retried(parts):
    stream, store, bell, svc = parts
    res = advance_thread(FakeThreadLog(store), bell, "never-seen", owner="w1", lease_s=60, batch_size=10)
    assert res.unknown and not res.busy


def test_sweeper_rerings_lagging_threads(parts):
    stream, store, bell, svc = parts
    log = FakeThreadLog(store)
    stream.add_many([msg("e1", thread="A"), msg("e2", thread="B")])
    svc.process(stream.read_new("c1", 10, 0))
    bell.marked.clear()  # the doorbell tasks were lost
    assert sweep(log, bell) == 2


def test_imported_threads_are_rung_at_bulk_priority_until_a_live_event_arrives(parts):
    stream, store, bell, svc = parts
    stream.add_many([msg("i1", thread="old"), msg("i2", thread="old")], bulk=True)
    stream.add_many([msg("l1", thread="live")])
    svc.process(stream.read_new("c1", 100, 0))
    assert bell.sent == ["live"] and bell.sent_bulk == ["old"]
    bell.marked.clear()
    stream.add_many([msg("l2", thread="old")])  # the imported chat goes on live
    svc.process(stream.read_new("c1", 100, 0))
    assert bell.sent == ["live", "old"] and bell.sent_bulk == ["old"]


def test_a_bulk_drain_stops_after_max_batches_and_reports_more():
    store = FakeEventStore()
    stream, bell = FakeEventStream(), FakeDoorbell()
    svc = IngestService(stream, store, bell, stream_key=KEY, limits=IngestLimits(50, 1000))
    stream.add_many([msg(f"e{i}", thread="big") for i in range(7)], bulk=True)
    svc.process(stream.read_new("c1", 100, 0))
    log = FakeThreadLog(store, KEY)
    first = advance_thread(log, bell, "big", owner="w", lease_s=30, batch_size=2, max_batches=2)
    assert (first.applied, first.more) == (4, True)
    rest = advance_thread(log, bell, "big", owner="w", lease_s=30, batch_size=2, max_batches=2)
    assert (rest.applied, rest.more) == (3, False)


def test_a_producer_clock_out_of_range_is_logged_at_the_time_redis_took_the_event(parts):
    from datetime import UTC, datetime

    from chatmem.memory.ingest import entry_time

    stream, store, bell, svc = parts
    stream.add_many(
        [
            msg("future", occurred_at="9999-12-31T00:00:00Z"),
            msg("ancient", occurred_at="1970-01-02T00:00:00Z"),
            msg("fine", occurred_at="2023-05-08T13:56:00Z"),
        ]
    )
    svc.process(stream.read_new("c1", 100, 0))
    future = store.events["future"]
    assert future.event.occurred_at == entry_time(future.entry_id)
    assert future.event.metadata["occurred_at_original"] == "9999-12-31T00:00:00+00:00"
    assert json.loads(future.payload)["occurred_at"].startswith(entry_time(future.entry_id).strftime("%Y-%m-%dT"))
    assert store.events["ancient"].event.metadata["occurred_at_original"].startswith("1970-01-02")
    assert store.events["fine"].event.occurred_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # the past is fine
    assert sorted(k[1] for k in store.notices if k[0] == "clock") == ["ancient", "future"]
    assert svc.stats.clock_clamped == 2


def test_a_reused_event_id_with_other_content_is_kept_as_a_conflict_and_a_redelivery_is_silent(parts):
    stream, store, bell, svc = parts
    first = msg("x", text="first version")
    stream.add_many([first, first, msg("x", text="second version")])
    svc.process(stream.read_new("c1", 100, 0))
    assert store.events["x"].event.text == "first version"
    conflicts = [k for k in store.notices if k[0] == "conflict"]
    assert len(conflicts) == 1 and json.loads(conflicts[0][2])["text"] == "second version"
    assert svc.stats.conflicts == 1 and svc.stats.duplicates == 2


def test_a_group_pass_reads_ahead_once_then_drains_each_thread_as_alone():
    from chatmem.memory.sequencer import advance_threads

    store, bell = FakeEventStore(), FakeDoorbell()
    svc = IngestService(FakeEventStream(), store, bell, stream_key=KEY, limits=IngestLimits(50, 1000))
    svc.stream.add_many([msg(f"{t}{i}", thread=t) for i in range(3) for t in ("A", "B", "C")])
    svc.process(svc.stream.read_new("c1", 100, 0))
    log = FakeThreadLog(store)
    log.leases["C"] = "other"  # held elsewhere: busy, like advance_thread
    seen: list[list[list[str]]] = []

    def prefetch(batches):
        seen.append([[e.event_id for e in b] for b in batches])
        return sum(map(len, batches))

    results = advance_threads(log, bell, ["A", "B", "C"], owner="w", lease_s=30, batch_size=2, prefetch=prefetch)
    # One read ahead, of each thread's next batch (C's too: it takes no lease).
    assert seen == [[["A0", "A1"], ["B0", "B1"], ["C0", "C1"]]]
    # One batch each: the rest is another turn, so that no thread's backlog holds up the group.
    got = [(r.thread_id, r.applied, r.busy, r.more) for r in results]
    assert got == [("A", 2, False, True), ("B", 2, False, True), ("C", 0, True, False)]
    assert log.applied == {"A": ["A0", "A1"], "B": ["B0", "B1"]}
    # A single thread has nothing to gather with.
    assert advance_threads(log, bell, ["A"], owner="w", lease_s=30, batch_size=2, prefetch=prefetch)[0].applied == 1
    assert len(seen) == 1 and log.applied["A"] == ["A0", "A1", "A2"]


def test_a_thread_whose_batch_fails_holds_up_neither_its_group_nor_hides_where_it_stopped():
    from chatmem.memory.sequencer import advance_threads

    store, bell = FakeEventStore(), FakeDoorbell()
    svc = IngestService(FakeEventStream(), store, bell, stream_key=KEY, limits=IngestLimits(50, 1000))
    svc.stream.add_many([msg(f"{t}{i}", thread=t) for i in range(2) for t in ("A", "B")])
    svc.process(svc.stream.read_new("c1", 100, 0))
    log = FakeThreadLog(store)
    failures: list[tuple[str, str, str]] = []

    def apply(lease, batch):
        if lease.thread_id == "A":
            raise KeyError("a word from the message")  # a bug that meets this batch on every try
        return log.advance_cursor(lease, batch)

    def noted(thread_id, event, error):
        failures.append((thread_id, event.event_id, type(error).__name__))

    args = {"owner": "w", "lease_s": 30, "batch_size": 2, "apply": apply, "on_failure": noted}
    results = advance_threads(log, bell, ["A", "B"], transient=(TransientError,), **args)
    assert [(r.thread_id, r.applied, r.failed) for r in results] == [("A", 0, True), ("B", 2, False)]
    assert failures == [("A", "A0", "KeyError")] and "A" not in log.leases  # the lease is let go
    with pytest.raises(KeyError):  # alone, the doorbell task fails (and Celery counts it)
        advance_thread(log, bell, "A", transient=(TransientError,), **args)
    assert failures[-1] == ("A", "A0", "KeyError") and len(failures) == 2

    def outage(lease, batch):
        raise TransientError("the database went away")  # the others would meet it too

    with pytest.raises(TransientError):
        advance_threads(log, bell, ["A", "B"], transient=(TransientError,), **{**args, "apply": outage})
    assert len(failures) == 2


def test_where_an_error_was_raised_names_chatmems_line_and_never_its_message():
    from chatmem.adapters.errors import where_raised
    from chatmem.memory.dates import month

    try:
        month(2023, 13)  # raised inside the standard library, called from chatmem
    except ValueError as error:
        place = where_raised(error)
    assert re.fullmatch(r"ValueError at memory/dates\.py:\d+ in month", place), place
    assert "13" not in place.split(":")[0] and "must be in" not in place
    assert where_raised(KeyError("a user's words")) == "KeyError"  # never raised: no line to name


@pytest.mark.parametrize(
    ("n", "most", "sizes"), [(0, 8, []), (1, 8, [1]), (8, 8, [8]), (9, 8, [5, 4]), (5, 2, [2, 2, 1]), (7, 1, [1] * 7)]
)
def test_rung_threads_are_split_into_the_fewest_even_groups(n, most, sizes):
    from chatmem.adapters.redis_stream import split_evenly

    items = [f"t{i}" for i in range(n)]
    groups = split_evenly(items, most)
    assert [len(g) for g in groups] == sizes
    assert [t for g in groups for t in g] == items
