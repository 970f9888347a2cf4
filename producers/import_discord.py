"""DiscordChatExporter JSON exports (one channel per file) as message events. Rules:
docs/importing.md."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ijson

from chatmem.producers.discord_ids import message_event_id, thread_id_for, user_id_for
from chatmem.producers.importers import (
    EMPTY,
    HTTP_URL,
    MAX_ATTACHMENTS,
    SERVICE,
    TOO_MANY,
    AttachmentSkipped,
    Failed,
    ImportFormatError,
    ImportItem,
    JsonFile,
    Skipped,
    attachment_kind,
    dict_at,
    json_top_level,
    list_at,
    local_file_url,
    make_attachment,
    message_events,
    safe_id,
    str_at,
    utc_from_iso,
)
from chatmem.schemas.events import DEFAULT_MAX_TEXT_CHARS, Attachment, Role

PLATFORM = "discord"
WHAT = "a DiscordChatExporter JSON export"
# Message types that carry what a person (or bot) wrote; every other type is a service message.
REGULAR_TYPES = frozenset({"Default", "Reply", "ChatInputCommand", "ContextMenuCommand"})


@dataclass(frozen=True)
class DiscordOptions:
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    keep_service: bool = False  # service messages as role=system events instead of skipping them
    assistant_ids: frozenset[str] = frozenset()  # author ids whose messages are the bot's own


def find_discord_exports(path: Path) -> list[Path]:
    """The file itself, or every .json file directly in a folder (one per exported channel)."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.glob("*.json") if p.is_file())
    if not files:
        raise ImportFormatError(f"no .json files in {path} (DiscordChatExporter: --format Json)")
    return files


def discord_items(fh: JsonFile, base_dir: Path, options: DiscordOptions | None = None) -> Iterator[ImportItem]:
    """Events (and skip / failure records) for every message of one channel, in file order."""
    options = options or DiscordOptions()
    header, seen = json_top_level(fh, what=WHAT, wanted={"channel"}, stream_key="messages")
    if "messages" not in seen:
        raise ImportFormatError(f"not {WHAT}: no 'messages' key")
    channel = header.get("channel")
    if not isinstance(channel, dict) or not channel.get("id"):
        raise ImportFormatError(f"not {WHAT}: no 'channel.id'")
    chan = _Channel(str(channel["id"]), base_dir, options)
    for message in ijson.items(fh, "messages.item", use_float=True):
        yield from chan.items(message)


