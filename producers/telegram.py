"""Telegram: the one mapping from Bot API JSON to events, shared by the python-telegram-bot
adapter (telegram_ptb.py) and the aiogram one (telegram_aiogram.py). No Telegram library is
imported here: both libraries give the Bot API's own JSON (`Update.to_dict()` in PTB,
`update.model_dump(mode="json", by_alias=True, exclude_none=True)` in aiogram), so the mapping
is a pure function over dicts, tested without a network.

Ids (docs/chat-adapters.md has the full rules):
- thread_id  `telegram:<chat_id>`, or `telegram:<chat_id>:<message_thread_id>` in a forum topic
- user_id    `telegram:<user id>` (the sending chat's id for messages sent on behalf of a chat)
- event_id   `telegram:<chat_id>:<message_id>`; an edit `...:edit:<edit_date>`; a redelivered
  update therefore maps to the same event id and is stored once
- business   a chat of a business account the bot is connected to puts
  `business:<connection digest>:` before the chat id, and its people's user ids are scoped the
  same way (see `business_tag`)
- files      `telegram:file/<file_id>`, fetched by the attachments worker with its own token
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeGuard

from pydantic import ValidationError

from chatmem.memory.recall import NotReadable
from chatmem.producers.chat import (
    COMMAND_DESCRIPTIONS,
    ChatCommand,
    MemoryView,
    Origin,
    command_event,
    command_reply,
    mapping_failure,
    parse_command,
    render_recall,
    without_nul,
)
from chatmem.schemas.events import (
    Attachment,
    AttachmentKind,
    MessageDeletedEvent,
    MessageEditedEvent,
    MessageEvent,
    Role,
)
from chatmem.schemas.read import Citation
from chatmem.schemas.records import AnyEvent

log = logging.getLogger(__name__)

PLATFORM = "telegram"
FILE_URL_PREFIX = "telegram:file/"
# Update fields that carry a new message, and those that carry an edited one.
MESSAGE_KEYS = ("message", "channel_post")
EDIT_KEYS = ("edited_message", "edited_channel_post")
# The same for the chats of a business account the bot is connected to, and its deletions: the
# one kind of deletion Telegram tells a bot about.
BUSINESS_MESSAGE, BUSINESS_EDIT, BUSINESS_DELETED = (
    "business_message",
    "edited_business_message",
    "deleted_business_messages",
)
# Bot API calls that delete messages, and the parameter that names them. Telegram tells a bot of
# no deletion made by someone else, so these calls are all it can report.
DELETE_METHODS = {"deletemessage": "message_id", "deletemessages": "message_ids"}

Json = Mapping[str, Any]


class EventPublisher(Protocol):
    """What the adapters publish through: `Publisher` (producers/publisher.py) or a test double.
    `publish_nowait` must not block: it runs on the bot's event loop."""

    def publish_nowait(self, event: AnyEvent) -> None: ...


# --- ids ----------------------------------------------------------------------------------------
def thread_id_for(chat_id: int | str, topic_id: int | str | None = None) -> str:
    return f"telegram:{chat_id}" if topic_id is None else f"telegram:{chat_id}:{topic_id}"


def user_id_for(user_id: int | str) -> str:
    return f"telegram:{user_id}"


def message_event_id(chat_id: int | str, message_id: int | str) -> str:
    return f"telegram:{chat_id}:{message_id}"


def edit_event_id(chat_id: int | str, message_id: int | str, edit_date: int) -> str:
    return f"telegram:{chat_id}:{message_id}:edit:{edit_date}"


def file_url(file_id: str) -> str:
    return FILE_URL_PREFIX + file_id


def business_tag(connection_id: str) -> str:
    """What ids carry of a business connection: `business:` and 16 hex digits of its sha256.
    The connection id itself is what the bot acts for the business account with (beside its
    token); memory only needs to tell connections apart, so it keeps none."""
    return "business:" + hashlib.sha256(connection_id.encode()).hexdigest()[:16]


def _business(message: Json) -> str | None:
    connection = message.get("business_connection_id")
    return business_tag(str(connection)) if connection else None


