"""Memory for a discord.py 2 bot: every message, edit, deletion and memory command becomes an event,
published fire-and-forget from the bot's listeners; the slash commands answer from memory.

    cog = await add_memory(bot, publisher, memory)   # in setup_hook; then `await bot.tree.sync()`

Ids, what is published and the decisions behind them: docs/chat-adapters.md (Discord)."""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import re
from collections import OrderedDict
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, Protocol

import discord
from discord import app_commands
from discord.ext import commands
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
from chatmem.producers.discord_ids import PLATFORM, message_event_id, thread_id_for, user_id_for
from chatmem.schemas.events import (
    Attachment,
    AttachmentKind,
    CommandEvent,
    MessageDeletedEvent,
    MessageEditedEvent,
    MessageEvent,
    Role,
)
from chatmem.schemas.read import Citation, RecallResult, Scope
from chatmem.schemas.records import AnyEvent

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2000  # Discord refuses longer message content
MAX_ATTACHMENTS = 32  # the wire limit per event
DM_GUILD = "@me"  # the guild part of a DM's message link

# Types that carry what someone wrote; joins, pins, boosts and the like are not conversation.
# thread_starter_message is left out: its content lives in the parent channel's message.
REGULAR_TYPES = frozenset(
    {
        discord.MessageType.default,
        discord.MessageType.reply,
        discord.MessageType.chat_input_command,
        discord.MessageType.context_menu_command,
    }
)
# Answered from the read path; deferred first, since a read can outlast Discord's 3 s limit.
READ_COMMANDS = frozenset({ChatCommand.WHATDOYOUKNOW, ChatCommand.SUMMARY})
# Replies that would show one user's memory to a whole channel.
PRIVATE_COMMANDS = frozenset({ChatCommand.WHATDOYOUKNOW})

_DOCUMENT_TYPES = frozenset({"application/pdf", "application/rtf", "application/msword", "application/json"})
_DOCUMENT_PREFIXES = ("text/", "application/vnd.openxmlformats-officedocument.", "application/vnd.oasis.opendocument.")
_THREAD_RE = re.compile(r"^discord:(\d+)$")


class EventPublisher(Protocol):
    """A `Publisher`: hands the event over and returns at once (safe in the event loop)."""

    def publish_nowait(self, event: AnyEvent) -> None: ...


# channel id -> the guild id as a string, "@me" for a DM, None when unknown.
GuildLookup = Callable[[int], str | None]


# --- ids ------------------------------------------------------------------------------------
def edit_event_id(message_id: int, edited_at: datetime) -> str:
    """One event per edit: the edit's own timestamp tells two edits apart, and a repeated
    MESSAGE_UPDATE for the same edit (a pin, a redelivery) maps to the same id."""
    micros = int(edited_at.timestamp() * 1_000_000)
    return f"{PLATFORM}:{message_id}:e{micros}"


def deletion_event_id(message_ids: Collection[int]) -> str:
    """A message is deleted once, so its id names the deletion; a bulk delete is named by its
    first message, and a redelivered one maps to the same event."""
    return f"{PLATFORM}:{min(message_ids)}:deleted"


def interaction_event_id(interaction_id: int) -> str:
    return f"{PLATFORM}:i{interaction_id}"


# --- mapping --------------------------------------------------------------------------------
def attachment_kind(content_type: str | None, filename: str | None = None) -> AttachmentKind:
    """The kind from the declared content type, else from the file name's extension."""
    mime = (content_type or "").split(";", 1)[0].strip().lower() or (mimetypes.guess_type(filename or "")[0] or "")
    major = mime.split("/", 1)[0]
    if major in ("image", "audio", "video"):
        return AttachmentKind(major)
    if mime in _DOCUMENT_TYPES or mime.startswith(_DOCUMENT_PREFIXES):
        return AttachmentKind.DOCUMENT
    return AttachmentKind.OTHER


