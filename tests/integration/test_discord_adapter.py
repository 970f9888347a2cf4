"""The Discord adapter inside a real discord.py bot: gateway payloads go through discord.py's
parsers and event dispatch to the cog's listeners and slash commands; interaction responses go
over HTTP to a local stand-in for Discord's REST API (tests/discord_stub.py); events go through
the real Publisher into the embedded Redis, and ingest stores them in Postgres."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from chatmem.adapters.redis_stream import EVENT_FIELD
from chatmem.producers.discord_bot import add_memory, edit_event_id
from chatmem.producers.publisher import Publisher
from chatmem.status import table_counts
from chatmem.workers.ingest import IngestRunner
from tests.conftest import logged_events, scalar
from tests.discord_stub import (
    ALICE,
    APP_ID,
    BOB,
    BOT_ID,
    CHANNEL_ID,
    DM_ID,
    GUILD_ID,
    T0,
    THREAD_ID,
    DiscordHarness,
    cdn_attachment,
    message,
    slash,
    snowflake,
    to_message,
)
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration

CH, TH, DM = f"discord:{CHANNEL_ID}", f"discord:{THREAD_ID}", f"discord:{DM_ID}"
A, B, BOT = f"discord:{ALICE}", f"discord:{BOB}", f"discord:{BOT_ID}"
EPHEMERAL = 64


def stream(container) -> list[dict[str, Any]]:
    entries = container.redis.xrange(container.settings.stream_key)
    return [json.loads(fields[EVENT_FIELD]) for _, fields in entries]


def summary(event: dict[str, Any]) -> tuple:
    """(event id, type, thread, user, role or command)."""
    kind = event.get("role") or event.get("command") or ""
    return (event["event_id"], event["type"], event["thread_id"], event["user_id"], kind)


def test_messages_edits_and_commands_reach_the_stream_exactly(container):
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    text = message(ALICE, "I'm planning a trip to Lisbon in May", nick="Ally")
    reply = message(BOB, "Lisbon is lovely in May", reply_to=int(text["id"]))
    photo = cdn_attachment(11, "tram.jpg", "image/jpeg", 120_000)
    files = message(ALICE, "the tram and the plan", attachments=[photo, cdn_attachment(12, "plan.pdf", None, 9_000)])
    edited_at = T0 + timedelta(hours=2)
    edit = {**text, "content": "I'm planning a trip to Lisbon in June", "edited_timestamp": edited_at.isoformat()}
    preview = {**reply, "embeds": [{"type": "link", "url": "https://example.com"}]}  # not an edit
    in_thread = message(ALICE, "day 1: Alfama", channel=THREAD_ID)
    dm = message(ALICE, "between us: my budget is 800 euros", channel=DM_ID, guild=False)
    own = message(BOT_ID, "Noted, May it is.", reply_to=int(text["id"]))
    joined = message(BOB, "", type=7)  # a system message: Bob joined
    typed = message(ALICE, "/remember I like trains")
    slashes = [
        slash("remember", options={"text": "I am vegetarian"}),
        slash("forget", options={"text": "my old address"}),
        slash("summary"),
        slash("newtopic", channel=THREAD_ID),
        slash("memory_off"),
        slash("memory_on"),
        slash("whatdoyouknow"),
        slash("remember", options={"text": "I prefer window seats"}, channel=DM_ID, guild=False),
    ]

    async def scenario() -> DiscordHarness:
        async with DiscordHarness() as h:
            await add_memory(h.bot, pub, container)
            for data in (text, reply, files):
                await h.send("MESSAGE_CREATE", data)
            await h.send("MESSAGE_UPDATE", edit)
            await h.send("MESSAGE_UPDATE", preview)
            for data in (in_thread, dm, own, joined, text, typed):  # `text` again: a redelivery
                await h.send("MESSAGE_CREATE", data)
            for data in slashes:
                await h.send("INTERACTION_CREATE", data)
            return h

    h = asyncio.run(scenario())
    assert pub.flush(10)
    pub.close()

    events = stream(container)
    ids = {name: f"discord:{data['id']}" for name, data in [("text", text), ("reply", reply), ("files", files)]}
    i = [f"discord:i{s['id']}" for s in slashes]
    assert [summary(e) for e in events] == [
        (ids["text"], "message", CH, A, "user"),
        (ids["reply"], "message", CH, B, "user"),
        (ids["files"], "message", CH, A, "user"),
        (edit_event_id(int(text["id"]), edited_at), "message_edited", CH, A, ""),
        (f"discord:{in_thread['id']}", "message", TH, A, "user"),
        (f"discord:{dm['id']}", "message", DM, A, "user"),
        (f"discord:{own['id']}", "message", CH, BOT, "assistant"),
        (ids["text"], "message", CH, A, "user"),  # redelivered: same event id
        (f"discord:{typed['id']}", "command", CH, A, "remember"),
        (i[0], "command", CH, A, "remember"),
        (i[1], "command", CH, A, "forget"),
        (i[2], "command", CH, A, "summarize_now"),
        (i[3], "command", TH, A, "close_episode"),
        (i[4], "command", CH, A, "memory_off"),
        (i[5], "command", CH, A, "memory_on"),
        # /whatdoyouknow only reads: no event
        (i[7], "command", DM, A, "remember"),
    ]
    by_id = {e["event_id"]: e for e in events}
    assert by_id[ids["text"]]["metadata"] == {
        "author_name": "Ally",
        "guild_id": str(GUILD_ID),
        "channel_name": "general",
    }
    assert by_id[ids["reply"]]["reply_to"] == text["id"]
    assert by_id[f"discord:{own['id']}"]["reply_to"] == text["id"]
    assert [
        (a["url"], a["kind"], a["mime_type"], a["filename"], a["size_bytes"])
        for a in by_id[ids["files"]]["attachments"]
    ] == [
        (photo["url"], "image", "image/jpeg", "tram.jpg", 120_000),
        (files["attachments"][1]["url"], "document", None, "plan.pdf", 9_000),
    ]
    edited = by_id[edit_event_id(int(text["id"]), edited_at)]
    assert edited["platform_message_id"] == text["id"] and edited["text"].endswith("in June")
    assert by_id[f"discord:{dm['id']}"]["metadata"] == {"author_name": "Alice A.", "dm": True}
    assert by_id[f"discord:{typed['id']}"]["args"] == {"text": "I like trains"}
    assert by_id[i[0]]["args"] == {"text": "I am vegetarian"}
    assert by_id[i[7]]["metadata"] == {"author_name": "Alice A.", "interaction": "slash_command", "dm": True}

    # Every slash command is answered, privately; the reads are deferred, then followed up.
    callbacks = {r.path.split("/")[2]: r.body for r in h.api.posted("/interactions/")}
    assert set(callbacks) == {s["id"] for s in slashes}
    for s, expected in [
        (slashes[0], "Noted: I am vegetarian"),
        (slashes[1], "I'll forget what matches: my old address"),
        (slashes[3], "OK, new topic."),
        (slashes[5], "Memory is on for this chat."),
        (slashes[7], "Noted: I prefer window seats"),
    ]:
        assert callbacks[s["id"]] == {"type": 4, "data": {"tts": False, "content": expected, "flags": EPHEMERAL}}
    for s in (slashes[2], slashes[6]):
        assert callbacks[s["id"]] == {"type": 5, "data": {"flags": EPHEMERAL}}
    followups = {r.path.split("/")[3]: r.body for r in h.api.posted(f"/webhooks/{APP_ID}/")}
    assert followups["itoken-summary"]["content"] == "No summaries yet."
    assert followups["itoken-whatdoyouknow"]["content"] == "I don't remember anything about you yet."
    assert all(body["flags"] == EPHEMERAL for body in followups.values())
    # The typed command is answered in the channel, as a reply.
    (sent,) = h.api.posted(f"/channels/{CHANNEL_ID}/messages")
    assert sent.body["content"] == "Noted: I like trains"
    assert sent.body["message_reference"]["message_id"] == int(typed["id"])

    # Ingest: the redelivered message is stored once, nothing is dead-lettered.
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == len(events) - 1 == len(by_id)
    assert scalar(container, "SELECT count(*) FROM events WHERE event_id = %s", ids["text"]) == 1
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0
    assert scalar(container, "SELECT count(DISTINCT thread_id) FROM events") == 3


def test_answers_come_from_memory_with_links_back_to_discord(container):
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    d = Driver(container)
    said = message(ALICE, "My locker code at the climbing gym is 4512", nick="Ally")
    later = message(ALICE, "What was my locker code?")

    async def publish_then_ask() -> tuple[DiscordHarness, str, list[dict[str, Any]]]:
        async with DiscordHarness() as h:
            cog = await add_memory(h.bot, pub, container)
            await h.send("MESSAGE_CREATE", said)
            await h.send("MESSAGE_CREATE", message(BOT_ID, "Got it."))
            await h.send("INTERACTION_CREATE", slash("remember", options={"text": "I am vegetarian"}))
            assert pub.flush(10)
            await asyncio.to_thread(IngestRunner(container, "c").run, threading.Event(), until_idle=True)
            await asyncio.to_thread(d.advance, CH)
            await asyncio.to_thread(d.run_jobs)
            await h.send("INTERACTION_CREATE", slash("whatdoyouknow", iid=snowflake()))
            answer = await cog.recall_reply(to_message(h.bot, later), "locker code")
            # The question is not published: context_for must add it itself.
            context = await cog.context_for(to_message(h.bot, later))
            return h, answer, context

    h, answer, context = asyncio.run(publish_then_ask())
    pub.close()
    (followup,) = h.api.posted(f"/webhooks/{APP_ID}/itoken-whatdoyouknow")
    assert "I am vegetarian" in followup.body["content"]
    link = f"https://discord.com/channels/{GUILD_ID}/{CHANNEL_ID}/{said['id']}"
    assert answer.startswith("1. ") and "4512" in answer.splitlines()[0] and link in answer
    assert context[0]["role"] == "system"
    assert [m["content"] for m in context[1:]] == [
        "My locker code at the climbing gym is 4512",
        "Got it.",
        "What was my locker code?",
    ]


def test_deleted_messages_are_published_and_forgotten(container):
    """A deletion in Discord (one message, a moderator's bulk delete, one the bot never cached)
    reaches the stream as message_deleted events; the maintenance job then shreds the messages and
    their edits in the log and rebuilds the channel without them."""
    pub = Publisher(container.sink, container.settings.resolved_spool_dir)
    secret = message(ALICE, "my card PIN is 4411, keep it to yourself")
    ferry = message(BOB, "the ferry leaves at nine from the south pier")
    spam = [message(BOB, f"cheap watches, click now {i}") for i in range(2)]
    edit = {**secret, "content": "my card PIN is 4411", "edited_timestamp": (T0 + timedelta(hours=1)).isoformat()}
    unseen = snowflake()  # sent before the bot started: not in discord.py's cache, nor in memory
    where = {"channel_id": str(CHANNEL_ID), "guild_id": str(GUILD_ID)}

    async def scenario() -> None:
        async with DiscordHarness() as h:
            await add_memory(h.bot, pub, container)
            for data in (secret, ferry, *spam):
                await h.send("MESSAGE_CREATE", data)
            await h.send("MESSAGE_UPDATE", edit)
            await h.send("MESSAGE_DELETE", {"id": secret["id"], **where})
            await h.send("MESSAGE_DELETE_BULK", {"ids": [m["id"] for m in reversed(spam)], **where})
            await h.send("MESSAGE_DELETE", {"id": str(unseen), **where})

    asyncio.run(scenario())
    assert pub.flush(10)
    pub.close()
    spam_ids = sorted(int(m["id"]) for m in spam)
    assert [summary(e) + (e["platform_message_ids"],) for e in stream(container) if e["type"] == "message_deleted"] == [
        (f"discord:{secret['id']}:deleted", "message_deleted", CH, A, "", [secret["id"]]),  # the cached author
        (f"discord:{spam_ids[0]}:deleted", "message_deleted", CH, BOT, "", [str(i) for i in spam_ids]),
        (f"discord:{unseen}:deleted", "message_deleted", CH, BOT, "", [str(unseen)]),
    ]

    d = Driver(container)
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    d.advance(CH)
    # The three deletions come in one batch of the thread: one run for all of them.
    assert [j.kind for _, _, j in d.jobs if j.kind == "forget_deleted"] == ["forget_deleted"]
    with container.pool.connection() as conn:
        before = {r[0] for r in conn.execute("SELECT text FROM messages")}
    assert any("4411" in t for t in before)  # projected before its deletion was acted on

    removed = container.forget_deleted(CH)
    assert removed["events"] == 4  # the secret, its edit and the two spam messages
    assert container.forget_deleted(CH) == {"events": 0}  # one run covers every deletion so far

    payloads = {e["event_id"]: e["payload"] for e in logged_events(container)}
    for gone in (f"discord:{secret['id']}", edit_event_id(int(secret["id"]), T0 + timedelta(hours=1))):
        assert payloads[gone]["metadata"] == {"erased": True} and "text" not in payloads[gone]
    assert payloads[f"discord:{ferry['id']}"]["text"] == ferry["content"]
    with container.pool.connection() as conn:
        texts = {r[0] for r in conn.execute("SELECT text FROM messages")}
    assert texts == {ferry["content"]}
    assert not [h for h in container.recall(A, "card PIN 4411").hits if "4411" in h.snippet]
    assert [h.snippet for h in container.recall(B, "when does the ferry leave").hits][:1] == [ferry["content"]]
    assert scalar(container, "SELECT requested_by FROM erasures WHERE scope = 'messages'") == "deleted on the platform"
    counts = table_counts(container)  # `chatmem status`: not an erasure of anyone
    assert (counts["deleted_shredded_events"], counts["erasures"]) == (4, 0)