def chat_part(message: Json) -> str:
    """The chat in a message's ids. A business chat is the private chat between the business
    account and a customer: its id is the customer's user id, the same as the bot's own private
    chat with them and as every other business's chat with them, so the connection goes first."""
    chat_id = message["chat"]["id"]
    tag = _business(message)
    return f"{tag}:{chat_id}" if tag else str(chat_id)


def topic_id(message: Json) -> int | None:
    """The forum topic a message is in; None outside topics. In an ordinary group a reply chain
    also has a message_thread_id, but it is not a topic (is_topic_message is absent)."""
    if message.get("is_topic_message") and message.get("message_thread_id") is not None:
        return int(message["message_thread_id"])
    return None


def thread_id_of(message: Json) -> str:
    return thread_id_for(chat_part(message), topic_id(message))


def user_id_of(message: Json, *, prefer_from: bool = False) -> str:
    """The sender: the chat a message was sent on behalf of (a channel post, an anonymous group
    admin, a linked channel's automatic forward), else the user. `prefer_from` takes the user
    first (the bot's own messages). In a business chat a person is a user of that business only:
    facts the bot learns for one business must not reach another's chats, nor the bot's own
    chat with the same person. The bot answering for the business is the bot."""
    if bot := message.get("sender_business_bot"):
        return user_id_for(bot["id"])
    sender = _sender(message, prefer_from)
    sender_id = sender["id"] if sender else message["chat"]["id"]
    tag = _business(message)
    return user_id_for(f"{tag}:{sender_id}" if tag else sender_id)


def _sender(message: Json, prefer_from: bool) -> Json | None:
    if bot := message.get("sender_business_bot"):
        return bot
    user, chat = message.get("from"), message.get("sender_chat")
    return (user or chat) if prefer_from else (chat or user)


def author_name(entity: Json | None) -> str | None:
    """'First Last', else the username, else a chat's title."""
    if not entity:
        return None
    name = " ".join(p for p in (entity.get("first_name"), entity.get("last_name")) if p).strip()
    return name or entity.get("username") or entity.get("title") or None


