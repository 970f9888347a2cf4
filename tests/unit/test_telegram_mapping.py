"""The Telegram mapping over Bot API dicts: every message kind, topics, ids, edits, commands,
the bot's own messages, deep links, and that python-telegram-bot's and aiogram's dumps of an
update map to exactly the events the raw Bot API JSON does."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from chatmem.adapters.fetch import BotTokenFilter, redact_bot_tokens
from chatmem.memory.recall import NotReadable
from chatmem.producers import telegram as tg
from chatmem.producers.chat import ChatCommand
from chatmem.producers.publisher import serialize
from chatmem.schemas.events import Attachment, CommandEvent, MessageEditedEvent, MessageEvent, parse_event
from chatmem.schemas.read import Citation, ContextBundle, KnownAbout, RecallHit, RecallResult, Scope
from tests.telegram_stub import (
    ALICE,
    BASIC_GROUP,
    BOB,
    CHANNEL,
    CONNECTION,
    FORUM,
    GROUP,
    OWNER,
    PRIVATE,
    T0,
    business,
    message,
    photo_sizes,
)

WHEN = datetime.fromtimestamp(T0, UTC)


def one(update: dict[str, Any], **kw: Any) -> tg.Incoming:
    incoming = tg.map_update(update, **kw)
    assert incoming is not None
    # Every event must pass the wire contract exactly as the ingest consumer reads it.
    if incoming.event is not None:
        assert parse_event(serialize(incoming.event)) == incoming.event
    return incoming


def msg_event(update: dict[str, Any], **kw: Any) -> MessageEvent:
    event = one(update, **kw).event
    assert isinstance(event, MessageEvent)
    return event


# --- ids -----------------------------------------------------------------------------------------
def test_a_private_text_message():
    event = msg_event({"message": message(PRIVATE, 5, text="I moved to Lisbon last month")})
    assert event == MessageEvent(
        event_id="telegram:111:5",
        thread_id="telegram:111",
        user_id="telegram:111",
        platform="telegram",
        occurred_at=WHEN,
        role="user",
        text="I moved to Lisbon last month",
        platform_message_id="5",
        metadata={"chat_type": "private", "author_name": "Alice Liddell"},
    )


def test_supergroup_ids_reply_and_quote():
    replied = message(GROUP, 40, user=BOB, text="Which seeds?")
    event = msg_event(
        {"message": message(GROUP, 41, text="Tomatoes", reply_to_message=replied, quote={"text": "seeds"})}
    )
    assert (event.event_id, event.thread_id, event.user_id) == (
        "telegram:-1001234567890:41",
        "telegram:-1001234567890",
        "telegram:111",
    )
    assert event.reply_to == "40"
    assert event.metadata == {
        "chat_type": "supergroup",
        "author_name": "Alice Liddell",
        "chat_title": "Garden club",
        "quote": "seeds",
    }


def test_author_name_falls_back_to_username_then_title():
    assert tg.author_name({"id": 1, "username": "zed"}) == "zed"
    assert tg.author_name({"id": 1, "first_name": "Bob"}) == "Bob"
    assert tg.author_name({"id": -1, "title": "News"}) == "News"
    assert tg.author_name(None) is None


def test_forum_topics_get_their_own_thread():
    root = message(FORUM, 77, text=None, forum_topic_created={"name": "Roadmap", "icon_color": 1})
    in_topic = message(
        FORUM, 80, text="ship in May", message_thread_id=77, is_topic_message=True, reply_to_message=root
    )
    event = msg_event({"message": in_topic})
    assert event.thread_id == "telegram:-1009876543210:77"
    assert event.event_id == "telegram:-1009876543210:80"
    assert event.reply_to is None  # every topic message "replies" to the topic's first message
    assert event.metadata["topic_id"] == 77
    # An explicit reply inside the topic is a reply.
    answered = message(FORUM, 79, user=BOB, text="when?", message_thread_id=77, is_topic_message=True)
    reply = msg_event(
        {
            "message": message(
                FORUM, 81, text="May", message_thread_id=77, is_topic_message=True, reply_to_message=answered
            )
        }
    )
    assert reply.reply_to == "79" and reply.thread_id == "telegram:-1009876543210:77"
    # The General topic has no thread id; a reply chain in an ordinary group is not a topic.
    assert msg_event({"message": message(FORUM, 82, text="hi all")}).thread_id == "telegram:-1009876543210"
    chain = message(GROUP, 50, text="same chain", message_thread_id=40, reply_to_message=message(GROUP, 40, text="x"))
    assert msg_event({"message": chain}).thread_id == "telegram:-1001234567890"


def test_forward_origins_are_kept_as_metadata():
    user = {"type": "user", "date": T0 - 3600, "sender_user": BOB}
    hidden = {"type": "hidden_user", "date": T0 - 60, "sender_user_name": "Carol"}
    channel = {"type": "channel", "date": T0 - 10, "chat": CHANNEL, "message_id": 12, "author_signature": "Ed"}
    got = [
        msg_event({"message": message(PRIVATE, i, text="fwd", forward_origin=origin)}).metadata["forward_origin"]
        for i, origin in enumerate((user, hidden, channel), start=1)
    ]
    assert got == [
        {"type": "user", "date": "2026-01-01T09:00:00+00:00", "user_id": "telegram:222", "name": "Bob"},
        {"type": "hidden_user", "date": "2026-01-01T09:59:00+00:00", "name": "Carol"},
        {
            "type": "channel",
            "date": "2026-01-01T09:59:50+00:00",
            "chat_id": -1005550001111,
            "name": "News",
            "message_id": "12",
            "signature": "Ed",
        },
    ]


def test_channel_posts_and_messages_on_behalf_of_a_chat_use_the_chat_as_sender():
    event = msg_event({"channel_post": message(CHANNEL, 3, user=None, sender_chat=CHANNEL, text="Release 2.0")})
    assert event.user_id == "telegram:-1005550001111" and event.metadata["author_name"] == "News"
    anonymous_admin = message(
        GROUP, 9, user={"id": 1087968824, "is_bot": True, "first_name": "Group"}, sender_chat=GROUP, text="rules"
    )
    assert msg_event({"message": anonymous_admin}).user_id == "telegram:-1001234567890"


# --- edits ---------------------------------------------------------------------------------------
def test_each_edit_is_its_own_event_and_a_redelivery_is_the_same_event():
    edited = message(GROUP, 41, text="Tomatoes and basil", edit_date=T0 + 30)
    first = one({"edited_message": edited}).event
    assert first == MessageEditedEvent(
        event_id=f"telegram:-1001234567890:41:edit:{T0 + 30}",
        thread_id="telegram:-1001234567890",
        user_id="telegram:111",
        platform="telegram",
        occurred_at=datetime.fromtimestamp(T0 + 30, UTC),
        platform_message_id="41",
        text="Tomatoes and basil",
        metadata={"chat_type": "supergroup", "author_name": "Alice Liddell", "chat_title": "Garden club"},
    )
    assert one({"edited_message": edited}).event == first
    later = one({"edited_message": {**edited, "text": "Tomatoes only", "edit_date": T0 + 90}}).event
    assert later is not None and later.event_id.endswith(f":edit:{T0 + 90}")
    caption_edit = one({"edited_message": message(PRIVATE, 6, caption="new caption", edit_date=T0 + 5)}).event
    assert isinstance(caption_edit, MessageEditedEvent) and caption_edit.text == "new caption"
    topic_edit = one(
        {"edited_message": message(FORUM, 80, text="x", message_thread_id=77, is_topic_message=True, edit_date=T0)}
    )
    assert topic_edit.thread_id == "telegram:-1009876543210:77"


# --- attachments ---------------------------------------------------------------------------------
def test_photo_takes_the_largest_size_and_the_caption_is_the_text():
    event = msg_event({"message": message(PRIVATE, 7, photo=photo_sizes("P"), caption="my balcony")})
    assert event.text == "my balcony"
    assert event.attachments == [
        Attachment(
            url="telegram:file/P-x", kind="image", mime_type="image/jpeg", caption="my balcony", size_bytes=90_000
        )
    ]


@pytest.mark.parametrize(
    ("field", "media", "expected"),
    [
        (
            "document",
            {"file_id": "D1", "file_unique_id": "d", "file_name": "plan.pdf", "mime_type": "application/pdf"},
            {"kind": "document", "mime_type": "application/pdf", "filename": "plan.pdf"},
        ),
        (
            "document",
            {"file_id": "D2", "file_unique_id": "d", "file_name": "scan.png", "mime_type": "image/png"},
            {"kind": "image", "mime_type": "image/png", "filename": "scan.png"},
        ),
        (
            "voice",
            {"file_id": "V1", "file_unique_id": "v", "duration": 3, "file_size": 5_000},
            {"kind": "audio", "mime_type": "audio/ogg", "size_bytes": 5_000},
        ),
        (
            "audio",
            {
                "file_id": "A1",
                "file_unique_id": "a",
                "duration": 200,
                "file_name": "song.mp3",
                "mime_type": "audio/mpeg",
            },
            {"kind": "audio", "mime_type": "audio/mpeg", "filename": "song.mp3"},
        ),
        (
            "video",
            {"file_id": "M1", "file_unique_id": "m", "width": 1, "height": 1, "duration": 1},
            {"kind": "video", "mime_type": "video/mp4"},
        ),
        (
            "video_note",
            {"file_id": "N1", "file_unique_id": "n", "length": 240, "duration": 4},
            {"kind": "video", "mime_type": "video/mp4"},
        ),
    ],
)
def test_media_become_attachment_references(field, media, expected):
    event = msg_event({"message": message(PRIVATE, 8, **{field: media})})
    assert event.text == ""
    (att,) = event.attachments
    assert att.url == f"telegram:file/{media['file_id']}"
    assert {k: getattr(att, k) for k in expected} == expected


def test_an_animation_is_one_video_although_telegram_also_sends_it_as_document():
    anim = {"file_id": "G1", "file_unique_id": "g", "width": 1, "height": 1, "duration": 1, "mime_type": "video/mp4"}
    event = msg_event({"message": message(PRIVATE, 9, animation=anim, document=anim)})
    assert [(a.url, a.kind) for a in event.attachments] == [("telegram:file/G1", "video")]


def test_a_sticker_is_its_emoji_not_a_file():
    sticker = {"file_id": "S1", "file_unique_id": "s", "type": "regular", "emoji": "👍", "set_name": "Hands"}
    event = msg_event({"message": message(PRIVATE, 10, sticker=sticker)})
    assert event.text == "[sticker 👍]" and event.attachments == []
    assert event.metadata["sticker"] == {"emoji": "👍", "set_name": "Hands"}


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        (
            {"poll": {"id": "1", "question": "Lunch?", "options": [{"text": "pizza"}, {"text": "sushi"}]}},
            "[poll] Lunch? — pizza / sushi",
        ),
        ({"location": {"latitude": 38.7223, "longitude": -9.1393}}, "[location 38.72230, -9.13930]"),
        (
            {
                "venue": {
                    "location": {"latitude": 1, "longitude": 2},
                    "title": "Cafe A",
                    "address": "Rua 1",
                }
            },
            "[venue] Cafe A, Rua 1",
        ),
        ({"contact": {"phone_number": "+1", "first_name": "Dan", "last_name": "Ek"}}, "[contact] Dan Ek"),
        ({"dice": {"emoji": "🎲", "value": 4}}, "[dice 🎲 4]"),
    ],
)
def test_content_without_words_gets_a_short_description(fields, text):
    assert msg_event({"message": message(PRIVATE, 11, **fields)}).text == text


def test_nul_characters_are_dropped_not_refused():
    # As the Discord adapter does: the events refuse NUL, and a NUL must not cost the message.
    assert msg_event({"message": message(PRIVATE, 12, text="a\x00b")}).text == "ab"
    poll = {"question": "Lunch\x00?", "options": [{"text": "pizza"}]}
    assert msg_event({"message": message(PRIVATE, 13, poll=poll)}).text == "[poll] Lunch? — pizza"
    doc = {"file_id": "D", "file_unique_id": "d", "file_name": "plan\x00.pdf"}
    event = msg_event({"message": message(PRIVATE, 14, document=doc, caption="the\x00 plan")})
    assert event.text == "the plan" and (event.attachments[0].filename, event.attachments[0].caption) == (
        "plan.pdf",
        "the plan",
    )
    edit = one({"edited_message": message(PRIVATE, 12, text="a\x00c", edit_date=T0 + 5)}).event
    assert isinstance(edit, MessageEditedEvent) and edit.text == "ac"


def test_telegram_file_references_pass_the_wire_contract_and_others_do_not():
    assert Attachment(url="telegram:file/AgACAgIAAxkBAAIB-_x").url == "telegram:file/AgACAgIAAxkBAAIB-_x"
    for bad in ("telegram:file/../etc/passwd", "telegram://file/x", "telegram:file/", "telegram:bot123:ABC/x"):
        with pytest.raises(ValidationError, match=r"must be a file://, https:// or data: URI, or telegram:file/"):
            Attachment(url=bad)


def test_nothing_is_published_for_service_messages_and_other_updates():
    assert tg.map_update({"message": message(GROUP, 12, new_chat_members=[BOB])}) is None
    assert tg.map_update({"message": message(GROUP, 13, pinned_message=message(GROUP, 1, text="x"))}) is None
    assert tg.map_update({"callback_query": {"id": "1", "from": ALICE, "chat_instance": "c", "data": "x"}}) is None
    assert tg.map_update({"my_chat_member": {}}) is None


# --- commands ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "command", "args"),
    [
        ("/remember I am vegetarian", "remember", {"text": "I am vegetarian"}),
        ("/remember@memo_bot I am vegetarian", "remember", {"text": "I am vegetarian"}),
        ("/forget@Memo_Bot my address", "forget", {"text": "my address"}),
        ("/summary", "summarize_now", {}),
        ("/summary 2", "summarize_now", {"level": "2"}),
        ("/newtopic", "close_episode", {}),
        ("/memory_off", "memory_off", {}),
        ("/memory_on", "memory_on", {}),
    ],
)
def test_memory_commands_become_command_events(text, command, args):
    incoming = one({"message": message(GROUP, 20, text=text)}, bot_username="memo_bot")
    event = incoming.event
    assert isinstance(event, CommandEvent)
    assert (event.event_id, event.thread_id, event.user_id, event.command, event.args) == (
        "telegram:-1001234567890:20",
        "telegram:-1001234567890",
        "telegram:111",
        command,
        args,
    )
    assert event.metadata["platform_message_id"] == "20" and event.metadata["author_name"] == "Alice Liddell"
    assert incoming.command is not None and incoming.command[0] is ChatCommand(text.split()[0][1:].split("@")[0])


def test_whatdoyouknow_is_answered_not_published_and_other_bots_commands_are_messages():
    read_only = one({"message": message(PRIVATE, 21, text="/whatdoyouknow")}, bot_username="memo_bot")
    assert read_only.event is None and read_only.command == (ChatCommand.WHATDOYOUKNOW, "")
    other_bot = msg_event({"message": message(GROUP, 22, text="/remember@other_bot x")}, bot_username="memo_bot")
    assert other_bot.text == "/remember@other_bot x"
    assert msg_event({"message": message(PRIVATE, 23, text="/start")}).text == "/start"
    # A command in a topic keeps the topic's thread.
    in_topic = one(
        {"message": message(FORUM, 24, text="/newtopic", message_thread_id=77, is_topic_message=True)},
        bot_username="memo_bot",
    )
    assert in_topic.thread_id == "telegram:-1009876543210:77" and in_topic.topic_id == 77


def test_bot_commands_for_the_menu():
    commands = dict(tg.bot_commands())
    assert set(commands) == {c.value for c in ChatCommand}
    assert all(0 < len(d) <= 256 for d in commands.values())


# --- the bot's own messages ----------------------------------------------------------------------
BOT = {"id": 7_000_001, "is_bot": True, "first_name": "Memo", "username": "memo_bot"}


def test_the_bots_messages_are_assistant_messages():
    asked = message(GROUP, 30, text="hello?")
    sent = message(GROUP, 9001, user=BOT, text="Hello!", reply_to_message=asked)
    (event,) = tg.map_sent("sendMessage", sent)
    assert isinstance(event, MessageEvent)
    assert (event.event_id, event.role, event.user_id, event.reply_to, event.text) == (
        "telegram:-1001234567890:9001",
        "assistant",
        "telegram:7000001",
        "30",
        "Hello!",
    )
    photo = message(PRIVATE, 9002, user=BOT, photo=photo_sizes("B"), caption="a chart")
    (with_photo,) = tg.map_sent("sendPhoto", photo)
    assert isinstance(with_photo, MessageEvent) and with_photo.attachments[0].url == "telegram:file/B-x"
    album = [message(PRIVATE, 9003 + i, user=BOT, photo=photo_sizes(f"G{i}")) for i in range(2)]
    assert [e.event_id for e in tg.map_sent("sendMediaGroup", album)] == ["telegram:111:9003", "telegram:111:9004"]
    # A bot's text that looks like a command is still the bot's message.
    (cmd_like,) = tg.map_sent("sendMessage", message(PRIVATE, 9005, user=BOT, text="/remember x"))
    assert isinstance(cmd_like, MessageEvent) and cmd_like.role == "assistant"


def test_the_bots_edits_are_told_apart_by_their_text():
    base = message(PRIVATE, 9010, user=BOT, text="Thinking", edit_date=T0 + 1)
    (a,) = tg.map_sent("editMessageText", base)
    (b,) = tg.map_sent("editMessageText", {**base, "text": "Thinking... done"})
    assert isinstance(a, MessageEditedEvent) and isinstance(b, MessageEditedEvent)
    assert a.event_id.startswith(f"telegram:111:9010:edit:{T0 + 1}:") and a.event_id != b.event_id
    assert a.user_id == "telegram:7000001"


def test_calls_without_a_message_give_nothing():
    assert tg.map_sent("sendChatAction", True) == []
    assert tg.map_sent("editMessageText", True) == []  # an inline message's edit
    assert tg.map_sent("getMe", BOT) == []


# --- business chats ------------------------------------------------------------------------------
TAG = tg.business_tag(CONNECTION)
SHOP = f"telegram:{TAG}:111"  # Olga's business chat with Alice


def test_a_business_chat_is_a_thread_of_its_own_and_its_people_are_the_business_users():
    mine = msg_event({"message": message(PRIVATE, 5, text="my locker code is 4471")})
    theirs = msg_event({"business_message": business(message(PRIVATE, 5, text="Do you have white tulips?"))})
    assert TAG.startswith("business:") and len(TAG) == len("business:") + 16
    # The same chat id and message id as Alice's chat with the bot, and nothing shared with it.
    assert (theirs.event_id, theirs.thread_id, theirs.user_id, theirs.role) == (f"{SHOP}:5", SHOP, SHOP, "user")
    assert (mine.event_id, mine.thread_id, mine.user_id) == ("telegram:111:5", "telegram:111", "telegram:111")
    # Another business Alice writes to is another thread and another user.
    other = msg_event({"business_message": business(message(PRIVATE, 5, text="hi"), "bc-other")})
    assert other.thread_id != SHOP and other.user_id != SHOP and other.thread_id.endswith(":111")
    # The owner answering by hand is a person of that business; the bot answering for it is the bot.
    olga = msg_event({"business_message": business(message(PRIVATE, 6, user=OWNER, text="Yes, 3 euros each"))})
    assert (olga.user_id, olga.role, olga.metadata["author_name"]) == (f"telegram:{TAG}:444", "user", "Olga Florist")
    on_behalf = business(message(PRIVATE, 7, user=OWNER, text="We open at 9", sender_business_bot=BOT))
    by_bot = msg_event({"business_message": on_behalf})
    assert (by_bot.user_id, by_bot.role, by_bot.metadata["author_name"]) == ("telegram:7000001", "assistant", "Memo")
    # The bot's own call answers with the same message: one event, however it arrives.
    assert tg.map_sent("sendMessage", on_behalf) == [by_bot]
    # The connection id itself is in no event.
    assert all(CONNECTION not in serialize(e).decode() for e in (theirs, olga, by_bot))


def test_commands_in_a_business_chat_are_words_to_the_business():
    event = msg_event({"business_message": business(message(PRIVATE, 8, text="/memory_off"))}, bot_username="memo_bot")
    assert one({"business_message": business(message(PRIVATE, 8, text="/memory_off"))}).command is None
    assert (event.text, event.thread_id) == ("/memory_off", SHOP)


def test_business_edits_and_deletions_map_to_the_business_thread():
    edited = one({"edited_business_message": business(message(PRIVATE, 5, text="white or pink", edit_date=T0 + 5))})
    assert isinstance(edited.event, MessageEditedEvent)
    assert (edited.event.event_id, edited.event.thread_id) == (f"{SHOP}:5:edit:{T0 + 5}", SHOP)
    streamed = business(message(PRIVATE, 9, user=OWNER, text="Checking", sender_business_bot=BOT, edit_date=T0 + 6))
    (by_call,) = tg.map_sent("editMessageText", streamed)
    assert one({"edited_business_message": streamed}).event == by_call and by_call.user_id == "telegram:7000001"

    deleted = one(
        {"deleted_business_messages": {"business_connection_id": CONNECTION, "chat": PRIVATE, "message_ids": [9, 5, 9]}}
    ).event
    assert deleted is not None and deleted.type == "message_deleted"
    assert (deleted.event_id, deleted.thread_id, deleted.user_id, deleted.platform_message_ids) == (
        f"{SHOP}:5:deleted",
        SHOP,
        SHOP,  # Telegram does not say who deleted: the chat's other person
        ["5", "9"],
    )
    assert tg.map_update({"deleted_business_messages": {"business_connection_id": CONNECTION, "chat": PRIVATE}}) is None


def test_recall_and_context_in_a_business_chat_stay_in_that_chat():
    memory = FakeMemory()
    update = {"update_id": 1, "business_message": business(message(PRIVATE, 10, text="my locker code?"))}
    tg.recall_reply(memory, update)
    assert memory.calls[-1] == ("recall", (SHOP, "my locker code?"), {"limit": 5, "thread_id": SHOP})
    tg.context_for(memory, update)
    assert memory.calls[-1] == ("build_context", (SHOP, SHOP, "my locker code?"), {})


# --- deep links ----------------------------------------------------------------------------------
def cite(thread_id: str, message_id: str | None, source: str = "message") -> Citation:
    return Citation(source=source, thread_id=thread_id, platform_message_id=message_id)


def test_deep_links_exist_for_supergroups_and_channels_only():
    assert tg.telegram_link(cite("telegram:-1001234567890", "41")) == "https://t.me/c/1234567890/41"
    assert tg.telegram_link(cite("telegram:-1009876543210:77", "80")) == "https://t.me/c/9876543210/77/80"
    assert tg.telegram_link(cite("telegram:-1005550001111", "3", "artifact")) == "https://t.me/c/5550001111/3"
    assert tg.telegram_link(cite("telegram:111", "5")) is None  # private chat
    assert tg.telegram_link(cite("telegram:-4001", "5")) is None  # basic group
    assert tg.telegram_link(cite("telegram:-1001234567890", None, "summary")) is None
    assert tg.telegram_link(cite("discord:1:2", "5")) is None
    assert tg.telegram_link(cite("garden", "garden-m2")) is None


# --- reading memory back -------------------------------------------------------------------------
class FakeMemory:
    def __init__(self, recall_error: Exception | None = None):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.recall_error = recall_error

    def build_context(self, thread_id: str, user_id: str, query: str | None = None, **kw: Any) -> ContextBundle:
        self.calls.append(("build_context", (thread_id, user_id, query), kw))
        return ContextBundle(
            thread_id=thread_id,
            user_id=user_id,
            query=query,
            max_tokens=100,
            tokens=3,
            counter="x",
            sections=[],
            messages=[{"role": "system", "content": "memory"}],
        )

    def recall(self, user_id: str, query: str, **kw: Any) -> RecallResult:
        self.calls.append(("recall", (user_id, query), kw))
        if self.recall_error:
            raise self.recall_error
        hit = RecallHit(
            kind="message",
            score=1.0,
            snippet="my locker code is 4512",
            author="Alice Liddell",
            citation=cite("telegram:-1001234567890", "41"),
        )
        return RecallResult(query=query, scope=Scope.ALL, hits=[hit])

    def what_do_you_know(self, user_id: str) -> KnownAbout:
        self.calls.append(("what_do_you_know", (user_id,), {}))
        return KnownAbout(user_id=user_id, facts=[], episodes=[])

    def summaries(self, thread_id: str) -> list:
        return []


def test_context_for_uses_the_messages_thread_user_and_text():
    memory = FakeMemory()
    update = {"update_id": 1, "message": message(FORUM, 80, text="plan?", message_thread_id=77, is_topic_message=True)}
    assert tg.context_for(memory, update, max_tokens=500) == [{"role": "system", "content": "memory"}]
    assert memory.calls == [
        ("build_context", ("telegram:-1009876543210:77", "telegram:111", "plan?"), {"max_tokens": 500})
    ]
    with pytest.raises(ValueError):
        tg.context_for(memory, {"update_id": 2, "callback_query": {}})


def test_recall_reply_links_and_stays_inside_a_group():
    memory = FakeMemory()
    answer = tg.recall_reply(memory, {"message": message(GROUP, 50, text="what is my locker code?")})
    assert answer == "1. Alice Liddell: my locker code is 4512\n   ↳ https://t.me/c/1234567890/41"
    assert memory.calls[-1] == (
        "recall",
        ("telegram:111", "what is my locker code?"),
        {"limit": 5, "thread_id": "telegram:-1001234567890"},
    )
    tg.recall_reply(memory, message(PRIVATE, 51, text="locker?"))
    assert memory.calls[-1][2]["thread_id"] is None  # a private chat searches all the user's chats
    unknown = FakeMemory(recall_error=NotReadable("telegram:-1001234567890"))
    assert tg.recall_reply(unknown, message(GROUP, 52, text="x?")) == "I found nothing about that in memory."


# --- the shared update handling ------------------------------------------------------------------
class ListPublisher:
    def __init__(self, fail: bool = False):
        self.events: list[Any] = []
        self.fail = fail

    def publish_nowait(self, event: Any) -> None:
        if self.fail:
            raise RuntimeError("publisher is closed")
        self.events.append(event)


def run_update(update: dict[str, Any], publisher: ListPublisher, memory: Any, answer: bool = True):
    sent: list[tuple[tg.Incoming, str]] = []

    async def send(incoming: tg.Incoming, text: str) -> None:
        assert tg.is_quiet()  # the adapter's own answers are not published
        sent.append((incoming, text))
        tg.record_sent(publisher, "sendMessage", message(PRIVATE, 9100, user=BOT, text=text))

    handled = asyncio.run(
        tg.handle_update(update, publisher, memory, bot_username="memo_bot", answer_commands=answer, send=send)
    )
    return handled, sent


def test_commands_are_published_and_answered_quietly():
    publisher, memory = ListPublisher(), FakeMemory()
    handled, sent = run_update({"message": message(PRIVATE, 60, text="/remember I like tea")}, publisher, memory)
    assert handled and [e.event_id for e in publisher.events] == ["telegram:111:60"]
    assert [text for _, text in sent] == ["Noted: I like tea"]
    handled, sent = run_update({"message": message(PRIVATE, 61, text="/whatdoyouknow")}, publisher, memory)
    assert handled and len(publisher.events) == 1  # read-only: answered, not published
    assert sent[0][1] == "I don't remember anything about you yet." and memory.calls[-1][1] == ("telegram:111",)
    handled, sent = run_update({"message": message(PRIVATE, 62, text="/forget tea")}, publisher, memory, answer=False)
    assert not handled and not sent and publisher.events[-1].command == "forget"
    handled, _ = run_update({"message": message(PRIVATE, 63, text="plain")}, publisher, memory)
    assert not handled and publisher.events[-1].text == "plain"


def test_a_failing_publisher_or_a_bad_update_never_breaks_the_bot(caplog):
    caplog.set_level(logging.ERROR)
    handled, _ = run_update({"message": message(PRIVATE, 64, text="hi")}, ListPublisher(fail=True), None)
    assert not handled and "was not handed to the publisher" in caplog.text
    handled, _ = run_update({"update_id": 9, "message": {"message_id": 1}}, ListPublisher(), None)
    assert not handled and "could not be mapped" in caplog.text


def test_a_message_that_cannot_be_mapped_is_logged_without_its_words(caplog):
    # Beyond the wire contract's text limit (a Bot API message is at most 4,096 characters, but
    # a bot's own sends go through the same mapping): the log says why, never what was said.
    caplog.set_level(logging.WARNING)
    words = "my secret plan " * 3000
    handled, _ = run_update({"update_id": 10, "message": message(PRIVATE, 65, text=words)}, ListPublisher(), None)
    assert not handled
    tg.record_sent(ListPublisher(), "sendMessage", message(PRIVATE, 66, user=BOT, text=words))
    records = [r for r in caplog.records if "could not be mapped" in r.getMessage()]
    assert [r.getMessage().split("mapped: ", 1)[1] for r in records] == [
        "text: is 45000 characters, above the limit of 32000"
    ] * 2
    assert "secret" not in caplog.text and all(r.exc_info is None for r in records)


# --- the libraries' dumps are the Bot API JSON -----------------------------------------------------
RAW_UPDATES = [
    {"update_id": 1, "message": message(GROUP, 41, text="Tomatoes", reply_to_message=message(GROUP, 40, text="?"))},
    {
        "update_id": 2,
        "message": message(
            FORUM,
            80,
            photo=photo_sizes("P"),
            caption="roadmap",
            message_thread_id=77,
            is_topic_message=True,
            forward_origin={"type": "user", "date": T0 - 5, "sender_user": BOB},
        ),
    },
    {"update_id": 3, "edited_message": message(GROUP, 41, text="Tomatoes!", edit_date=T0 + 9)},
    {"update_id": 4, "message": message(PRIVATE, 5, voice={"file_id": "V", "file_unique_id": "v", "duration": 2})},
    {"update_id": 5, "message": message(PRIVATE, 6, text="/remember@memo_bot I like tea")},
    {"update_id": 6, "channel_post": message(CHANNEL, 7, user=None, sender_chat=CHANNEL, text="news")},
    {"update_id": 7, "message": message(BASIC_GROUP, 8, text="family")},
    {"update_id": 8, "business_message": business(message(PRIVATE, 9, text="tulips?", reply_to_message=None))},
    {
        "update_id": 9,
        "edited_business_message": business(
            message(PRIVATE, 10, user=OWNER, text="We open at 9", sender_business_bot=BOT, edit_date=T0 + 3)
        ),
    },
    {
        "update_id": 10,
        "deleted_business_messages": {"business_connection_id": CONNECTION, "chat": PRIVATE, "message_ids": [9]},
    },
]


@pytest.mark.parametrize("raw", RAW_UPDATES, ids=lambda u: next(k for k in u if k != "update_id"))
def test_ptb_and_aiogram_dumps_map_like_the_raw_bot_api_json(raw):
    from aiogram.types import Update as AiogramUpdate
    from telegram import Update as PtbUpdate

    def mapped(update: dict[str, Any]) -> tg.Incoming | None:
        incoming = tg.map_update(update, bot_username="memo_bot")
        if incoming is None or incoming.event is None or incoming.event.type != "message_deleted":
            return incoming
        # A deletion carries no date: the event is dated when the adapter learns of it.
        return replace(incoming, event=incoming.event.model_copy(update={"occurred_at": WHEN}))

    expected = mapped(raw)
    ptb = PtbUpdate.de_json(raw, None).to_dict()
    aio = AiogramUpdate.model_validate(raw).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert mapped(ptb) == expected
    assert mapped(aio) == expected


# --- tokens in logs ------------------------------------------------------------------------------
def test_bot_tokens_are_redacted_from_text_and_log_records():
    token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    line = f'HTTP Request: POST https://api.telegram.org/bot{token}/getUpdates "HTTP/1.1 200 OK"'
    assert (
        redact_bot_tokens(line) == 'HTTP Request: POST https://api.telegram.org/bot<token>/getUpdates "HTTP/1.1 200 OK"'
    )
    assert token not in redact_bot_tokens(f"file/bot{token}/photos/a.jpg and {token} alone")
    assert redact_bot_tokens("odd-token", "odd-token") == "<token>"
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "HTTP Request: %s %s", ("GET", line), None)
    assert BotTokenFilter().filter(record) and token not in record.getMessage()


def test_a_deletion_is_mapped_only_from_a_confirmed_delete_call_in_a_numbered_chat():
    one = tg.map_deleted("deleteMessage", {"chat_id": -1001234567890, "message_id": 42}, True, 7000001)
    assert one is not None and (one.event_id, one.thread_id, one.user_id, one.platform_message_ids) == (
        "telegram:-1001234567890:42:deleted",
        "telegram:-1001234567890",
        "telegram:7000001",
        ["42"],
    )
    many = tg.map_deleted("deletemessages", {"chat_id": "111", "message_ids": [9, 7, 9]}, True, None)
    assert many is not None and (many.event_id, many.user_id, many.platform_message_ids) == (
        "telegram:111:7:deleted",  # named by its first message, whatever order the call gave
        "telegram:bot",
        ["7", "9"],
    )
    for method, params, result in [
        ("deleteMessage", {"chat_id": 111, "message_id": 42}, False),  # Telegram refused
        ("deleteMessage", {"chat_id": "@news", "message_id": 42}, True),  # a username names no thread
        ("deleteMessage", {"chat_id": 111, "message_id": True}, True),
        ("deleteMessages", {"chat_id": 111, "message_ids": []}, True),
        ("deleteChatPhoto", {"chat_id": 111}, True),
        ("sendMessage", {"chat_id": 111, "text": "hi"}, {"message_id": 1}),
    ]:
        assert tg.map_deleted(method, params, result, 1) is None, (method, params)


def test_a_deletion_is_published_even_inside_quietly():
    published: list[Any] = []

    class Collect:
        def publish_nowait(self, event: Any) -> None:
            published.append(event)

    with tg.quietly():
        tg.record_deleted(Collect(), "deleteMessage", {"chat_id": 111, "message_id": 5}, True, 1)
        tg.record_sent(Collect(), "sendMessage", {"message_id": 6, "date": 0, "chat": {"id": 111, "type": "private"}})
    assert [e.event_id for e in published] == ["telegram:111:5:deleted"]
