"""Faults with real services and real processes: a consumer killed mid-batch, Redis going
away under a publisher, two consumers racing."""

import os
import signal
import threading

import pytest

from chatmem.memory.sequencer import advance_thread
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from chatmem.workers.ingest import IngestRunner
from tests.conftest import logged_events, scalar, spawn, stop, wait_for

pytestmark = pytest.mark.integration


def events(n, threads=10):
    return [
        MessageEvent(event_id=f"e{i}", thread_id=f"t{i % threads}", user_id="u", text=f"m{i}", metadata={"n": i})
        for i in range(n)
    ]


def count(c):
    return scalar(c, "SELECT count(*) FROM events")


def test_consumer_killed_mid_batch_loses_nothing_and_duplicates_nothing(container):
    n = 20_000
    Publisher(container.sink, container.settings.resolved_spool_dir).publish_many(events(n, 100))
    first = spawn(container.settings, "ingest", "--consumer", "doomed", ingest_batch_size=500)
    assert wait_for(lambda: count(container) >= 2_000, timeout=60), stop(first)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    stored_at_kill = count(container)
    assert stored_at_kill < n, "the consumer finished before it could be killed"
    second = spawn(container.settings, "ingest", "--consumer", "survivor", ingest_claim_idle_ms=500)
    try:
        assert wait_for(lambda: count(container) == n, timeout=120)
        assert wait_for(lambda: container.stream.pending_count() == 0, timeout=30)
    finally:
        stop(second)
    assert scalar(container, "SELECT count(DISTINCT event_id) FROM events") == n
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0


def test_redis_down_while_publishing_spools_then_delivers(container, embedded):
    pub = Publisher.from_settings(container.settings)
    batch = events(300, 3)
    for e in batch[:100]:
        pub.publish_nowait(e)
    assert pub.flush(10)
    embedded["redis"].stop()
    try:
        for e in batch[100:200]:
            pub.publish_nowait(e)  # never blocks, never raises
        assert wait_for(lambda: pub.spool.pending_count() == 100, timeout=10)
    finally:
        embedded["redis"].start()
    for e in batch[200:]:
        pub.publish_nowait(e)
    assert pub.flush(20)
    pub.close()
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert count(container) == 300
    order = [int(e["payload"]["metadata"]["n"]) for e in logged_events(container, "t0")]
    assert order == sorted(order)  # the spool was delivered before newer events


def test_a_full_spool_refuses_newer_events_delivers_the_rest_and_reports_it(settings_factory, embedded):
    from chatmem.adapters.services import ServiceUrls
    from chatmem.bootstrap import Container
    from chatmem.status import shared_state
    from tests.conftest import status_json

    s = settings_factory(spool_max_bytes=8192)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    pub = Publisher.from_settings(s)  # the flusher runs as its own process, as for a bot
    batch = events(200, 4)
    embedded["redis"].stop()
    try:
        for e in batch:
            pub.publish_nowait(e)  # never blocks, never raises, full spool or not
        # The flusher has handled every event: spooled while there was room, refused after.
        assert wait_for(lambda: pub.spool.pending_count() + pub.refused == 200, timeout=20)
        spooled = pub.spool.pending_count()
        assert 0 < spooled < 200 and pub.spool.used_bytes() <= 8192
    finally:
        embedded["redis"].start()
    assert pub.flush(20)
    pub.close()
    IngestRunner(c, "c").run(threading.Event(), until_idle=True)
    stored = [e["event_id"] for e in logged_events(c)]
    assert stored == [e.event_id for e in batch[:spooled]]  # the oldest, once each, in order
    assert pub.refused == 200 - spooled
    report = status_json(s)
    assert report["stream"]["spool_refused"] == 200 - spooled and report["stream"]["spooled"] == 0
    assert shared_state(c).spool_refused == 200 - spooled  # chatmem_spool_refused_total
    c.close()


def test_two_consumers_keep_each_threads_order(container):
    n, n_threads = 6_000, 20
    Publisher(container.sink, container.settings.resolved_spool_dir).publish_many(events(n, n_threads))
    consumers = [
        spawn(container.settings, "ingest", "--consumer", f"c{k}", ingest_batch_size=size)
        for k, size in ((1, 37), (2, 53))
    ]
    applied: dict[str, list[int]] = {}
    log = container.thread_log

    def record(lease, batch):
        lease = log.advance_cursor(lease, batch)
        applied.setdefault(lease.thread_id, []).extend(e.payload["metadata"]["n"] for e in batch)
        return lease

    def drain_all():
        for t in range(n_threads):
            advance_thread(log, container.doorbell, f"t{t}", owner="test", lease_s=30, batch_size=25, apply=record)
        return sum(len(v) for v in applied.values()) == n

    try:
        # Apply while both consumers are still committing, as the doorbell does in production.
        assert wait_for(drain_all, timeout=120, interval=0.01)
    finally:
        outs = [stop(p) for p in consumers]
    for t in range(n_threads):
        assert applied[f"t{t}"] == [i for i in range(n) if i % n_threads == t], outs