def _when(value: Any) -> datetime:
    """Bot API dates are Unix seconds; accept datetimes and ISO strings too (serialisers differ)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) or (isinstance(value, str) and value.isdigit()):
        return datetime.fromtimestamp(int(value), UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _epoch(value: Any) -> int:
    return int(_when(value).timestamp())


# --- content ------------------------------------------------------------------------------------
def content_text(message: Json) -> str:
    """The words of a message: its text or caption; for content without words, a short
    bracketed description (a sticker's emoji, a poll, a place, a contact)."""
    return without_nul(_words(message))


def _words(message: Json) -> str:
    text = message.get("text") or message.get("caption")
    if text:
        return str(text)
    if sticker := message.get("sticker"):
        return f"[sticker {sticker.get('emoji') or ''}]".replace(" ]", "]")
    if poll := message.get("poll"):
        options = " / ".join(str(o.get("text", "")) for o in poll.get("options", []))
        return f"[poll] {poll.get('question', '')} — {options}"
    if venue := message.get("venue"):
        return f"[venue] {venue.get('title', '')}, {venue.get('address', '')}"
    if location := message.get("location"):
        return f"[location {float(location['latitude']):.5f}, {float(location['longitude']):.5f}]"
    if contact := message.get("contact"):
        return f"[contact] {author_name(contact) or ''}".rstrip()
    if dice := message.get("dice"):
        return f"[dice {dice.get('emoji', '')} {dice.get('value', '')}]"
    return ""


# (message field, kind, MIME type when the platform gives none). Telegram re-encodes photos as
# JPEG; voice notes are OGG/Opus; animations and video notes are MP4.
_MEDIA: tuple[tuple[str, AttachmentKind | None, str | None], ...] = (
    ("animation", AttachmentKind.VIDEO, "video/mp4"),
    ("document", None, None),
    ("video", AttachmentKind.VIDEO, "video/mp4"),
    ("video_note", AttachmentKind.VIDEO, "video/mp4"),
    ("voice", AttachmentKind.AUDIO, "audio/ogg"),
    ("audio", AttachmentKind.AUDIO, "audio/mpeg"),
)


def attachments_of(message: Json) -> list[Attachment]:
    """References to the message's files (never the bytes): the largest size of a photo,
    documents, audio, voice notes, videos, video notes, animations. Stickers are not fetched:
    their emoji is the message text."""
    caption = without_nul(str(message.get("caption") or "")) or None
    found: list[Attachment | None] = []
    if photo := message.get("photo"):
        best = max(photo, key=lambda p: (int(p.get("width", 0)) * int(p.get("height", 0)), p.get("file_size") or 0))
        found.append(_attachment(best, AttachmentKind.IMAGE, "image/jpeg", caption))
    for key, kind, default_mime in _MEDIA:
        media = message.get(key)
        if not media or (key == "document" and message.get("animation")):
            continue  # an animation also comes as `document`, for old clients
        found.append(_attachment(media, kind or _kind_of(media.get("mime_type")), default_mime, caption))
    return [a for a in found if a is not None]


def _kind_of(mime: str | None) -> AttachmentKind:
    family = (mime or "").split("/", 1)[0].lower()
    return {
        "image": AttachmentKind.IMAGE,
        "audio": AttachmentKind.AUDIO,
        "video": AttachmentKind.VIDEO,
    }.get(family, AttachmentKind.DOCUMENT)


def _attachment(file: Json, kind: AttachmentKind, default_mime: str | None, caption: str | None) -> Attachment | None:
    try:
        return Attachment(
            url=file_url(str(file["file_id"])),
            kind=kind,
            mime_type=file.get("mime_type") or default_mime,
            filename=without_nul(str(file["file_name"])) if file.get("file_name") else None,
            caption=caption,
            size_bytes=file.get("file_size"),
        )
    except ValidationError as error:  # one odd file must not cost the message its text
        log.warning("chatmem: a Telegram file reference was left out: %s", mapping_failure(error))
        return None


def _reply_to(message: Json) -> str | None:
    replied = message.get("reply_to_message")
    if not replied:
        return None
    # In a forum topic every message "replies" to the topic's first message; that is no reply.
    if message.get("is_topic_message") and replied.get("message_id") == message.get("message_thread_id"):
        return None
    return str(replied["message_id"])


def _forward_origin(origin: Json) -> dict[str, Any]:
    out: dict[str, Any] = {"type": origin.get("type")}
    if origin.get("date") is not None:
        out["date"] = _when(origin["date"]).isoformat()
    if user := origin.get("sender_user"):
        out["user_id"] = user_id_for(user["id"])
        out["name"] = author_name(user)
    elif origin.get("sender_user_name"):
        out["name"] = origin["sender_user_name"]
    if chat := origin.get("sender_chat") or origin.get("chat"):
        out["chat_id"] = chat["id"]
        out["name"] = author_name(chat)
    if origin.get("message_id") is not None:
        out["message_id"] = str(origin["message_id"])
    if origin.get("author_signature"):
        out["signature"] = origin["author_signature"]
    return out


def _metadata(message: Json, prefer_from: bool) -> dict[str, Any]:
    chat = message["chat"]
    meta: dict[str, Any] = {"chat_type": chat.get("type")}
    if name := author_name(_sender(message, prefer_from)):
        meta["author_name"] = name
    if chat.get("title"):
        meta["chat_title"] = chat["title"]
    if (topic := topic_id(message)) is not None:
        meta["topic_id"] = topic
    if origin := message.get("forward_origin"):
        meta["forward_origin"] = _forward_origin(origin)
    if quote := (message.get("quote") or {}).get("text"):
        meta["quote"] = quote
    if message.get("media_group_id"):
        meta["media_group_id"] = str(message["media_group_id"])
    if sticker := message.get("sticker"):
        meta["sticker"] = {k: sticker[k] for k in ("emoji", "set_name") if sticker.get(k)}
    return meta


# --- updates ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Incoming:
    """One message of an update, mapped. `event` is what to publish (None for a read-only
    command such as /whatdoyouknow); `command` is set when the message is a memory command."""

    event: AnyEvent | None
    chat_id: int
    message_id: int
    topic_id: int | None
    thread_id: str
    user_id: str
    command: tuple[ChatCommand, str] | None = None


def map_update(update: Json, *, bot_username: str | None = None) -> Incoming | None:
    """The event an update holds: a new message (or channel post), a memory command, an edit,
    or a business chat's message, edit or deletion; None for everything else (callback
    queries, service messages, member changes ...)."""
    for key in MESSAGE_KEYS:
        if update.get(key):
            return map_message(update[key], bot_username=bot_username)
    for key in EDIT_KEYS:
        if update.get(key):
            return map_edit(update[key])
    if message := update.get(BUSINESS_MESSAGE):
        # The bot speaks there as the business, to people who may not know a bot is listening:
        # a memory command is their words to the business, not an order to the bot.
        by_bot = bool(message.get("sender_business_bot"))
        return map_message(message, role=Role.ASSISTANT if by_bot else Role.USER, commands=False)
    if message := update.get(BUSINESS_EDIT):
        return map_edit(message, assistant=bool(message.get("sender_business_bot")))
    if deleted := update.get(BUSINESS_DELETED):
        return map_business_deleted(deleted)
    return None


def map_message(
    message: Json, *, role: Role = Role.USER, bot_username: str | None = None, commands: bool = True
) -> Incoming | None:
    """A new message; a memory command (`/remember@this_bot ...`) becomes its command event
    instead. None for a message with nothing to remember (a service message)."""
    assistant = role is Role.ASSISTANT
    chat_id, message_id = int(message["chat"]["id"]), int(message["message_id"])
    topic = topic_id(message)
    thread, user = thread_id_of(message), user_id_of(message, prefer_from=assistant)
    meta = _metadata(message, assistant)
    origin = Origin(
        event_id=message_event_id(chat_part(message), message_id),
        thread_id=thread,
        user_id=user,
        platform=PLATFORM,
        occurred_at=_when(message["date"]),
        platform_message_id=str(message_id),
        metadata=meta,
    )
    parsed = parse_command(message.get("text"), bot_username) if commands and not assistant else None
    if parsed is not None:
        return Incoming(command_event(origin, *parsed), chat_id, message_id, topic, thread, user, parsed)
    text, attachments = content_text(message), attachments_of(message)
    if not text and not attachments:
        return None
    event = MessageEvent(
        event_id=origin.event_id,
        thread_id=thread,
        user_id=user,
        platform=PLATFORM,
        occurred_at=origin.occurred_at,
        role=role,
        text=text,
        platform_message_id=origin.platform_message_id,
        reply_to=_reply_to(message),
        attachments=attachments,
        metadata=meta,
    )
    return Incoming(event, chat_id, message_id, topic, thread, user)


def map_edit(message: Json, *, assistant: bool = False) -> Incoming:
    """An edited message; its event id carries the edit date, so each edit is stored once."""
    chat_id, message_id = int(message["chat"]["id"]), int(message["message_id"])
    edit_date = _epoch(message.get("edit_date") or message["date"])
    text = content_text(message)
    event_id = edit_event_id(chat_part(message), message_id, edit_date)
    if assistant:
        # A bot streaming its answer edits several times a second; the text tells those apart.
        event_id += ":" + hashlib.sha256(text.encode()).hexdigest()[:8]
    thread, user = thread_id_of(message), user_id_of(message, prefer_from=assistant)
    event = MessageEditedEvent(
        event_id=event_id,
        thread_id=thread,
        user_id=user,
        platform=PLATFORM,
        occurred_at=_when(edit_date),
        platform_message_id=str(message_id),
        text=text,
        metadata=_metadata(message, assistant),
    )
    return Incoming(event, chat_id, message_id, topic_id(message), thread, user)


def map_deleted(method: str, params: Json, result: Any, bot_id: int | None) -> MessageDeletedEvent | None:
    """The messages the bot deleted with `deleteMessage` or `deleteMessages`, once Telegram said
    it did (the answer is `true`). None for any other call, or a chat named by its @username,
    which names no thread. The event is in the chat's thread: the call does not say which forum
    topic, and the worker looks in the chat's topics too."""
    key = DELETE_METHODS.get(method.lower())
    if key is None or result is not True:
        return None
    chat, named = params.get("chat_id"), params.get(key)
    ids = named if isinstance(named, list | tuple) else [named]
    numbers = [int(i) for i in ids if _whole_number(i)]
    if not _whole_number(chat) or not numbers or len(numbers) < len(ids):
        return None
    ordered = sorted(set(numbers))
    return MessageDeletedEvent(
        event_id=f"{message_event_id(int(chat), ordered[0])}:deleted",  # a message is deleted once
        thread_id=thread_id_for(int(chat)),
        user_id=user_id_for(bot_id) if bot_id else f"{PLATFORM}:bot",
        platform=PLATFORM,
        platform_message_ids=[str(i) for i in ordered],
    )


def map_business_deleted(deleted: Json) -> Incoming | None:
    """Messages deleted in a business chat, by either side: Telegram does not say who, so the
    event's user is the chat's other person. None when it names no message."""
    ids = sorted({int(i) for i in deleted.get("message_ids") or []})
    if not ids:
        return None
    chat_id = int(deleted["chat"]["id"])
    chat = f"{business_tag(str(deleted['business_connection_id']))}:{chat_id}"
    thread = thread_id_for(chat)
    user = user_id_for(chat)
    event = MessageDeletedEvent(
        event_id=f"{message_event_id(chat, ids[0])}:deleted",
        thread_id=thread,
        user_id=user,
        platform=PLATFORM,
        platform_message_ids=[str(i) for i in ids],
    )
    return Incoming(event, chat_id, ids[0], None, thread, user)


def _whole_number(value: Any) -> TypeGuard[int | str]:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit())


