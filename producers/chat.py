"""What every chat adapter shares: the memory commands a user can type, the common part of the
events one platform message becomes, and how memory is shown back in a chat. The platform
modules (telegram.py, telegram_ptb.py, telegram_aiogram.py, discord_bot.py) only map their
library's objects onto these."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from pydantic import ValidationError

from chatmem.adapters.errors import where_raised
from chatmem.schemas.events import CommandEvent, CommandName, describe_validation_error
from chatmem.schemas.read import Citation, ContextBundle, KnownAbout, RecallResult, SummaryView


class ChatCommand(StrEnum):
    REMEMBER = "remember"
    FORGET = "forget"
    SUMMARY = "summary"
    NEWTOPIC = "newtopic"
    MEMORY_OFF = "memory_off"
    MEMORY_ON = "memory_on"
    WHATDOYOUKNOW = "whatdoyouknow"
    FORGET_ME = "forget_me"


# Shown by the platforms' command menus (Telegram setMyCommands, Discord slash commands).
COMMAND_DESCRIPTIONS: dict[ChatCommand, str] = {
    ChatCommand.REMEMBER: "Remember something about you: /remember I am vegetarian",
    ChatCommand.FORGET: "Forget what matches: /forget my address",
    ChatCommand.SUMMARY: "Summaries of this chat: /summary [running|episodes|N|all]",
    ChatCommand.NEWTOPIC: "Close the current topic and start a new one",
    ChatCommand.MEMORY_OFF: "Stop building memory from this chat",
    ChatCommand.MEMORY_ON: "Build memory from this chat again",
    ChatCommand.WHATDOYOUKNOW: "What I remember about you",
    ChatCommand.FORGET_ME: "Erase everything I hold about you, for good: /forget_me yes",
}
# Erasure cannot be undone: it is published only when confirmed in the same message.
FORGET_ME_CONFIRM = "yes"

# Commands that change memory travel as command events through the log (so replay sees them);
# /whatdoyouknow only reads and is answered from the read path.
_EVENT_COMMANDS: dict[ChatCommand, CommandName] = {
    ChatCommand.REMEMBER: CommandName.REMEMBER,
    ChatCommand.FORGET: CommandName.FORGET,
    ChatCommand.SUMMARY: CommandName.SUMMARIZE_NOW,
    ChatCommand.NEWTOPIC: CommandName.CLOSE_EPISODE,
    ChatCommand.MEMORY_OFF: CommandName.MEMORY_OFF,
    ChatCommand.MEMORY_ON: CommandName.MEMORY_ON,
    ChatCommand.FORGET_ME: CommandName.FORGET_ME,
}

_COMMAND_RE = re.compile(r"^/(?P<name>[A-Za-z_]+)(?:@(?P<bot>[A-Za-z0-9_]+))?(?:\s+(?P<arg>.*))?$", re.DOTALL)


def parse_command(text: str | None, bot_username: str | None = None) -> tuple[ChatCommand, str] | None:
    """('remember', 'I am vegetarian') for '/remember@my_bot I am vegetarian'; None for text
    that is not one of our commands, or a command addressed to another bot."""
    match = _COMMAND_RE.match((text or "").strip())
    if match is None:
        return None
    if match["bot"] and bot_username and match["bot"].lower() != bot_username.lower():
        return None
    try:
        command = ChatCommand(match["name"].lower())
    except ValueError:
        return None
    return command, (match["arg"] or "").strip()


def without_nul(text: str) -> str:
    """A platform's text as memory keeps it. The events refuse NUL, since Postgres text cannot
    hold it; a platform that lets one through must not cost the user the whole message."""
    return text.replace("\x00", "")


def mapping_failure(error: Exception) -> str:
    """Why a platform message could not become an event, for a log line. Never the error's own
    text: a ValidationError quotes the user's words."""
    if isinstance(error, ValidationError):
        return describe_validation_error(error)
    return where_raised(error)


@dataclass(frozen=True)
class Origin:
    """The fields every event made from one platform message shares."""

    event_id: str
    thread_id: str
    user_id: str
    platform: str
    occurred_at: datetime
    platform_message_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def command_event(origin: Origin, command: ChatCommand, arg: str) -> CommandEvent | None:
    """The command event for a memory-changing command; None for a read-only one."""
    name = _EVENT_COMMANDS.get(command)
    if name is None or (command is ChatCommand.FORGET_ME and arg.lower() != FORGET_ME_CONFIRM):
        return None
    args: dict[str, Any] = {}
    arg = without_nul(arg)
    if command in (ChatCommand.REMEMBER, ChatCommand.FORGET):
        args["text"] = arg
    elif command is ChatCommand.SUMMARY and arg:
        args["level"] = arg
    return CommandEvent(
        event_id=origin.event_id,
        thread_id=origin.thread_id,
        user_id=origin.user_id,
        platform=origin.platform,
        occurred_at=origin.occurred_at,
        command=name,
        args=args,
        metadata={
            **origin.metadata,
            **({"platform_message_id": origin.platform_message_id} if origin.platform_message_id else {}),
        },
    )