def to_attachment(item: discord.Attachment) -> Attachment | None:
    """A reference to the CDN file (bytes never travel in events); None for a non-https URL,
    or for a file the wire contract refuses (logged: one odd file must not cost the message its
    text)."""
    if not item.url.startswith("https://"):
        return None
    mime = (item.content_type or "").split(";", 1)[0].strip() or None
    try:
        return Attachment(
            url=item.url,
            kind=attachment_kind(item.content_type, item.filename),
            mime_type=mime,
            filename=_clean(item.filename) or None,
            caption=_clean(item.description) or None,  # the alt text the author wrote
            size_bytes=item.size,
        )
    except ValidationError as error:
        log.warning("a Discord file reference was left out: %s", mapping_failure(error))
        return None


def message_text(message: discord.Message) -> str:
    """What the message says, as a reader would see it: mentions as names, forwarded text,
    text of rich embeds (a bot's answers often are embeds), stickers by name. Link previews
    are left out: they come from a URL that is already in the text."""
    parts = [message.clean_content]
    parts += [f"[forwarded] {s.content}" for s in message.message_snapshots if s.content.strip()]
    parts += [f"[embed] {t}" for t in map(_embed_text, message.embeds) if t]
    parts += [f"[sticker: {s.name}]" for s in message.stickers]
    return _clean("\n".join(p for p in parts if p.strip()))


def _embed_text(embed: discord.Embed) -> str:
    if embed.type != "rich":
        return ""
    lines = [embed.title or "", embed.description or ""]
    lines += [f"{f.name}: {f.value}" for f in embed.fields]
    return "\n".join(line for line in lines if line)


def _clean(text: str | None) -> str:
    # clean_content escapes @everyone with a zero-width space (for re-sending); it does not
    # belong in memory.
    return without_nul((text or "").replace("\u200b", ""))


def message_metadata(message: discord.Message) -> dict[str, Any]:
    """Where and by whom, for people reading memory; no tokens, no e-mail, nothing private."""
    meta: dict[str, Any] = {"author_name": _clean(message.author.display_name)}
    guild_id = message_guild_id(message)
    if guild_id is not None:
        meta["guild_id"] = str(guild_id)
    else:
        meta["dm"] = True
    name = getattr(message.channel, "name", None)
    if isinstance(name, str) and name:
        meta["channel_name"] = _clean(name)
    if isinstance(message.channel, discord.Thread) and message.channel.parent_id:
        meta["parent_channel_id"] = str(message.channel.parent_id)
    if message.author.bot:
        meta["is_bot"] = True
    return meta


def message_guild_id(message: discord.Message) -> int | None:
    """The guild, also when discord.py has not cached it (a message that arrives before its
    GUILD_CREATE comes with a PartialMessageable channel that still knows the guild id)."""
    if message.guild is not None:
        return message.guild.id
    guild_id = getattr(message.channel, "guild_id", None)
    return guild_id if isinstance(guild_id, int) else None


def message_origin(message: discord.Message, event_id: str | None = None) -> Origin:
    return Origin(
        event_id=event_id or message_event_id(message.id),
        thread_id=thread_id_for(message.channel.id),
        user_id=user_id_for(message.author.id),
        platform=PLATFORM,
        occurred_at=message.created_at,
        platform_message_id=str(message.id),
        metadata=message_metadata(message),
    )