def _is_message(value: Any) -> bool:
    return isinstance(value, Mapping) and "message_id" in value and "chat" in value and "date" in value


def map_sent(method: str, result: Any) -> list[AnyEvent]:
    """The bot's own messages, from a Bot API call and its result: `sendMessage`, `sendPhoto`,
    `sendMediaGroup` ... become assistant messages, `editMessageText` ... their edits. Calls
    that return no message (sendChatAction, getMe, an inline message's edit) give nothing."""
    results = result if isinstance(result, list) else [result]
    events: list[AnyEvent] = []
    for item in results:
        if not _is_message(item):
            continue
        if method.lower().startswith("edit"):
            mapped: Incoming | None = map_edit(item, assistant=True)
        else:
            mapped = map_message(item, role=Role.ASSISTANT, commands=False)
        if mapped is not None and mapped.event is not None:
            events.append(mapped.event)
    return events


def message_of(update_or_message: Json) -> Json | None:
    """The message in an update dict, or the dict itself when it is a message."""
    if _is_message(update_or_message):
        return update_or_message
    for key in (*MESSAGE_KEYS, *EDIT_KEYS, BUSINESS_MESSAGE, BUSINESS_EDIT):
        if update_or_message.get(key):
            return update_or_message[key]
    return None


# --- reading memory back --------------------------------------------------------------------
def telegram_link(citation: Citation) -> str | None:
    """A t.me deep link to the cited message. Only supergroups and channels (chat ids
    -100XXXXXXXXXX) have them: https://t.me/c/XXXXXXXXXX/<msg>, in a forum topic
    https://t.me/c/XXXXXXXXXX/<topic>/<msg>. Private chats and basic groups: None."""
    parts = citation.thread_id.split(":")
    if parts[0] != "telegram" or len(parts) not in (2, 3):
        return None
    chat, message_id = parts[1], citation.platform_message_id
    if not (chat.startswith("-100") and chat[4:].isdigit()) or not (message_id and message_id.isdigit()):
        return None
    if len(parts) == 3:
        return f"https://t.me/c/{chat[4:]}/{parts[2]}/{message_id}" if parts[2].isdigit() else None
    return f"https://t.me/c/{chat[4:]}/{message_id}"


