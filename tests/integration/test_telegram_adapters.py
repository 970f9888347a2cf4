"""The Telegram adapters for real: python-telegram-bot's and aiogram's own polling loops and
handlers run against a local stand-in for the Bot API (tests/telegram_stub.py) and publish into
the embedded Redis. Checked: exactly which events arrive (ids, types, threads, roles, the bot's
replies), that a redelivered update is stored once, that the attachments worker fetches
telegram:file/ references through getFile, and that the bot token appears in no event, stream
entry, stored failure reason or log line."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest
from PIL import Image, ImageDraw, ImageFont

from chatmem.adapters.fetch import FetchLimits, TelegramFiles, UrlFetcher
from chatmem.memory.attachments import BadFile
from chatmem.memory.ports import TransientError
from chatmem.producers import telegram_aiogram, telegram_ptb
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import CommandEvent, MessageEditedEvent, MessageEvent, parse_event
from chatmem.workers.ingest import IngestRunner
from tests.conftest import ROOT, logged_events, scalar, settings_env, stop, wait_for
from tests.integration.test_episodes import Driver
from tests.telegram_stub import (
    BOB,
    CONNECTION,
    FORUM,
    GROUP,
    OWNER,
    PRIVATE,
    T0,
    TelegramStub,
    business,
    message,
    photo_sizes,
)

pytestmark = pytest.mark.integration

TOKEN = "7000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw-x"
SECRET = TOKEN.split(":", 1)[1]
NOTES = b"Garden notes\n\nTomatoes need full sun. Basil next to the tomatoes keeps pests away.\n"
VOICE = b"OggS\x00\x02" + b"\x00" * 200  # an Ogg page header: sniffed as audio (no speech-to-text model here)


def balcony_photo() -> bytes:
    image = Image.new("RGB", (640, 200), "white")
    ImageDraw.Draw(image).text((30, 70), "BALCONY PLAN", fill="black", font=ImageFont.load_default(size=48))
    out = io.BytesIO()
    image.save(out, "JPEG")
    return out.getvalue()


@pytest.fixture
def stub():
    with TelegramStub(TOKEN) as s:
        s.add_file("PH-x", balcony_photo(), "photos/file_1.jpg")
        s.add_file("DOC1", NOTES, "documents/file_2.txt")
        s.add_file("VOICE1", VOICE, "voice/file_3.oga")
        yield s


@pytest.fixture
def settings(settings_factory, stub):
    # Overrides the shared fixture: the worker's token and Bot API base are the stub's.
    return settings_factory(telegram_bot_token=TOKEN, telegram_api_url=stub.url)


# --- the script: (update, events it publishes, messages the bot sends) --------------------------
TOPIC_ROOT = message(FORUM, 77, text=None, forum_topic_created={"name": "Roadmap", "icon_color": 1})
ASKED = message(GROUP, 10, user=BOB, text="Which seeds should we buy?")
FIRST = message(PRIVATE, 1, text="Hi! I am planning a balcony garden")
COMMANDS = [
    ("/remember I am vegetarian", "Noted: I am vegetarian"),
    ("/forget my old address", "I'll forget what matches: my old address"),
    ("/summary", "No summaries yet."),
    ("/newtopic", "OK, new topic."),
    ("/memory_off", "Memory is off for this chat: I'll keep the log but build nothing from it until /memory_on."),
    ("/memory_on", "Memory is on for this chat."),
    ("/whatdoyouknow@memo_bot", "I don't remember anything about you yet."),
]
SCRIPT: list[tuple[dict[str, Any], int, int]] = [
    ({"message": FIRST}, 2, 1),
    ({"message": ASKED}, 2, 1),
    ({"message": message(GROUP, 11, text="Tomatoes and basil", reply_to_message=ASKED)}, 2, 1),
    (
        {
            "message": message(
                PRIVATE,
                2,
                text="Meeting moved to Friday",
                forward_origin={"type": "user", "date": T0 - 600, "sender_user": BOB},
            )
        },
        2,
        1,
    ),
    ({"edited_message": {**FIRST, "text": "Hi! I am planning a balcony herb garden", "edit_date": T0 + 60}}, 1, 0),
    ({"message": message(PRIVATE, 3, photo=photo_sizes("PH"), caption="my balcony")}, 1, 0),
    (
        {
            "message": message(
                PRIVATE,
                4,
                document={
                    "file_id": "DOC1",
                    "file_unique_id": "d1",
                    "file_name": "notes.txt",
                    "mime_type": "text/plain",
                },
            )
        },
        1,
        0,
    ),
    ({"message": message(PRIVATE, 5, voice={"file_id": "VOICE1", "file_unique_id": "v1", "duration": 2})}, 1, 0),
    (
        {
            "message": message(
                FORUM,
                80,
                text="Ship the beta in May",
                message_thread_id=77,
                is_topic_message=True,
                reply_to_message=TOPIC_ROOT,
            )
        },
        2,
        1,
    ),
    *[
        ({"message": message(PRIVATE, 6 + i, text=text)}, 0 if "whatdoyouknow" in text else 1, 1)
        for i, (text, _) in enumerate(COMMANDS)
    ],
    ({"message": FIRST}, 2, 1),  # redelivered: the same message again
]

P, G, F = "telegram:111", "telegram:-1001234567890", "telegram:-1009876543210:77"
BOT_USER = "telegram:7000001"
ECHO = "assistant"
# (type, event_id, thread_id, role or command, user_id, reply_to); ECHO rows get the bot's ids.
EXPECTED: list[tuple[str, str | None, str, str, str, str | None]] = [
    ("message", "telegram:111:1", P, "user", "telegram:111", None),
    ("message", None, P, ECHO, BOT_USER, "1"),
    ("message", "telegram:-1001234567890:10", G, "user", "telegram:222", None),
    ("message", None, G, ECHO, BOT_USER, "10"),
    ("message", "telegram:-1001234567890:11", G, "user", "telegram:111", "10"),
    ("message", None, G, ECHO, BOT_USER, "11"),
    ("message", "telegram:111:2", P, "user", "telegram:111", None),
    ("message", None, P, ECHO, BOT_USER, "2"),
    ("message_edited", f"telegram:111:1:edit:{T0 + 60}", P, "-", "telegram:111", None),
    ("message", "telegram:111:3", P, "user", "telegram:111", None),
    ("message", "telegram:111:4", P, "user", "telegram:111", None),
    ("message", "telegram:111:5", P, "user", "telegram:111", None),
    ("message", "telegram:-1009876543210:80", F, "user", "telegram:111", None),
    ("message", None, F, ECHO, BOT_USER, "80"),
    ("command", "telegram:111:6", P, "remember", "telegram:111", None),
    ("command", "telegram:111:7", P, "forget", "telegram:111", None),
    ("command", "telegram:111:8", P, "summarize_now", "telegram:111", None),
    ("command", "telegram:111:9", P, "close_episode", "telegram:111", None),
    ("command", "telegram:111:10", P, "memory_off", "telegram:111", None),
    ("command", "telegram:111:11", P, "memory_on", "telegram:111", None),
    ("message", "telegram:111:1", P, "user", "telegram:111", None),
    ("message", None, P, ECHO, BOT_USER, "1"),
]


def row(event: Any) -> tuple[str, str, str, str, str, str | None]:
    if isinstance(event, MessageEvent):
        return ("message", event.event_id, event.thread_id, event.role.value, event.user_id, event.reply_to)
    if isinstance(event, MessageEditedEvent):
        return ("message_edited", event.event_id, event.thread_id, "-", event.user_id, None)
    assert isinstance(event, CommandEvent)
    return ("command", event.event_id, event.thread_id, event.command.value, event.user_id, None)


async def until(predicate: Callable[[], bool], what: Callable[[], str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what())
        await asyncio.sleep(0.02)


def player(
    stub: TelegramStub, container: Any, script: list[tuple[dict[str, Any], int, int]] = SCRIPT
) -> Callable[[], Awaitable[None]]:
    """Pushes the script one update at a time, waiting for its events and replies, so the
    stream's order is the script's whatever the library's concurrency."""
    r, key = container.redis, container.settings.stream_key

    async def play() -> None:
        events = sent = 0
        for update, n_events, n_sent in script:
            stub.push(update)
            events, sent = events + n_events, sent + n_sent
            await until(
                lambda e=events, s=sent: r.xlen(key) >= e and len(stub.sent) >= s,
                lambda e=events, s=sent, u=update: f"after {u}: {r.xlen(key)}/{e} events, {len(stub.sent)}/{s} sent",
            )

    return play