class _Channel:
    def __init__(self, channel_id: str, base_dir: Path, options: DiscordOptions):
        self.channel_id = channel_id
        self.thread_id = safe_id(thread_id_for(channel_id))
        self.base_dir = base_dir
        self.options = options

    def items(self, message: object) -> Iterator[ImportItem]:
        if not isinstance(message, dict):
            yield Failed(f"channel {self.channel_id}: an item of 'messages'", "not a JSON object")
            return
        msg_id = message.get("id")
        ref = f"message {msg_id} in channel {self.channel_id}"
        if not isinstance(msg_id, str | int) or isinstance(msg_id, bool) or msg_id == "":
            yield Failed(ref, "no message id")
            return
        kind = str(message.get("type") or "Default")
        service = kind not in REGULAR_TYPES
        if service and not self.options.keep_service:
            yield Skipped(ref, SERVICE)
            return
        try:
            occurred_at = utc_from_iso(message.get("timestamp"))
        except ValueError as error:
            yield Failed(ref, f"timestamp: {error}")
            return

        author = dict_at(message, "author")
        author_id = str(author.get("id") or "")
        metadata: dict[str, Any] = {}
        name = author.get("nickname") or author.get("name")
        if name:
            metadata["author_name"] = name
        if author.get("isBot"):
            metadata["is_bot"] = True
        if message.get("timestampEdited"):
            try:
                metadata["edited_at"] = utc_from_iso(message["timestampEdited"]).isoformat()
            except ValueError:
                metadata["edited_at"] = str(message["timestampEdited"])
        if message.get("isPinned"):
            metadata["pinned"] = True
        reference = dict_at(message, "reference")
        reply_to = reference.get("messageId")
        if reference.get("channelId") and str(reference["channelId"]) != self.channel_id:
            # An answer to a message in another channel: not a platform id of this thread.
            metadata["reply_to_channel"] = str(reference["channelId"])
            metadata["reply_to_message"] = str(reply_to)
            reply_to = None

        content = str_at(message, "content") or ""
        if service:
            metadata["service_type"] = kind
            text, role = _service_text(kind, name or "someone", content), Role.SYSTEM
            attachments: list[Attachment] = []
        else:
            text = content if content.strip() else _substitute_text(message)
            role = Role.ASSISTANT if author_id and author_id in self.options.assistant_ids else Role.USER
            attachments = []
            for item in self._attachments(message, ref):
                if isinstance(item, AttachmentSkipped):
                    yield item
                else:
                    attachments.append(item)
            if not text.strip() and not attachments:
                yield Skipped(ref, EMPTY)
                return

        yield from message_events(
            {
                "event_id": safe_id(message_event_id(msg_id)),
                "thread_id": self.thread_id,
                "user_id": safe_id(user_id_for(author_id or "unknown")),
                "platform": PLATFORM,
                "role": role,
                "text": text,
                "occurred_at": occurred_at,
                "platform_message_id": str(msg_id),
                "reply_to": str(reply_to) if reply_to else None,
                "attachments": attachments,
                "metadata": metadata,
            },
            ref=ref,
            max_text_chars=self.options.max_text_chars,
        )

    def _attachments(self, message: dict[str, Any], ref: str) -> Iterator[Attachment | AttachmentSkipped]:
        count = 0
        for item in list_at(message, "attachments"):
            if not isinstance(item, dict) or not isinstance(item.get("url"), str) or not item["url"]:
                continue
            reference: str = item["url"]
            filename = str_at(item, "fileName")
            if reference.startswith("https://"):
                url: str | None = reference
            elif reference.startswith("http://"):
                yield AttachmentSkipped(ref, HTTP_URL)
                continue
            else:
                # Exported with --media: a path relative to the JSON file (or wherever
                # --media-dir put it, hence no inside-the-folder rule here).
                url, reason = local_file_url(self.base_dir, reference, inside_only=False)
                if url is None:
                    yield AttachmentSkipped(ref, reason)
                    continue
            count += 1
            if count > MAX_ATTACHMENTS:
                yield AttachmentSkipped(ref, TOO_MANY)
                continue
            size = item.get("fileSizeBytes")
            yield make_attachment(
                ref,
                url=url,
                kind=attachment_kind(None, filename or reference),
                filename=filename,
                size_bytes=size if isinstance(size, int) and size >= 0 else None,
            )


def _substitute_text(message: dict[str, Any]) -> str:
    """What stands for an empty `content`: the embeds' titles and descriptions (bots often post
    only embeds), else the stickers' names."""
    lines = []
    for embed in list_at(message, "embeds"):
        if isinstance(embed, dict):
            lines += [str(embed[k]) for k in ("title", "description") if isinstance(embed.get(k), str) and embed[k]]
    if lines:
        return "\n".join(lines)
    names = [str(s["name"]) for s in list_at(message, "stickers") if isinstance(s, dict) and s.get("name")]
    return " ".join(f"[sticker: {n}]" for n in names)


def _service_text(kind: str, author: str, content: str) -> str:
    texts = {
        "ChannelPinnedMessage": f"{author} pinned a message",
        "ThreadCreated": f"{author} started a thread: {content}",
        "GuildMemberJoin": f"{author} joined the server",
        "Call": f"{author} started a call",
        "RecipientAdd": f"{author} added someone to the group",
        "RecipientRemove": f"{author} removed someone from the group",
        "ChannelNameChange": f"{author} changed the channel name: {content}",
        "ChannelIconChange": f"{author} changed the channel icon",
    }
    return texts.get(kind, f"{author}: {kind}" + (f": {content}" if content else ""))