def context_for(memory: MemoryView, update_or_message: Json, *, query: str | None = None, **kw: Any) -> list[dict]:
    """`build_context` messages for the bot's LLM call about this message (OpenAI chat format).
    The query is the message's text unless given."""
    message = message_of(update_or_message)
    if message is None:
        raise ValueError("the update holds no message")
    query = query if query is not None else (content_text(message) or None)
    return memory.build_context(thread_id_of(message), user_id_of(message), query, **kw).messages


def recall_reply(memory: MemoryView, update_or_message: Json, question: str | None = None, *, limit: int = 5) -> str:
    """An answer from memory with citations (t.me links where Telegram has them). In a group
    only that chat (or topic) is searched, so nothing from a user's private chats is shown to
    the group; in a private chat, every chat the user wrote in; in a business chat, that chat."""
    message = message_of(update_or_message)
    if message is None:
        raise ValueError("the update holds no message")
    question = question if question is not None else content_text(message)
    private = message["chat"].get("type") == "private" and not _business(message)
    try:
        result = memory.recall(
            user_id_of(message), question, limit=limit, thread_id=None if private else thread_id_of(message)
        )
    except NotReadable:  # the user's first words in this chat are not ingested yet
        return "I found nothing about that in memory."
    return render_recall(result, telegram_link, limit=limit)