# A moderation bot's rules: a message giving a password away is deleted at once, and "clean up"
# deletes the two messages before it in one call.
PASSWORD, CLEAN_UP = "password", "clean up"
Play = Callable[[], Awaitable[None]]  # pushes the updates and waits for what they publish
# The bots the tests run: "echo" repeats each text, "moderate" deletes by the rules above,
# "business" answers a business account's customers (not its owner) for it, and nothing else.
Mode = Literal["echo", "moderate", "business"]


def thanks(first_name: str) -> str:
    return f"Thanks, {first_name}! Olga will be with you shortly."


async def run_ptb(stub: TelegramStub, publisher: Publisher, memory: Any, play: Play, mode: Mode = "echo") -> None:
    from telegram import Update
    from telegram.ext import Application, ContextTypes, MessageHandler, filters

    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        m = update.effective_message
        assert m is not None and m.text is not None
        if mode == "echo":
            await m.reply_text(f"echo: {m.text}", do_quote=True)
        elif mode == "business":
            if m.from_user is not None and m.from_user.id != OWNER["id"]:
                await m.reply_text(thanks(m.from_user.first_name))  # PTB answers for the business
        elif PASSWORD in m.text:
            await m.delete()
        elif m.text == CLEAN_UP:
            await context.bot.delete_messages(m.chat_id, [m.message_id - 2, m.message_id - 1])

    app = Application.builder().token(TOKEN).base_url(f"{stub.url}/bot").base_file_url(f"{stub.url}/file/bot").build()
    telegram_ptb.add_memory(app, publisher, memory=memory)
    kind = filters.UpdateType.BUSINESS_MESSAGE if mode == "business" else filters.UpdateType.MESSAGE
    app.add_handler(MessageHandler(kind & filters.TEXT & ~filters.COMMAND, echo))
    async with app:
        assert await telegram_ptb.set_commands(app.bot)
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0, timeout=1)
        try:
            await play()
        finally:
            await app.updater.stop()
            await app.stop()


