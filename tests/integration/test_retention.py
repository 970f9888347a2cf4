"""Retention on a fake clock: events past their period (global, per platform, per thread, where
0 keeps forever) lose their content in the log, their facts go, and their threads are rebuilt
without them; what is still within its period stays whole."""

from datetime import UTC, datetime, timedelta

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.schemas.events import CommandEvent, MessageEvent
from tests.conftest import logged_events, scalar
from tests.integration.test_episodes import Driver

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def say(thread, n, text, days_ago, platform="telegram", user="ann"):
    return MessageEvent(
        event_id=f"{thread}-{n}",
        thread_id=thread,
        user_id=user,
        platform=platform,
        text=text,
        occurred_at=NOW - timedelta(days=days_ago),
    )


def test_expired_events_are_shredded_and_their_threads_rebuilt_on_a_fake_clock(settings_factory):
    s = settings_factory(retention_days=30, retention_days_by={"platform:discord": 7, "thread:keep": 0})
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        d = Driver(c)
        d.publish(
            [
                say("old", 1, "my old locker code is 7781", 40),
                CommandEvent(
                    event_id="old-c2",
                    thread_id="old",
                    user_id="ann",
                    command="remember",
                    args={"text": "my locker code is 7781"},
                    occurred_at=NOW - timedelta(days=40),
                ),
                say("old", 3, "the garden needs water today", 2),
                say("dc", 1, "discord chatter about the ferry times", 10, platform="discord"),
                say("keep", 1, "a founding note from long ago", 400),
            ]
        )
        for thread in ("old", "dc", "keep"):
            d.advance(thread)
        d.run_jobs()
        assert scalar(c, "SELECT count(*) FROM facts WHERE user_id = 'ann' AND value LIKE %s", "%7781%") == 1

        removed = c.apply_retention(NOW)
        assert removed["events"] == 3 and removed["threads"] == 2  # old-1, old-c2, dc-1
        assert removed["facts"] >= 1
        assert c.apply_retention(NOW)["events"] == 0  # done once: nothing left to expire

        payloads = {e["event_id"]: e["payload"] for e in logged_events(c)}
        for gone in ("old-1", "old-c2", "dc-1"):
            assert payloads[gone]["metadata"] == {"erased": True} and "sealed" not in payloads[gone]
        assert payloads["old-3"]["text"] == "the garden needs water today"
        assert payloads["keep-1"]["text"] == "a founding note from long ago"
        with c.pool.connection() as conn:
            texts = {r[0] for r in conn.execute("SELECT text FROM messages")}
        assert texts == {"the garden needs water today", "a founding note from long ago"}
        assert scalar(c, "SELECT count(*) FROM facts WHERE value LIKE %s", "%7781%") == 0
        assert not [h for h in c.recall("ann", "locker code 7781").hits if "7781" in h.snippet]
        assert scalar(c, "SELECT count(*) FROM erasures WHERE scope = 'retention'") == 1  # quiet runs leave none
    finally:
        c.close()


def test_a_run_stopped_before_its_rebuild_is_finished_by_the_next(settings_factory, monkeypatch):
    s = settings_factory(retention_days=30)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        d = Driver(c)
        d.publish([say("old", 1, "my old locker code is 7781", 40), say("old", 2, "the garden needs water", 1)])
        d.advance("old")

        def lost(*args, **kwargs):
            raise ConnectionError("the worker was lost")

        monkeypatch.setattr(c, "_rebuild", lost)
        with pytest.raises(ConnectionError):
            c.apply_retention(NOW)
        monkeypatch.undo()
        # Shredded in the log, still projected: the next run finds nothing expired, and rebuilds.
        assert scalar(c, "SELECT count(*) FROM messages WHERE text LIKE %s", "%7781%") == 1
        again = c.apply_retention(NOW)
        assert (again["events"], again["threads"]) == (0, 1)
        assert scalar(c, "SELECT count(*) FROM messages WHERE text LIKE %s", "%7781%") == 0
        assert scalar(c, "SELECT count(*) FROM erasures WHERE finished_at IS NULL") == 0
        assert c.apply_retention(NOW)["threads"] == 0
    finally:
        c.close()