def message_event(message: discord.Message, bot_user_id: int | None = None) -> MessageEvent | None:
    """The event for one Discord message; None for a system message or one with nothing in it.
    The bot's own messages (author == bot user) are the assistant's turns."""
    if message.type not in REGULAR_TYPES:
        return None
    attachments = [a for a in map(to_attachment, _all_attachments(message)) if a is not None][:MAX_ATTACHMENTS]
    text = message_text(message)
    if not text.strip() and not attachments:
        return None
    origin = message_origin(message)
    metadata = dict(origin.metadata)
    reply_to = None
    ref = message.reference
    if ref is not None and ref.type is discord.MessageReferenceType.reply and ref.message_id:
        if ref.channel_id == message.channel.id:
            reply_to = str(ref.message_id)
        else:  # an answer to a message of another channel: not a message of this thread
            metadata["reply_to_channel"] = str(ref.channel_id)
            metadata["reply_to_message"] = str(ref.message_id)
    if ref is not None and ref.type is discord.MessageReferenceType.forward:
        metadata["forwarded"] = True
    own = bot_user_id is not None and message.author.id == bot_user_id
    return MessageEvent(
        event_id=origin.event_id,
        thread_id=origin.thread_id,
        user_id=origin.user_id,
        platform=PLATFORM,
        occurred_at=origin.occurred_at,
        role=Role.ASSISTANT if own else Role.USER,
        text=text,
        platform_message_id=origin.platform_message_id,
        reply_to=reply_to,
        attachments=attachments,
        metadata=metadata,
    )


def _all_attachments(message: discord.Message) -> list[discord.Attachment]:
    return [*message.attachments, *(a for s in message.message_snapshots for a in s.attachments)]


def edit_event(message: discord.Message) -> MessageEditedEvent | None:
    """The event for an edit; None for an update that is not one (Discord sends MESSAGE_UPDATE
    when it adds link previews too, with no edit timestamp) or for a system message."""
    if message.edited_at is None or message.type not in REGULAR_TYPES:
        return None
    origin = message_origin(message, edit_event_id(message.id, message.edited_at))
    return MessageEditedEvent(
        event_id=origin.event_id,
        thread_id=origin.thread_id,
        user_id=origin.user_id,
        platform=PLATFORM,
        occurred_at=message.edited_at,
        platform_message_id=str(message.id),
        text=message_text(message),
        metadata=origin.metadata,
    )


def deletion_event(channel_id: int, message_ids: Collection[int], who: int) -> MessageDeletedEvent | None:
    """The event for messages deleted in a channel (one, or a moderator's bulk delete); `who` is
    the author when the bot still had the message cached, else the bot itself. None for no ids."""
    if not message_ids:
        return None
    return MessageDeletedEvent(
        event_id=deletion_event_id(message_ids),
        thread_id=thread_id_for(channel_id),
        user_id=user_id_for(who),
        platform=PLATFORM,
        platform_message_ids=[str(i) for i in sorted(message_ids)],
    )


def interaction_origin(interaction: discord.Interaction[Any]) -> Origin | None:
    """The origin of a slash command; None when Discord did not say which channel it came from."""
    if interaction.channel_id is None:
        return None
    meta: dict[str, Any] = {"author_name": _clean(interaction.user.display_name), "interaction": "slash_command"}
    if interaction.guild_id is not None:
        meta["guild_id"] = str(interaction.guild_id)
    else:
        meta["dm"] = True
    name = getattr(interaction.channel, "name", None)
    if isinstance(name, str) and name:
        meta["channel_name"] = _clean(name)
    return Origin(
        event_id=interaction_event_id(interaction.id),
        thread_id=thread_id_for(interaction.channel_id),
        user_id=user_id_for(interaction.user.id),
        platform=PLATFORM,
        occurred_at=interaction.created_at,
        metadata=meta,
    )


def memory_command_event(origin: Origin, command: ChatCommand, arg: str) -> CommandEvent | None:
    """`command_event`, except that an empty /remember or /forget changes nothing (the reply is
    the usage line)."""
    if command in (ChatCommand.REMEMBER, ChatCommand.FORGET) and not arg.strip():
        return None
    return command_event(origin, command, arg)