async def run_aiogram(stub: TelegramStub, publisher: Publisher, memory: Any, play: Play, mode: Mode = "echo") -> None:
    from aiogram import Bot, Dispatcher, F, Router
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer
    from aiogram.types import Message

    bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(stub.url)))
    router = Router()

    # Only a message handler: aiogram would ask Telegram for message updates only; add_memory
    # must make it ask for edits (and a business's edits and deletions) too (the stub honours
    # allowed_updates).
    observer = router.business_message if mode == "business" else router.message

    @observer(F.text, ~F.text.startswith("/"))
    async def echo(m: Message) -> None:
        assert m.text is not None
        if mode == "echo":
            await m.reply(f"echo: {m.text}")
        elif mode == "business":
            if m.from_user is not None and m.from_user.id != OWNER["id"]:
                await m.reply(thanks(m.from_user.first_name))  # aiogram answers for the business
        elif PASSWORD in m.text:
            await m.delete()
        elif m.text == CLEAN_UP:
            await bot.delete_messages(m.chat.id, [m.message_id - 2, m.message_id - 1])

    dp = Dispatcher()
    dp.include_router(router)
    telegram_aiogram.add_memory(dp, bot, publisher, memory=memory)
    assert await telegram_aiogram.set_commands(bot)
    polling = asyncio.create_task(dp.start_polling(bot, handle_signals=False, polling_timeout=1))
    try:
        await until(lambda: "getUpdates" in stub.methods(), lambda: "aiogram never polled")
        await play()
    finally:
        await dp.stop_polling()
        await polling