def command_reply_for(memory: MemoryView | None, incoming: Incoming) -> str:
    if incoming.command is None:
        raise ValueError("not a command")
    command, arg = incoming.command
    return command_reply(memory, command, arg, thread_id=incoming.thread_id, user_id=incoming.user_id)


def bot_commands() -> list[tuple[str, str]]:
    """(command, description) pairs for setMyCommands."""
    return [(command.value, text[:256]) for command, text in COMMAND_DESCRIPTIONS.items()]


# --- what both adapters do with an update ---------------------------------------------------
_QUIET: ContextVar[bool] = ContextVar("chatmem_telegram_quiet", default=False)


@contextmanager
def quietly() -> Iterator[None]:
    """Messages the bot sends inside this block are not published: the adapter's own answers to
    memory commands would otherwise feed memory its own contents."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def is_quiet() -> bool:
    return _QUIET.get()


def publish_all(publisher: EventPublisher, events: list[AnyEvent]) -> None:
    for event in events:
        try:
            publisher.publish_nowait(event)
        except Exception:  # memory must never break the bot; the reason is logged
            log.exception("chatmem: event %s was not handed to the publisher", event.event_id)


def record_sent(publisher: EventPublisher, method: str, result: Any) -> None:
    """Publish the bot's own messages from one Bot API call (the libraries' hooks call this)."""
    if is_quiet():
        return
    try:
        events = map_sent(method, result)
    except (ValidationError, KeyError, TypeError, ValueError) as error:
        log.error("chatmem: the result of %s could not be mapped: %s", method, mapping_failure(error))
        return
    publish_all(publisher, events)


def record_deleted(publisher: EventPublisher, method: str, params: Json, result: Any, bot_id: int | None) -> None:
    """Publish the deletion one Bot API call made (the libraries' hooks call this). Unlike a
    message, a deletion inside `quietly()` is published too: what is gone must be forgotten."""
    try:
        event = map_deleted(method, params, result, bot_id)
    except (ValidationError, TypeError, ValueError) as error:
        log.error("chatmem: the deletion by %s could not be mapped: %s", method, mapping_failure(error))
        return
    if event is not None:
        publish_all(publisher, [event])


Send = Callable[[Incoming, str], Awaitable[object]]


async def handle_update(
    update: Json,
    publisher: EventPublisher,
    memory: MemoryView | None,
    *,
    bot_username: str | None,
    answer_commands: bool,
    send: Send,
) -> bool:
    """Publish what an incoming update holds and, if asked, answer a memory command through
    `send(incoming, text)`. True when the update was a command answered here: the bot's own
    handlers should then not see it."""
    try:
        incoming = map_update(update, bot_username=bot_username)
    except (ValidationError, KeyError, TypeError, ValueError) as error:
        log.error("chatmem: update %s could not be mapped: %s", update.get("update_id"), mapping_failure(error))
        return False
    if incoming is None:
        return False
    if incoming.event is not None:
        publish_all(publisher, [incoming.event])  # before any await: updates stay in order
    if incoming.command is None or not answer_commands:
        return False
    # The read path queries the database: off the event loop.
    text = await asyncio.to_thread(command_reply_for, memory, incoming)
    with quietly():
        await send(incoming, text)
    return True