class MemoryView(Protocol):
    """What adapters read; `chatmem.bootstrap.open_memory()` returns one, and so does an HTTP
    client wrapper."""

    @property
    def recall(self) -> Callable[..., RecallResult]: ...

    def build_context(self, thread_id: str, user_id: str, query: str | None = None, **kw: Any) -> ContextBundle: ...

    def what_do_you_know(self, user_id: str) -> KnownAbout: ...

    def summaries(self, thread_id: str) -> list[SummaryView]: ...


# Turns a citation into a link to the original message, or None where the platform has none.
Linker = Callable[[Citation], str | None]


def no_links(_: Citation) -> str | None:
    return None


def render_known(known: KnownAbout) -> str:
    if not known.facts and not known.episodes:
        return "I don't remember anything about you yet."
    lines: list[str] = []
    if known.facts:
        lines.append("What I know about you:")
        lines += [f"• {f.key.replace('_', ' ')}: {f.value}" for f in known.facts]
    if known.episodes:
        lines.append("Recent conversations:")
        for ep in known.episodes:
            when = ep.started_at.strftime("%Y-%m-%d") if ep.started_at else "?"
            lines.append(f"• {when} — {ep.title or '(not summarized yet)'}")
    return "\n".join(lines)


def render_summaries(views: Sequence[SummaryView], level: str = "") -> str:
    """`level`: '' or 'running' (the open episode's running summary and the latest final),
    'episodes' (final summaries), a number (that roll-up level), 'all'."""
    level = level.strip().lower()
    if level == "all":
        chosen = list(views)
    elif level == "episodes":
        chosen = [v for v in views if v.kind == "final"]
    elif level.isdigit():
        chosen = [v for v in views if v.level == int(level)]
    else:
        running = [v for v in views if v.kind == "running"][:1]
        chosen = running + [v for v in views if v.kind in ("final", "rollup")][:1]
    if not chosen:
        return "No summaries yet."
    return "\n\n".join(f"[{_summary_label(v)}] {v.text}" for v in chosen)


def _summary_label(view: SummaryView) -> str:
    if view.kind == "rollup":
        return f"level {view.level} roll-up, messages {view.from_seq}–{view.upto_seq}"
    return f"{view.kind}, messages {view.from_seq}–{view.upto_seq}"


def render_recall(result: RecallResult, link: Linker = no_links, limit: int = 5) -> str:
    """Numbered hits, each with where it came from; a link when the platform has one."""
    if not result.hits:
        return "I found nothing about that in memory."
    lines = []
    for n, hit in enumerate(result.hits[:limit], start=1):
        c = hit.citation
        where = link(c) or _plain_source(c)
        who = f"{hit.author}: " if hit.author and hit.kind == "message" else ""
        lines.append(f"{n}. {who}{hit.snippet}\n   ↳ {where}")
    return "\n".join(lines)


def _plain_source(c: Citation) -> str:
    when = f" of {c.occurred_at:%Y-%m-%d}" if c.occurred_at else ""
    if c.source == "message" and c.platform_message_id:
        return f"message {c.platform_message_id}{when}"
    if c.source == "summary":
        return f"summary of messages {c.seq}–{c.upto_seq}"
    return c.source + when


def command_reply(memory: MemoryView | None, command: ChatCommand, arg: str, *, thread_id: str, user_id: str) -> str:
    """The text a bot answers a memory command with."""
    if command is ChatCommand.WHATDOYOUKNOW:
        return render_known(memory.what_do_you_know(user_id)) if memory else "Memory is not readable from this bot."
    if command is ChatCommand.SUMMARY:
        return render_summaries(memory.summaries(thread_id), arg) if memory else "Summary requested."
    if command is ChatCommand.REMEMBER:
        return f"Noted: {arg}" if arg else "Usage: /remember <something about you>"
    if command is ChatCommand.FORGET:
        return f"I'll forget what matches: {arg}" if arg else "Usage: /forget <what to forget>"
    if command is ChatCommand.FORGET_ME:
        if arg.lower() != FORGET_ME_CONFIRM:
            return (
                "This erases everything I hold about you, in every chat, for good. "
                f"To confirm, send /forget_me {FORGET_ME_CONFIRM}"
            )
        return "Erasing everything I hold about you. This cannot be undone."
    if command is ChatCommand.NEWTOPIC:
        return "OK, new topic."
    if command is ChatCommand.MEMORY_OFF:
        return "Memory is off for this chat: I'll keep the log but build nothing from it until /memory_on."
    return "Memory is on for this chat."