@pytest.mark.parametrize("run", [run_ptb, run_aiogram], ids=["python-telegram-bot", "aiogram"])
def test_a_bot_publishes_exactly_what_happened_and_the_token_stays_secret(run, stub, container, caplog):
    caplog.set_level(logging.DEBUG)
    publisher = Publisher(container.sink, container.settings.resolved_spool_dir)
    try:
        asyncio.run(run(stub, publisher, container, player(stub, container)))
        assert publisher.flush(10)
    finally:
        publisher.close()

    # The command menu, and the answers to the commands, sent by the adapter itself.
    commands = next(p for m, p in stub.calls if m == "setMyCommands")["commands"]
    assert [c["command"] for c in commands] == [
        "remember",
        "forget",
        "summary",
        "newtopic",
        "memory_off",
        "memory_on",
        "whatdoyouknow",
        "forget_me",
    ]
    answers = [s["text"] for s in stub.sent if not s["text"].startswith("echo:")]
    assert answers == [reply for _, reply in COMMANDS]
    echoes = [s for s in stub.sent if s["text"].startswith("echo:")]
    in_topic = [e for e in echoes if e["chat"]["id"] == FORUM["id"]]
    assert [(e.get("message_thread_id"), e["reply_to_message"]["message_id"]) for e in in_topic] == [(77, 80)]

    # Exactly these events, in this order; the bot's replies carry the ids the API gave them.
    entries = container.redis.xrange(container.settings.stream_key)
    events = [parse_event(fields[b"event"]) for _, fields in entries]
    echo_ids = iter(f"telegram:{s['chat']['id']}:{s['message_id']}" for s in echoes)
    expected = [(t, eid or next(echo_ids), th, r, u, rt) for t, eid, th, r, u, rt in EXPECTED]
    assert [row(e) for e in events] == expected
    by_id = {e.event_id: e for e in events}
    assert by_id["telegram:111:1"].text == "Hi! I am planning a balcony garden"
    assert by_id[f"telegram:111:1:edit:{T0 + 60}"].text == "Hi! I am planning a balcony herb garden"
    assert by_id["telegram:111:2"].metadata["forward_origin"]["name"] == "Bob"
    assert by_id["telegram:111:6"].args == {"text": "I am vegetarian"}
    assert [(a.url, a.kind, a.caption) for a in by_id["telegram:111:3"].attachments] == [
        ("telegram:file/PH-x", "image", "my balcony")
    ]
    assert [(a.url, a.filename) for a in by_id["telegram:111:4"].attachments] == [("telegram:file/DOC1", "notes.txt")]
    assert [(a.url, a.kind) for a in by_id["telegram:111:5"].attachments] == [("telegram:file/VOICE1", "audio")]
    assert by_id[expected[1][1]].text == "echo: Hi! I am planning a balcony garden"

    # Ingest: the redelivered update added nothing.
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == len(events) - 1 == len(set(by_id))
    assert scalar(container, "SELECT count(*) FROM events WHERE event_id = 'telegram:111:1'") == 1
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0

    # The attachments worker fetches the files through getFile with the token from its settings.
    driver = Driver(container)
    driver.advance(P)
    assert sorted(driver.run_attachments()) == ["done", "done", "failed"]
    with container.pool.connection() as conn:
        refs = conn.execute(
            "SELECT event_id, a.status, a.reason, f.kind FROM attachments a LEFT JOIN artifacts f USING (sha256)"
            " ORDER BY event_id"
        ).fetchall()
    assert [(e, s, k) for e, s, _, k in refs] == [
        ("telegram:111:3", "linked", "image"),
        ("telegram:111:4", "linked", "document"),
        ("telegram:111:5", "linked", "audio"),
    ]
    # A voice note is read by a speech-to-text model, and none is set here.
    assert "CHATMEM_TRANSCRIPTION_MODEL" in scalar(container, "SELECT reason FROM artifacts WHERE kind = 'audio'")
    assert [m for m, _ in stub.calls].count("getFile") == 3

    # The token is nowhere: not in the stream, the log, stored reasons, nor the captured logs.
    assert all(SECRET.encode() not in fields[b"event"] for _, fields in entries)
    with container.pool.connection() as conn:
        stored = conn.execute(
            """SELECT string_agg(coalesce(reason, ''), ' ') FROM attachments
               UNION ALL SELECT string_agg(coalesce(reason, '') || coalesce(description, ''), ' ') FROM artifacts"""
        ).fetchall()
    assert all(SECRET not in (text or "") for (text,) in stored)
    assert SECRET not in json.dumps([e["payload"] for e in logged_events(container)])  # opened: as published
    assert "getUpdates" in caplog.text or run is run_aiogram  # PTB's httpx request lines were captured...
    assert SECRET not in caplog.text  # ...with the token redacted
    assert all(SECRET not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("run", [run_ptb, run_aiogram], ids=["python-telegram-bot", "aiogram"])
def test_messages_the_bot_deletes_are_published_and_forgotten(run, stub, container):
    """Telegram tells a bot of no deletion, but a moderation bot makes its own: each successful
    deleteMessage or deleteMessages call becomes a message_deleted event, and the maintenance job
    shreds the messages, here one in a forum topic (the call names only the chat)."""
    leak = message(FORUM, 90, text="the office wifi password is hunter2", message_thread_id=77, is_topic_message=True)
    script = [
        (leak, 2),
        (message(GROUP, 20, user=BOB, text="cheap watches, click now"), 1),
        (message(GROUP, 21, user=BOB, text="cheap watches, last chance"), 1),
        (message(GROUP, 22, text=CLEAN_UP), 2),
    ]
    r, key = container.redis, container.settings.stream_key

    async def play() -> None:
        expected = 0
        for msg, n in script:
            stub.push({"message": msg})
            expected += n
            await until(
                lambda e=expected: r.xlen(key) >= e, lambda m=msg: f"{r.xlen(key)} events after {m['message_id']}"
            )

    publisher = Publisher(container.sink, container.settings.resolved_spool_dir)
    try:
        asyncio.run(run(stub, publisher, container, play, mode="moderate"))
        assert publisher.flush(10)
    finally:
        publisher.close()
    deletions = [(m, p) for m, p in stub.calls if m.lower() in ("deletemessage", "deletemessages")]
    assert [(m, str(p["chat_id"]), str(p.get("message_id") or p.get("message_ids"))) for m, p in deletions] == [
        ("deleteMessage", str(FORUM["id"]), "90"),
        ("deleteMessages", str(GROUP["id"]), "[20, 21]"),
    ]
    events = [parse_event(fields[b"event"]) for _, fields in r.xrange(key)]
    assert [
        (e.event_id, e.thread_id, e.user_id, e.platform_message_ids) for e in events if e.type == "message_deleted"
    ] == [
        (f"telegram:{FORUM['id']}:90:deleted", f"telegram:{FORUM['id']}", BOT_USER, ["90"]),
        (f"telegram:{GROUP['id']}:20:deleted", G, BOT_USER, ["20", "21"]),
    ]

    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    driver = Driver(container)
    for thread in (F, G, f"telegram:{FORUM['id']}"):
        driver.advance(thread)
    assert container.forget_deleted(f"telegram:{FORUM['id']}")["events"] == 1  # found in its topic
    assert container.forget_deleted(G)["events"] == 2
    with container.pool.connection() as conn:
        texts = {r[0] for r in conn.execute("SELECT text FROM messages")}
    assert texts == {CLEAN_UP}
    assert "hunter2" not in json.dumps([e["payload"] for e in logged_events(container)])


@pytest.mark.parametrize("run", [run_ptb, run_aiogram], ids=["python-telegram-bot", "aiogram"])
def test_a_business_bot_remembers_each_business_apart_and_forgets_what_telegram_deletes(run, stub, container):
    """A bot connected to a business account: its customers' messages, the owner's and the
    bot's answers for the business are published in a thread of that business chat, apart from
    Alice's own chat with the bot (the same chat id). A command is a customer's words, not an
    order. Telegram's deleted_business_messages update is honoured: the message is shredded."""
    from chatmem.producers import telegram

    stub.business_owners[CONNECTION] = OWNER
    command_entity = {"type": "bot_command", "offset": 0, "length": len("/memory_off")}
    shop = f"telegram:{telegram.business_tag(CONNECTION)}:111"
    card = "my card is 4111 1111 1111 1111"
    deleted = {"business_connection_id": CONNECTION, "chat": PRIVATE, "message_ids": [8]}
    script: list[tuple[dict[str, Any], int, int]] = [  # (update, events it publishes, messages sent)
        ({"message": message(PRIVATE, 5, text="my locker code is 4471")}, 1, 0),
        ({"business_message": business(message(PRIVATE, 5, text="Do you have white tulips?"))}, 2, 1),
        ({"business_message": business(message(PRIVATE, 6, user=OWNER, text="Yes, 3 euros a stem"))}, 1, 0),
        ({"business_message": business(message(PRIVATE, 7, text="/memory_off", entities=[command_entity]))}, 1, 0),
        (
            {"edited_business_message": business(message(PRIVATE, 5, text="Pink tulips?", edit_date=T0 + 60))},
            1,
            0,
        ),
        ({"business_message": business(message(PRIVATE, 8, text=card))}, 2, 1),
        ({"deleted_business_messages": deleted}, 1, 0),
    ]
    r, key = container.redis, container.settings.stream_key
    publisher = Publisher(container.sink, container.settings.resolved_spool_dir)
    try:
        asyncio.run(run(stub, publisher, container, player(stub, container, script), mode="business"))
        assert publisher.flush(10)
    finally:
        publisher.close()

    # The bot answered the customer twice, for the business; nothing answered the command.
    assert [(s["text"], s["business_connection_id"]) for s in stub.sent] == [(thanks("Alice"), CONNECTION)] * 2
    events = [parse_event(fields[b"event"]) for _, fields in r.xrange(key)]
    answers = iter(f"{shop}:{s['message_id']}" for s in stub.sent)
    customer, owner = shop, shop.removesuffix(":111") + ":444"
    assert [
        (e.type, e.event_id, e.thread_id, getattr(e, "role", "-"), e.user_id, getattr(e, "text", None)) for e in events
    ] == [
        ("message", "telegram:111:5", P, "user", "telegram:111", "my locker code is 4471"),
        ("message", f"{shop}:5", shop, "user", customer, "Do you have white tulips?"),
        ("message", next(answers), shop, "assistant", BOT_USER, thanks("Alice")),
        ("message", f"{shop}:6", shop, "user", owner, "Yes, 3 euros a stem"),
        ("message", f"{shop}:7", shop, "user", customer, "/memory_off"),
        ("message_edited", f"{shop}:5:edit:{T0 + 60}", shop, "-", customer, "Pink tulips?"),
        ("message", f"{shop}:8", shop, "user", customer, card),
        ("message", next(answers), shop, "assistant", BOT_USER, thanks("Alice")),
        ("message_deleted", f"{shop}:8:deleted", shop, "-", customer, None),
    ]
    assert CONNECTION not in json.dumps([fields[b"event"].decode() for _, fields in r.xrange(key)])

    # Ingest and process: the deleted message is shredded; the business chat's memory is its own.
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    driver = Driver(container)
    for thread in (P, shop):
        driver.advance(thread)
    assert container.forget_deleted(shop)["events"] == 1
    # docs/privacy.md's query for a person's business user ids, before an erasure.
    scoped = "SELECT DISTINCT user_id FROM thread_members WHERE user_id LIKE 'telegram:business:%:111'"
    with container.pool.connection() as conn:
        assert [r[0] for r in conn.execute(scoped)] == [customer]
    with container.pool.connection() as conn:
        texts = {r[0]: r[1] for r in conn.execute("SELECT text, thread_id FROM messages")}
    assert card not in texts and texts["my locker code is 4471"] == P
    assert texts["Pink tulips?"] == texts["/memory_off"] == shop  # the command did not pause the chat
    assert "4111" not in json.dumps([e["payload"] for e in logged_events(container)])
    asked = {"business_message": business(message(PRIVATE, 9, text="What is my locker code?"))}
    assert "4471" not in telegram.recall_reply(container, asked)
    assert "4471" in telegram.recall_reply(container, {"message": message(PRIVATE, 9, text="What is my locker code?")})


# --- the fetcher on its own ------------------------------------------------------------------------
def fetcher(stub: TelegramStub | None, token: str | None = TOKEN, **limits: Any) -> UrlFetcher:
    url = stub.url if stub else "http://127.0.0.1:9"  # port 9 (discard): nothing listens
    lim = {"max_bytes": 1_000_000, "timeout_s": 5.0} | limits
    return UrlFetcher(FetchLimits(**lim), telegram=TelegramFiles(url, token and _secret(token)))


def _secret(token: str) -> Any:
    from pydantic import SecretStr

    return SecretStr(token)


def test_the_fetcher_resolves_telegram_files_and_tells_permanent_from_transient(stub, settings, container, caplog):
    caplog.set_level(logging.DEBUG)
    # The wiring the worker uses: token and API base from the settings.
    assert container.fetcher.fetch("telegram:file/DOC1") == NOTES
    assert fetcher(stub).fetch("telegram:file/VOICE1") == VOICE
    assert "getFile" in caplog.text  # httpx's request lines were logged, redacted

    stub.add_file("HUGE", b"x", too_big=True)
    failures: list[Exception] = []
    for url, error, words in [
        ("telegram:file/HUGE", BadFile, "larger than the 20 MB the Bot API lets bots download"),
        ("telegram:file/NOPE", BadFile, "refused the file: Bad Request: invalid file_id"),
        ("telegram:file/../x", BadFile, "malformed telegram file reference"),
    ]:
        with pytest.raises(error, match=words) as caught:
            fetcher(stub).fetch(url)
        failures.append(caught.value)
    with pytest.raises(BadFile, match="attachment is 39 bytes, above the limit of 10") as caught:
        stub.add_file("SMALL", b"a" * 39)
        fetcher(stub, max_bytes=10).fetch("telegram:file/SMALL")
    failures.append(caught.value)
    with pytest.raises(BadFile, match="telegram file references need CHATMEM_TELEGRAM_BOT_TOKEN"):
        fetcher(stub, token=None).fetch("telegram:file/DOC1")
    with pytest.raises(BadFile, match="refused the bot token .401 Unauthorized.") as caught:
        fetcher(stub, token="7000001:WRONGWRONGWRONGWRONGWRONGWRONG").fetch("telegram:file/DOC1")
    failures.append(caught.value)

    stub.get_file_failures += [502, 429]
    for words in ("answered getFile with 502", "answered getFile with 429"):
        with pytest.raises(TransientError, match=words) as caught:
            fetcher(stub).fetch("telegram:file/DOC1")
        failures.append(caught.value)
    with pytest.raises(TransientError, match="cannot reach the Telegram Bot API") as caught:
        fetcher(None).fetch("telegram:file/DOC1")
    failures.append(caught.value)

    for failure in failures:
        assert SECRET not in str(failure) and SECRET not in repr(failure)
    assert SECRET not in caplog.text
    assert SECRET not in repr(container.fetcher.telegram) and SECRET not in repr(container.settings)


def test_a_transient_failure_on_the_last_attempt_is_stored_without_the_token(stub, container):
    publisher = Publisher(container.sink, container.settings.resolved_spool_dir)
    with publisher:
        publisher.publish(
            MessageEvent(
                event_id="telegram:111:500",
                thread_id="telegram:111",
                user_id="telegram:111",
                platform="telegram",
                text="",
                attachments=[{"url": "telegram:file/DOC1", "kind": "document"}],
            )
        )
    driver = Driver(container)
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    driver.advance("telegram:111")
    stub.get_file_failures.append(503)
    assert driver.run_attachments(last_attempt=True) == ["failed"]
    reason = scalar(container, "SELECT reason FROM attachments WHERE event_id = 'telegram:111:500'")
    assert reason == "gave up after retries: the Telegram Bot API answered getFile with 503: Internal Server Error"


# --- the example bot ---------------------------------------------------------------------------------
def test_the_example_bot_answers_from_memory_with_deep_links(stub, container):
    """examples/telegram_bot.py as a user runs it, with no LLM: /whatdoyouknow and a question
    answered from memory, the citation a t.me link to the original message; connected to a
    business, a customer's question answered for the business, the owner's words not answered."""
    from chatmem.producers import telegram

    said = message(GROUP, 41, text="The allotment locker code is 4512, by the way")
    asked = business(message(PRIVATE, 29, text="Do you sell tulips?"))
    hours = business(message(PRIVATE, 30, user=OWNER, text="Yes! On Saturdays the shop opens at 10 am."))
    stub.business_owners[CONNECTION] = OWNER
    driver = Driver(container)
    for update in ({"message": said}, {"business_message": asked}, {"business_message": hours}):
        event = telegram.map_update(update)
        assert event is not None and event.event is not None
        driver.publish([event.event])
        driver.advance(event.thread_id)

    env = settings_env(container.settings) | {"TELEGRAM_BOT_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    for key in ("CHATMEM_TELEGRAM_BOT_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(key, None)  # the bot needs no worker token; no LLM: answers come from memory
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "telegram_bot.py"), "--api-url", stub.url],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_for(lambda: "getUpdates" in stub.methods(), timeout=120), stop(proc)
        assert "setMyCommands" in stub.methods()
        stub.push({"message": message(GROUP, 42, text="/whatdoyouknow")})
        stub.push({"message": message(GROUP, 43, text="What is the locker code?")})
        assert wait_for(lambda: len(stub.sent) >= 2, timeout=120), stop(proc)
        stub.push({"business_message": business(message(PRIVATE, 31, user=OWNER, text="Anyone there?"))})
        stub.push({"business_message": business(message(PRIVATE, 32, text="When does the shop open on Saturdays?"))})
        assert wait_for(lambda: len(stub.sent) >= 3, timeout=120), stop(proc)
    finally:
        output = stop(proc)
    known, recalled, for_the_shop = (s["text"] for s in stub.sent[:3])
    assert known == "Recent conversations:\n• 2026-01-01 — (not summarized yet)"  # the episode just built
    assert "4512" in recalled and "https://t.me/c/1234567890/41" in recalled, recalled
    assert "10 am" in for_the_shop and "4512" not in for_the_shop, for_the_shop
    assert stub.sent[2]["business_connection_id"] == CONNECTION and len(stub.sent) == 3  # the owner: no answer
    assert SECRET not in output
    # The question and the bot's answer were published; the read-only command was not.
    assert wait_for(lambda: container.redis.xlen(container.settings.stream_key) >= 8, timeout=20)
    published = [parse_event(f[b"event"]) for _, f in container.redis.xrange(container.settings.stream_key)]
    shop = f"telegram:{telegram.business_tag(CONNECTION)}:111"
    assert [(row(e)[1], row(e)[3]) for e in published] == [
        ("telegram:-1001234567890:41", "user"),  # what the test published first
        (f"{shop}:29", "user"),
        (f"{shop}:30", "user"),
        ("telegram:-1001234567890:43", "user"),
        (f"telegram:-1001234567890:{stub.sent[1]['message_id']}", "assistant"),
        (f"{shop}:31", "user"),
        (f"{shop}:32", "user"),
        (f"{shop}:{stub.sent[2]['message_id']}", "assistant"),
    ]