# --- deep links -----------------------------------------------------------------------------
def discord_link(citation: Citation, guild_of: GuildLookup | None = None) -> str | None:
    """https://discord.com/channels/<guild or @me>/<channel>/<message> for a citation of a
    Discord thread. The thread id names only the channel, so the guild comes from `guild_of`
    (MemoryCog.guild_of knows the channels the bot has seen); None when it is unknown, the
    citation is of another platform, or it names no message (a summary links its first source)."""
    match = _THREAD_RE.match(citation.thread_id)
    message_id = citation.platform_message_id or next(iter(citation.source_ids), None)
    if match is None or guild_of is None or not message_id or not message_id.isdigit():
        return None
    channel_id = int(match[1])
    guild = guild_of(channel_id)
    if guild is None:
        return None
    return f"https://discord.com/channels/{guild}/{channel_id}/{message_id}"


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the cog --------------------------------------------------------------------------------
class MemoryCog(commands.Cog, name="chatmem"):
    """Listeners that publish every message and edit, and the memory slash commands.

    `memory` (optional) is what the read commands, `context_for` and `recall_reply` read; a
    bot without it still publishes everything."""

    def __init__(
        self,
        bot: commands.Bot,
        publisher: EventPublisher,
        memory: MemoryView | None = None,
        *,
        text_commands: bool = True,
        known_channels: int = 10_000,
    ) -> None:
        self.bot = bot
        self.publisher = publisher
        self.memory = memory
        self.text_commands = text_commands
        # channel -> guild for the links; bot.get_channel forgets DMs and archived threads.
        self._guilds: OrderedDict[int, str] = OrderedDict()
        self._known_channels = known_channels

    # --- listeners ----------------------------------------------------------------------
    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        self._note_channel(message.channel.id, message_guild_id(message))
        parsed = self._text_command(message)
        if parsed is not None:
            await self._answer_text_command(message, *parsed)
            return
        try:
            event = message_event(message, self.bot.user.id if self.bot.user else None)
        except (ValidationError, TypeError, ValueError) as error:
            log.error("message %s could not be mapped: %s", message.id, mapping_failure(error))
            return
        if event is not None:
            self.publisher.publish_nowait(event)

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        # The raw event, not on_message_edit: that one fires only for messages still in the
        # bot's cache (the last 1,000, none from before a restart).
        message = payload.message
        if self._text_command(message) is not None:
            return  # a command already ran; editing it does not run it again
        try:
            event = edit_event(message)
        except (ValidationError, TypeError, ValueError) as error:
            log.error("the edit of message %s could not be mapped: %s", message.id, mapping_failure(error))
            return
        if event is not None:
            self.publisher.publish_nowait(event)

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        # The raw events again: they fire for messages the cache never held. Memory forgets what
        # was deleted (docs/privacy.md).
        cached = payload.cached_message
        self._publish_deletion(payload.channel_id, [payload.message_id], cached.author.id if cached else None)

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        self._publish_deletion(payload.channel_id, payload.message_ids, None)

    def _publish_deletion(self, channel_id: int, message_ids: Collection[int], author_id: int | None) -> None:
        who = author_id or (self.bot.user.id if self.bot.user else 0)
        try:
            event = deletion_event(channel_id, message_ids, who)
        except (ValidationError, TypeError, ValueError) as error:
            log.error("the deletion in channel %s could not be mapped: %s", channel_id, mapping_failure(error))
            return
        if event is not None:
            self.publisher.publish_nowait(event)

    # --- slash commands -----------------------------------------------------------------
    @app_commands.command(name="remember", description=COMMAND_DESCRIPTIONS[ChatCommand.REMEMBER])
    @app_commands.describe(text="What to remember about you")
    async def remember(self, interaction: discord.Interaction[Any], text: str) -> None:
        await self.answer_slash(interaction, ChatCommand.REMEMBER, text)

    @app_commands.command(name="forget", description=COMMAND_DESCRIPTIONS[ChatCommand.FORGET])
    @app_commands.describe(text="What to forget")
    async def forget(self, interaction: discord.Interaction[Any], text: str) -> None:
        await self.answer_slash(interaction, ChatCommand.FORGET, text)

    @app_commands.command(name="summary", description=COMMAND_DESCRIPTIONS[ChatCommand.SUMMARY])
    @app_commands.describe(level="running (default), episodes, a roll-up level number, or all")
    async def summary(self, interaction: discord.Interaction[Any], level: str = "") -> None:
        await self.answer_slash(interaction, ChatCommand.SUMMARY, level)

    @app_commands.command(name="newtopic", description=COMMAND_DESCRIPTIONS[ChatCommand.NEWTOPIC])
    async def newtopic(self, interaction: discord.Interaction[Any]) -> None:
        await self.answer_slash(interaction, ChatCommand.NEWTOPIC, "")

    @app_commands.command(name="memory_off", description=COMMAND_DESCRIPTIONS[ChatCommand.MEMORY_OFF])
    async def memory_off(self, interaction: discord.Interaction[Any]) -> None:
        await self.answer_slash(interaction, ChatCommand.MEMORY_OFF, "")

    @app_commands.command(name="memory_on", description=COMMAND_DESCRIPTIONS[ChatCommand.MEMORY_ON])
    async def memory_on(self, interaction: discord.Interaction[Any]) -> None:
        await self.answer_slash(interaction, ChatCommand.MEMORY_ON, "")

    @app_commands.command(name="whatdoyouknow", description=COMMAND_DESCRIPTIONS[ChatCommand.WHATDOYOUKNOW])
    async def whatdoyouknow(self, interaction: discord.Interaction[Any]) -> None:
        await self.answer_slash(interaction, ChatCommand.WHATDOYOUKNOW, "")

    @app_commands.command(name="forget_me", description=COMMAND_DESCRIPTIONS[ChatCommand.FORGET_ME])
    @app_commands.describe(confirm="Type yes: erasure cannot be undone")
    async def forget_me(self, interaction: discord.Interaction[Any], confirm: str = "") -> None:
        await self.answer_slash(interaction, ChatCommand.FORGET_ME, confirm)

    async def answer_slash(self, interaction: discord.Interaction[Any], command: ChatCommand, arg: str) -> None:
        """Publish the command (if it changes memory) and answer it, visible to the caller only."""
        arg = arg.strip()
        origin = interaction_origin(interaction)
        if origin is not None:
            self._note_channel(interaction.channel_id, interaction.guild_id)
            event = memory_command_event(origin, command, arg)
            if event is not None:
                self.publisher.publish_nowait(event)
        thread_id = origin.thread_id if origin else ""
        user_id = user_id_for(interaction.user.id)
        if self.memory is None or command not in READ_COMMANDS:
            text = command_reply(None, command, arg, thread_id=thread_id, user_id=user_id)
            await interaction.response.send_message(clip(text), ephemeral=True)
            return
        await interaction.response.defer(ephemeral=True, thinking=True)
        text = await self._read_reply(command, arg, thread_id=thread_id, user_id=user_id)
        await interaction.followup.send(clip(text), ephemeral=True)

    # --- text commands ------------------------------------------------------------------
    def _text_command(self, message: discord.Message) -> tuple[ChatCommand, str] | None:
        if not self.text_commands or message.author.bot or message.type not in REGULAR_TYPES:
            return None
        return parse_command(message.content, self.bot.user.name if self.bot.user else None)

    async def _answer_text_command(self, message: discord.Message, command: ChatCommand, arg: str) -> None:
        """'/remember …' sent as a plain message (a client without the command menu): the
        command event takes the message's event id, so the message is not stored as text."""
        event = memory_command_event(message_origin(message), command, arg)
        if event is not None:
            self.publisher.publish_nowait(event)
        thread_id, user_id = thread_id_for(message.channel.id), user_id_for(message.author.id)
        if command in PRIVATE_COMMANDS and message_guild_id(message) is not None:
            text = f"Use the /{command.value} slash command: its answer is shown to you only."
        elif self.memory is not None and command in READ_COMMANDS:
            text = await self._read_reply(command, arg, thread_id=thread_id, user_id=user_id)
        else:
            text = command_reply(None, command, arg, thread_id=thread_id, user_id=user_id)
        await message.reply(clip(text), mention_author=False)

    async def _read_reply(self, command: ChatCommand, arg: str, *, thread_id: str, user_id: str) -> str:
        try:
            # The read path is synchronous (Postgres): off the event loop.
            return await asyncio.to_thread(
                command_reply, self.memory, command, arg, thread_id=thread_id, user_id=user_id
            )
        except Exception:
            log.exception("memory read for /%s failed", command.value)
            return "Memory cannot be read right now; please try again later."

    # --- reading memory -----------------------------------------------------------------
    async def context_for(
        self, message: discord.Message, *, query: str | None = None, **kw: Any
    ) -> list[dict[str, Any]]:
        """Chat messages for the bot's LLM call on `message`: the context bundle (summaries,
        facts, recent turns of this channel) followed by the message itself. Without memory,
        or before the channel's first message is ingested, just the message."""
        text = message_text(message)
        turn: dict[str, Any] = {"role": "user", "content": text}
        if self.memory is None:
            return [turn]
        thread_id, user_id = thread_id_for(message.channel.id), user_id_for(message.author.id)
        try:
            bundle = await asyncio.to_thread(self.memory.build_context, thread_id, user_id, query or text or None, **kw)
        except NotReadable:
            return [turn]
        shown = {i.citation.platform_message_id for i in bundle.section("recent_turns").items if i.citation}
        # Ingest may already have the message among the recent turns; it is not said twice.
        return list(bundle.messages) if str(message.id) in shown else [*bundle.messages, turn]

    async def recall_reply(self, message: discord.Message, query: str | None = None, *, limit: int = 5) -> str:
        """What memory holds about `query` (default: the message's text), numbered, with links.
        In a guild channel only that channel is searched, since the answer is public there; in a
        DM, every thread of the user (their DMs included)."""
        if self.memory is None:
            return "Memory is not readable from this bot."
        query = query if query is not None else message_text(message)
        thread_id = thread_id_for(message.channel.id) if message_guild_id(message) is not None else None
        try:
            result = await asyncio.to_thread(
                self.memory.recall, user_id_for(message.author.id), query, limit=limit, thread_id=thread_id
            )
        except NotReadable:  # the user's first words here are not ingested yet
            return render_recall(RecallResult(query=query, scope=Scope.ALL, hits=[]))
        return render_recall(result, self.link, limit=limit)

    # --- links --------------------------------------------------------------------------
    def link(self, citation: Citation) -> str | None:
        """A `Linker` for render_recall."""
        return discord_link(citation, self.guild_of)

    def guild_of(self, channel_id: int) -> str | None:
        known = self._guilds.get(channel_id)
        if known is not None:
            return known
        channel = self.bot.get_channel(channel_id)
        if isinstance(channel, discord.DMChannel | discord.GroupChannel):
            return DM_GUILD
        guild = getattr(channel, "guild", None)
        return str(guild.id) if guild is not None else None

    def _note_channel(self, channel_id: int | None, guild_id: int | None) -> None:
        if channel_id is None:
            return
        self._guilds[channel_id] = str(guild_id) if guild_id is not None else DM_GUILD
        self._guilds.move_to_end(channel_id)
        if len(self._guilds) > self._known_channels:
            self._guilds.popitem(last=False)


async def add_memory(
    bot: commands.Bot,
    publisher: EventPublisher,
    memory: MemoryView | None = None,
    *,
    text_commands: bool = True,
) -> MemoryCog:
    """Add the memory cog (listeners and slash commands) to `bot`. Sync the command tree
    afterwards (`await bot.tree.sync()`) for Discord to show the commands."""
    if not bot.intents.message_content:
        log.warning(
            "the message_content intent is off: Discord sends empty text for guild messages that do not mention the bot"
        )
    cog = MemoryCog(bot, publisher, memory, text_commands=text_commands)
    await bot.add_cog(cog)
    return cog
