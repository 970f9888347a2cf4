"""Discord ids as chatmem writes them, for the live adapter (discord_bot.py) and the importer of
DiscordChatExporter files alike, so history and the live bot meet in one thread. No discord.py
import here: importing an export must not need the bot library."""

from __future__ import annotations

PLATFORM = "discord"


def thread_id_for(channel_id: int | str) -> str:
    """One thread per channel, DM or Discord thread (a thread has a channel id of its own)."""
    return f"{PLATFORM}:{channel_id}"


def user_id_for(user_id: int | str) -> str:
    return f"{PLATFORM}:{user_id}"


def message_event_id(message_id: int | str) -> str:
    """Snowflakes are unique across Discord, so a redelivered message maps to the same event."""
    return f"{PLATFORM}:{message_id}"
