"""Crypto-shredding in the event log, on the real Postgres: content sealed at rest with a key per
(user, thread), opened back exactly, tombstones once a key is destroyed, a fresh key for a user
who comes back, and a refused KEK that is not the database's."""

import base64
import os

import pytest

from chatmem.adapters.keys_pg import EventKeys, KekMismatch
from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment, MessageEvent
from tests.integration.test_ingest import ingest_all


def say(n, user, thread="g1", text=None, **kw):
    return MessageEvent(
        event_id=f"{thread}-{n}", thread_id=thread, user_id=user, text=text or f"{user} says secret-{n}", **kw
    )


def publish(c, events):
    Publisher(c.sink, c.settings.resolved_spool_dir).publish_many(events)
    ingest_all(c)


def raw_payloads(c):
    with c.pool.connection() as conn:
        return {r[0]: r[1] for r in conn.execute("SELECT event_id, payload FROM events")}


def test_content_is_sealed_at_rest_and_opens_back_exactly(container):
    first = say(1, "alice", metadata={"author_name": "Alice"}, attachments=[Attachment(url="https://x.test/a.png")])
    publish(container, [first, say(2, "bob")])
    raw = raw_payloads(container)
    assert "text" not in raw["g1-1"] and "attachments" not in raw["g1-1"] and "metadata" not in raw["g1-1"]
    assert "secret-1" not in str(raw["g1-1"]) and raw["g1-1"]["thread_id"] == "g1"  # ids stay in clear
    [one, two] = container.thread_log.pending_events("g1", 0, 10)
    assert one.payload == first.model_dump(mode="json")
    assert two.payload["text"] == "bob says secret-2"
    with container.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM event_keys").fetchone()[0] == 2  # one per (user, thread)


def test_a_destroyed_key_leaves_tombstones_and_a_returning_user_gets_a_new_key(container):
    publish(container, [say(1, "alice"), say(2, "bob"), say(3, "alice", thread="dm")])
    with container.pool.connection() as conn, conn.transaction():
        assert container.event_keys.destroy(conn, user_id="alice") == 2
    events = {e.event_id: e.payload for e in container.thread_log.pending_events("g1", 0, 10)}
    assert events["g1-1"]["text"] == "" and events["g1-1"]["metadata"] == {"erased": True}
    assert events["g1-2"]["text"] == "bob says secret-2"
    publish(container, [say(4, "alice")])
    events = {e.event_id: e.payload for e in container.thread_log.pending_events("g1", 0, 10)}
    assert events["g1-4"]["text"] == "alice says secret-4" and events["g1-1"]["metadata"] == {"erased": True}


def test_another_kek_is_refused_rather_than_sealing_with_keys_nobody_can_open(container):
    publish(container, [say(1, "alice")])
    other = EventKeys(lambda: os.urandom(32), seal=True)
    with pytest.raises(KekMismatch), container.pool.connection() as conn:
        other.seal_payloads(conn, [("alice", "g1", say(2, "alice").model_dump_json())])


def test_a_kek_from_settings_must_be_32_bytes(settings_factory):
    s = settings_factory(kek=base64.b64encode(b"short").decode())
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        with pytest.raises(Exception, match="32 bytes"):
            publish(c, [say(1, "alice")])
    finally:
        c.close()


def test_with_encryption_off_events_are_logged_in_clear_and_still_read(settings_factory):
    s = settings_factory(encrypt_events=False)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        publish(c, [say(1, "alice")])
        assert raw_payloads(c)["g1-1"]["text"] == "alice says secret-1"
        assert c.thread_log.pending_events("g1", 0, 10)[0].payload["text"] == "alice says secret-1"
    finally:
        c.close()
