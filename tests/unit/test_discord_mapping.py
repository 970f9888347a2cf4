"""The Discord adapter's pure parts: real discord.py Message objects (built by discord.py's own
constructors from gateway-shaped payloads) mapped onto events, ids, and deep links."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import discord
import pytest

from chatmem.memory.recall import NotReadable
from chatmem.producers.chat import ChatCommand, Origin
from chatmem.producers.discord_bot import (
    MemoryCog,
    attachment_kind,
    clip,
    deletion_event,
    discord_link,
    edit_event,
    edit_event_id,
    interaction_event_id,
    memory_command_event,
    message_event,
    thread_id_for,
    user_id_for,
)
from chatmem.schemas.events import AttachmentKind, CommandEvent, CommandName, Role
from chatmem.schemas.read import Citation, ContextBundle, ContextItem, RecallHit, RecallResult, Scope, Section
from tests.discord_stub import (
    ALICE,
    BOB,
    BOT_ID,
    BOT_USER,
    CHANNEL_ID,
    DM_ID,
    GUILD_ID,
    T0,
    THREAD_ID,
    cdn_attachment,
    message,
    offline_bot,
    snowflake,
    to_message,
)


@pytest.fixture(scope="module")
def bot():
    return offline_bot()


def event_of(bot, data: dict[str, Any]):
    return message_event(to_message(bot, data), BOT_ID)


# --- ids ----------------------------------------------------------------------------------------
def test_ids_are_namespaced_and_valid_wire_identifiers():
    assert thread_id_for(123) == "discord:123"
    assert user_id_for(5) == "discord:5"
    assert interaction_event_id(77) == "discord:i77"
    at = datetime(2026, 3, 2, 10, 0, 0, 123456, tzinfo=UTC)
    assert edit_event_id(42, at) == f"discord:42:e{int(at.timestamp() * 1_000_000)}"
    assert edit_event_id(42, at) != edit_event_id(42, at + timedelta(microseconds=1))


def test_attachment_kind_from_content_type_then_filename():
    assert attachment_kind("image/png", "x.bin") is AttachmentKind.IMAGE
    assert attachment_kind("text/plain; charset=utf-8", "notes.txt") is AttachmentKind.DOCUMENT
    assert attachment_kind("application/pdf", None) is AttachmentKind.DOCUMENT
    assert attachment_kind(None, "report.pdf") is AttachmentKind.DOCUMENT
    assert attachment_kind(None, "voice-message.ogg") is AttachmentKind.AUDIO
    assert attachment_kind("video/mp4", "clip.mp4") is AttachmentKind.VIDEO
    assert attachment_kind("application/zip", "a.zip") is AttachmentKind.OTHER
    assert attachment_kind(None, None) is AttachmentKind.OTHER


# --- messages -----------------------------------------------------------------------------------
def test_a_guild_message_becomes_a_user_message_with_readable_text(bot):
    data = message(
        ALICE,
        f"hi <@{BOT_ID}>, see <#{CHANNEL_ID}> @everyone",
        nick="Ally",
        mentions=[BOT_USER],
    )
    event = event_of(bot, data)
    mid = int(data["id"])
    assert event.event_id == f"discord:{mid}" and event.platform_message_id == str(mid)
    assert event.thread_id == f"discord:{CHANNEL_ID}" and event.user_id == f"discord:{ALICE}"
    assert event.platform == "discord" and event.role is Role.USER
    assert event.text == "hi @Chatmem, see #general @everyone"  # mentions as names, no zero-width space
    assert event.occurred_at == datetime.fromisoformat(data["timestamp"])
    assert event.metadata == {"author_name": "Ally", "guild_id": str(GUILD_ID), "channel_name": "general"}
    assert event.reply_to is None and event.attachments == []


def test_the_bots_own_message_is_the_assistant_and_other_bots_are_users(bot):
    own = event_of(bot, message(BOT_ID, "Tomatoes need sun."))
    assert own.role is Role.ASSISTANT and own.user_id == f"discord:{BOT_ID}" and own.metadata["is_bot"] is True
    other = message(ALICE, "beep")
    other["author"] = {**other["author"], "id": "1099999999999999999", "bot": True}
    event = event_of(bot, other)
    assert event.role is Role.USER and event.metadata["is_bot"] is True


def test_a_reply_names_the_message_it_answers(bot):
    first = int(message(ALICE, "x")["id"])
    assert event_of(bot, message(BOB, "agreed", reply_to=first)).reply_to == str(first)


def test_a_reply_to_another_channel_is_noted_not_linked(bot):
    data = message(BOB, "as said over there", reply_to=123456789012345678)
    data["message_reference"]["channel_id"] = str(THREAD_ID)
    event = event_of(bot, data)
    assert event.reply_to is None
    assert event.metadata["reply_to_channel"] == str(THREAD_ID)
    assert event.metadata["reply_to_message"] == "123456789012345678"


def test_attachments_are_https_references_with_kind_size_and_name(bot):
    photo = cdn_attachment(1, "beach.jpg", "image/jpeg", 204_800)
    photo["description"] = "sunset at the beach"
    doc = cdn_attachment(2, "itinerary.pdf", None, 51_000)
    event = event_of(bot, message(ALICE, "", attachments=[photo, doc]))
    assert event.text == ""
    a, b = event.attachments
    assert a.url == photo["url"] and a.url.startswith("https://cdn.discordapp.com/")
    assert (a.kind, a.mime_type, a.filename, a.size_bytes, a.caption) == (
        AttachmentKind.IMAGE,
        "image/jpeg",
        "beach.jpg",
        204_800,
        "sunset at the beach",
    )
    assert (b.kind, b.mime_type, b.filename, b.size_bytes, b.caption) == (
        AttachmentKind.DOCUMENT,
        None,
        "itinerary.pdf",
        51_000,
        None,
    )


def test_rich_embeds_and_stickers_become_text_link_previews_do_not(bot):
    embeds = [
        {"type": "rich", "title": "Forecast", "description": "Sunny, 24°C", "fields": [{"name": "Wind", "value": "5"}]},
        {"type": "link", "title": "Some site", "url": "https://example.com"},
    ]
    stickers = [{"id": "1111111111111111111", "name": "thumbs up", "format_type": 1}]
    event = event_of(bot, message(BOT_ID, "Here you go", embeds=embeds, stickers=stickers))
    assert event.text == "Here you go\n[embed] Forecast\nSunny, 24°C\nWind: 5\n[sticker: thumbs up]"


def test_a_forwarded_message_keeps_the_forwarded_text(bot):
    data = message(BOB, "")
    data["message_reference"] = {"type": 1, "message_id": "1234567890123456789", "channel_id": str(THREAD_ID)}
    snapshot = {
        "content": "meet at 9",
        "type": 0,
        "timestamp": data["timestamp"],
        "edited_timestamp": None,
        "embeds": [],
        "attachments": [cdn_attachment(3, "map.png", "image/png", 900, channel=THREAD_ID)],
    }
    data["message_snapshots"] = [{"message": snapshot}]
    event = event_of(bot, data)
    assert event.text == "[forwarded] meet at 9"
    assert [(a.filename, a.kind) for a in event.attachments] == [("map.png", AttachmentKind.IMAGE)]
    assert event.reply_to is None and event.metadata["forwarded"] is True


def test_a_message_in_a_thread_is_the_threads_own_stream(bot):
    event = event_of(bot, message(ALICE, "day 1: Lisbon", channel=THREAD_ID))
    assert event.thread_id == f"discord:{THREAD_ID}"
    assert event.metadata["channel_name"] == "trip-planning"
    assert event.metadata["parent_channel_id"] == str(CHANNEL_ID)


def test_a_dm_has_no_guild(bot):
    event = event_of(bot, message(ALICE, "just between us", channel=DM_ID, guild=False))
    assert event.thread_id == f"discord:{DM_ID}"
    assert event.metadata == {"author_name": "Alice A.", "dm": True}


def test_a_guild_discord_py_has_not_cached_is_still_a_guild(bot):
    data = message(BOB, "early bird", channel=1_079_000_000_000_000_000)
    data["guild_id"] = "1079000000000000001"  # no GUILD_CREATE for it yet
    event = event_of(bot, data)
    assert event.thread_id == "discord:1079000000000000000"
    assert event.metadata == {"author_name": "bob", "guild_id": "1079000000000000001"}


def test_system_and_empty_messages_are_not_published(bot):
    assert event_of(bot, message(ALICE, "", type=7)) is None  # a member joined
    assert event_of(bot, message(ALICE, "Alice pinned a message", type=6)) is None
    assert event_of(bot, message(ALICE, "   ")) is None


def test_nul_characters_are_dropped_not_refused(bot):
    assert event_of(bot, message(ALICE, "a\x00b")).text == "ab"


# --- edits --------------------------------------------------------------------------------------
def test_an_edit_is_one_event_per_edit_timestamp(bot):
    mid = snowflake()
    edited = T0 + timedelta(hours=1, seconds=3)
    event = edit_event(to_message(bot, message(ALICE, "fixed typo", mid=mid, edited=edited)))
    assert event is not None and event.type == "message_edited"
    assert event.event_id == edit_event_id(mid, edited) and event.platform_message_id == str(mid)
    assert event.text == "fixed typo" and event.occurred_at == edited
    assert event.thread_id == f"discord:{CHANNEL_ID}" and event.user_id == f"discord:{ALICE}"


def test_an_update_without_an_edit_timestamp_is_not_an_edit(bot):
    # Discord sends MESSAGE_UPDATE when it adds a link preview; the text did not change.
    data = message(ALICE, "look https://example.com", embeds=[{"type": "link", "url": "https://example.com"}])
    assert edit_event(to_message(bot, data)) is None


# --- commands -----------------------------------------------------------------------------------
def test_memory_commands_map_to_command_events_and_empty_ones_change_nothing():
    origin = Origin("discord:i1", "discord:1", "discord:2", "discord", T0)
    event = memory_command_event(origin, ChatCommand.REMEMBER, "I am vegetarian")
    assert isinstance(event, CommandEvent) and event.command is CommandName.REMEMBER
    assert event.args == {"text": "I am vegetarian"}
    assert memory_command_event(origin, ChatCommand.REMEMBER, "  ") is None
    assert memory_command_event(origin, ChatCommand.FORGET, "") is None
    assert memory_command_event(origin, ChatCommand.WHATDOYOUKNOW, "") is None
    assert memory_command_event(origin, ChatCommand.NEWTOPIC, "").command is CommandName.CLOSE_EPISODE


def test_clip_keeps_replies_within_discords_limit():
    assert clip("x" * 2000) == "x" * 2000
    assert len(clip("x" * 5000)) == 2000 and clip("x" * 5000).endswith("…")


def test_typed_commands_can_be_left_alone_and_their_edits_never_rerun(bot):
    typed = message(ALICE, "/remember I like trains", edited=T0 + timedelta(hours=3))
    plain = MemoryCog(bot, ListPublisher(), text_commands=False)
    asyncio.run(plain.on_message(to_message(bot, typed)))
    (event,) = plain.publisher.events
    assert event.type == "message" and event.text == "/remember I like trains"

    cog = MemoryCog(bot, ListPublisher())
    edit = discord.RawMessageUpdateEvent(data=typed, message=to_message(bot, typed))
    asyncio.run(cog.on_raw_message_edit(edit))
    assert cog.publisher.events == []
    words = message(ALICE, "fixed", edited=T0 + timedelta(hours=3))
    asyncio.run(cog.on_raw_message_edit(discord.RawMessageUpdateEvent(data=words, message=to_message(bot, words))))
    assert [e.type for e in cog.publisher.events] == ["message_edited"]


def test_a_file_the_contract_refuses_costs_only_itself(bot, caplog):
    caplog.set_level(logging.WARNING)
    named = cdn_attachment(3, "notes.txt", "text/plain", 10)
    named["filename"] = "no\x00tes.txt"
    odd = cdn_attachment(4, "a.txt", "text/plain", 10)
    odd["content_type"] = "text/" + "x" * 600  # beyond the contract's 512 characters
    event = event_of(bot, message(ALICE, "both files", attachments=[named, odd]))
    assert event.text == "both files" and [a.filename for a in event.attachments] == ["notes.txt"]
    assert "a Discord file reference was left out: mime_type:" in caplog.text


def test_a_message_that_cannot_be_mapped_is_logged_without_its_words(bot, caplog):
    # Beyond the wire contract's text limit (a Discord message is far shorter, but the limit is
    # the contract's): the listener logs why, never what was said, and publishes nothing.
    caplog.set_level(logging.WARNING)
    words = message(ALICE, "my secret plan " * 3000, edited=T0 + timedelta(hours=1))
    cog = MemoryCog(bot, ListPublisher())
    asyncio.run(cog.on_message(to_message(bot, words)))
    asyncio.run(cog.on_raw_message_edit(discord.RawMessageUpdateEvent(data=words, message=to_message(bot, words))))
    records = [r for r in caplog.records if "could not be mapped" in r.getMessage()]
    assert [r.getMessage().split("mapped: ", 1)[1] for r in records] == [
        "text: is 45000 characters, above the limit of 32000"
    ] * 2
    assert cog.publisher.events == [] and "secret" not in caplog.text and all(r.exc_info is None for r in records)


# --- deep links ---------------------------------------------------------------------------------
def cite(thread: str, message_id: str | None = None, **kw: Any) -> Citation:
    return Citation(source=kw.pop("source", "message"), thread_id=thread, platform_message_id=message_id, **kw)


def test_links_to_guild_dm_and_unknown_channels():
    guilds = {1: "700", 2: "@me"}.get
    assert discord_link(cite("discord:1", "99"), guilds) == "https://discord.com/channels/700/1/99"
    assert discord_link(cite("discord:2", "98"), guilds) == "https://discord.com/channels/@me/2/98"
    assert discord_link(cite("discord:3", "97"), guilds) is None  # channel never seen
    assert discord_link(cite("discord:1", "99")) is None  # no way to know the guild


def test_links_only_for_discord_messages():
    guilds = {1: "700"}.get
    assert discord_link(cite("telegram:1", "99"), guilds) is None
    assert discord_link(cite("discord:1", None, source="fact"), guilds) is None
    assert discord_link(cite("discord:1", "not-a-snowflake"), guilds) is None
    # A summary names no single message: it links to its first source.
    summary = cite("discord:1", None, source="summary", source_ids=["50", "51"])
    assert discord_link(summary, guilds) == "https://discord.com/channels/700/1/50"
    # Ids are anchored: a look-alike thread id gets no link.
    assert discord_link(cite("discord-1", "99"), guilds) is None
    assert discord_link(cite("discord:1:2", "99"), guilds) is None


class ListPublisher:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish_nowait(self, event: Any) -> None:
        self.events.append(event)


def test_the_cog_knows_guilds_from_messages_and_from_the_bots_cache(bot):
    cog = MemoryCog(bot, ListPublisher(), known_channels=2)
    assert cog.guild_of(CHANNEL_ID) == str(GUILD_ID)  # from discord.py's cache (GUILD_CREATE)
    assert cog.guild_of(THREAD_ID) == str(GUILD_ID)
    assert cog.guild_of(DM_ID) is None  # a DM discord.py has not cached
    cog._note_channel(DM_ID, None)
    cog._note_channel(5, 6)
    cog._note_channel(7, 8)  # the oldest entry goes: the map is bounded
    assert cog.guild_of(DM_ID) is None and cog.guild_of(7) == "8"
    cog._note_channel(DM_ID, None)
    assert cog.link(cite(f"discord:{DM_ID}", "42")) == f"https://discord.com/channels/@me/{DM_ID}/42"


# --- reading memory -----------------------------------------------------------------------------
class FakeMemory:
    """A MemoryView answering from fixed results."""

    def __init__(self, recent_ids: list[str], *, readable: bool = True) -> None:
        self.recent_ids = recent_ids
        self.readable = readable
        self.calls: list[tuple[str, str, str | None]] = []
        self.recall_calls: list[tuple[str, str, int, str | None]] = []

    def build_context(self, thread_id: str, user_id: str, query: str | None = None, **kw: Any) -> ContextBundle:
        self.calls.append((thread_id, user_id, query))
        if not self.readable:
            raise NotReadable(thread_id)
        items = [
            ContextItem(text=f"turn {i}", tokens=2, role="user", citation=cite(thread_id, i)) for i in self.recent_ids
        ]
        messages = [{"role": "system", "content": "persona"}] + [{"role": "user", "content": i.text} for i in items]
        return ContextBundle(
            thread_id=thread_id,
            user_id=user_id,
            query=query,
            max_tokens=100,
            tokens=10,
            counter="test",
            sections=[Section(name="recent_turns", items=items, tokens=4, budget=50)],
            messages=messages,
        )

    def recall(self, user_id: str, query: str, *, limit: int = 10, thread_id: str | None = None) -> RecallResult:
        self.recall_calls.append((user_id, query, limit, thread_id))
        if not self.readable:
            raise NotReadable(thread_id)
        hit = RecallHit(
            kind="message",
            score=1.0,
            snippet="I am vegetarian",
            author="Alice A.",
            citation=cite(f"discord:{CHANNEL_ID}", "1234567890123456789"),
        )
        return RecallResult(query=query, scope=Scope.ALL, hits=[hit])

    def what_do_you_know(self, user_id: str) -> Any:
        raise AssertionError("not used")

    def summaries(self, thread_id: str) -> list[Any]:
        raise AssertionError("not used")


def test_context_for_appends_the_message_unless_ingest_already_has_it(bot):
    msg = to_message(bot, message(ALICE, "what should I cook?"))
    memory = FakeMemory(["111"])
    cog = MemoryCog(bot, ListPublisher(), memory)
    messages = asyncio.run(cog.context_for(msg))
    assert messages[-1] == {"role": "user", "content": "what should I cook?"} and len(messages) == 3
    assert memory.calls == [(f"discord:{CHANNEL_ID}", f"discord:{ALICE}", "what should I cook?")]
    memory.recent_ids = ["111", str(msg.id)]
    messages = asyncio.run(cog.context_for(msg))
    assert [m["content"] for m in messages] == ["persona", "turn 111", f"turn {msg.id}"]


def test_context_for_degrades_to_the_message_alone(bot):
    msg = to_message(bot, message(BOB, "first words here"))
    assert asyncio.run(MemoryCog(bot, ListPublisher()).context_for(msg)) == [
        {"role": "user", "content": "first words here"}
    ]
    cog = MemoryCog(bot, ListPublisher(), FakeMemory([], readable=False))  # nothing ingested yet
    assert asyncio.run(cog.context_for(msg)) == [{"role": "user", "content": "first words here"}]


def test_recall_reply_cites_with_deep_links_and_keeps_dms_out_of_channels(bot):
    memory = FakeMemory([])
    cog = MemoryCog(bot, ListPublisher(), memory)
    asked = to_message(bot, message(ALICE, f"<@{BOT_ID}> what do I eat?", mentions=[BOT_USER]))
    text = asyncio.run(cog.recall_reply(asked, "what do I eat?"))
    assert text == (
        f"1. Alice A.: I am vegetarian\n   ↳ https://discord.com/channels/{GUILD_ID}/{CHANNEL_ID}/1234567890123456789"
    )
    in_dm = to_message(bot, message(ALICE, "what do I eat?", channel=DM_ID, guild=False))
    asyncio.run(cog.recall_reply(in_dm))
    # In a channel only that channel is searched (the answer is public); in a DM, everything.
    assert memory.recall_calls == [
        (f"discord:{ALICE}", "what do I eat?", 5, f"discord:{CHANNEL_ID}"),
        (f"discord:{ALICE}", "what do I eat?", 5, None),
    ]
    memory.readable = False
    assert asyncio.run(cog.recall_reply(asked)) == "I found nothing about that in memory."


def test_a_deletion_is_named_by_its_first_message_and_lists_them_in_order():
    event = deletion_event(55, {903, 901, 902}, 7)
    assert event is not None and (event.event_id, event.thread_id, event.user_id, event.platform_message_ids) == (
        "discord:901:deleted",
        "discord:55",
        "discord:7",
        ["901", "902", "903"],
    )
    assert deletion_event(55, set(), 7) is None
