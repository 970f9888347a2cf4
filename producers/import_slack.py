"""Slack workspace exports (the unzipped folder: channels.json, users.json, a folder of day files
per conversation) as message events: one thread per conversation. Rules: docs/importing.md."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from chatmem.producers.importers import (
    DELETED,
    EMPTY,
    SERVICE,
    AttachmentSkipped,
    Failed,
    ImportFormatError,
    ImportItem,
    JsonFile,
    Skipped,
    dict_at,
    json_events,
    list_at,
    message_events,
    safe_id,
    str_at,
    top_level,
    unpack_beside,
    utc_from_unix,
)
from chatmem.schemas.events import DEFAULT_MAX_TEXT_CHARS, Role

PLATFORM = "slack"
WHAT = "a Slack export"
FILE_NOT_FETCHED = "Slack file: behind the workspace's sign-in, not fetched"
# Subtypes that carry what someone wrote; every other one is Slack's own notice (joins, topics,
# pins) or a message that is gone.
PERSON_SUBTYPES = frozenset({"", "thread_broadcast", "bot_message", "me_message", "file_share", "slackbot_response"})
GONE_SUBTYPES = frozenset({"tombstone", "message_deleted"})
_DAY_FILE = re.compile(r"^\d{4}-\d{2}-\d{2}\.json$")
# <@U123>, <@U123|name>, <#C123|general>, <!here>, <!subteam^S1|@team>, <https://x|label>, <mailto:a@b>
_MARKUP = re.compile(r"<([^<>|\n]*)(?:\|([^<>\n]*))?>")
# Public and private channels and group DMs have a folder by name; a DM's folder is its id.
_NAMED_LISTS = ("channels.json", "groups.json", "mpims.json")
_LIST_FILES = frozenset({"channels.json", "users.json", "org_users.json", "dms.json"})


@dataclass(frozen=True)
class SlackOptions:
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    keep_service: bool = False  # Slack's notices as role=system events instead of skipping them
    assistant_ids: frozenset[str] = frozenset()  # user or bot ids whose messages are the bot's own


@dataclass
class SlackWorkspace:
    """What the export's lists say: each conversation folder's id, and people's and channels' names."""

    folders: dict[str, str] = field(default_factory=dict)  # folder name -> conversation id
    users: dict[str, str] = field(default_factory=dict)  # user id -> the name Slack shows
    channels: dict[str, str] = field(default_factory=dict)  # channel id -> name


def find_slack_export(path: Path) -> Path:
    """The export's folder: the path itself, or the folder its .zip unpacks to, beside it."""
    if path.suffix.lower() == ".zip" and path.is_file():
        return unpack_beside(
            path,
            holds=lambda names: bool(top_level(names) & _LIST_FILES),
            what="no channels.json or users.json at its top (Slack: workspace settings, Import/Export data)",
            unpacked=lambda folder: any((folder / name).is_file() for name in _LIST_FILES),
        )
    return path


def read_workspace(root: Path) -> SlackWorkspace:
    """The lists at the top of an unzipped export. ImportFormatError when it is not one."""
    if not root.is_dir():
        raise ImportFormatError(f"not {WHAT}: {root.name} is not the export's folder or its .zip")
    names = {p.name for p in root.iterdir()}
    if not names & _LIST_FILES:
        raise ImportFormatError(f"not {WHAT}: no channels.json or users.json in {root}")
    workspace = SlackWorkspace()
    for file in _NAMED_LISTS:
        for conversation in _list_file(root / file):
            conv_id, folder = conversation.get("id"), conversation.get("name")
            if isinstance(conv_id, str) and isinstance(folder, str) and conv_id and folder:
                workspace.folders[folder] = conv_id
                workspace.channels[conv_id] = folder
    for conversation in _list_file(root / "dms.json"):
        if isinstance(conversation.get("id"), str) and conversation["id"]:
            workspace.folders[conversation["id"]] = conversation["id"]
    for user in _list_file(root / "users.json") + _list_file(root / "org_users.json"):
        if isinstance(user.get("id"), str):
            profile = dict_at(user, "profile")
            candidates = (
                profile.get("display_name"),
                profile.get("real_name"),
                user.get("real_name"),
                user.get("name"),
            )
            name = next((n for n in candidates if isinstance(n, str) and n), None)
            if name:
                workspace.users[user["id"]] = name
    return workspace


def _list_file(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_bytes())
    except ValueError as error:
        raise ImportFormatError(f"{path.name}: not valid JSON ({error})") from None
    except RecursionError:
        raise ImportFormatError(f"{path.name}: not valid JSON (nested too deeply)") from None
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []


def find_slack_exports(root: Path) -> list[Path]:
    """Every conversation's day files (`general/2024-03-01.json`), conversation by conversation,
    each in date order. A folder of day files that no list names is read too, its name as its id."""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    files = [day for folder in folders for day in sorted(folder.iterdir()) if _DAY_FILE.match(day.name)]
    if not files:
        raise ImportFormatError(f"not {WHAT}: no conversation folder of day files (2024-03-01.json) in {root}")
    return files


def slack_items(
    fh: JsonFile, base_dir: Path, workspace: SlackWorkspace, options: SlackOptions | None = None
) -> Iterator[ImportItem]:
    """Events (and skip / failure records) for one day file of one conversation, in file order."""
    options = options or SlackOptions()
    first, _ = next(json_events(fh), ("", None))
    if first != "start_array":
        raise ImportFormatError(f"not {WHAT}: a day file holds a list of messages")
    fh.seek(0)
    conversation = _Conversation(workspace.folders.get(base_dir.name, base_dir.name), workspace, options)
    for message in ijson.items(fh, "item", use_float=True):
        yield from conversation.items(message)


def render_markup(text: str, workspace: SlackWorkspace) -> str:
    """Slack's markup as people read it: mentions and channels by name, a link by its label (the
    address when it has none), and the three characters Slack escapes unescaped."""

    def shown(match: re.Match[str]) -> str:
        target, label = match[1], match[2]
        if target.startswith("@"):
            return "@" + (label or workspace.users.get(target[1:]) or target[1:])
        if target.startswith("#"):
            return "#" + (label or workspace.channels.get(target[1:]) or target[1:])
        if target.startswith("!"):  # <!here>, <!subteam^S1|@team>, <!date^…|fallback>
            if label:
                return label
            return "@" + target[1:].split("^")[0]
        return label or target.removeprefix("mailto:")

    return _MARKUP.sub(shown, text).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


class _Conversation:
    def __init__(self, conv_id: str, workspace: SlackWorkspace, options: SlackOptions):
        self.conv_id = conv_id
        self.thread_id = safe_id(f"slack:{conv_id}")
        self.workspace = workspace
        self.options = options

    def items(self, message: object) -> Iterator[ImportItem]:
        if not isinstance(message, dict):
            yield Failed(f"conversation {self.conv_id}: an item of a day file", "not a JSON object")
            return
        ts = message.get("ts")
        ref = f"message {ts} in conversation {self.conv_id}"
        occurred_at = utc_from_unix(ts) if isinstance(ts, str) else None
        if occurred_at is None:
            yield Failed(ref, "no ts (the message's id and time)")
            return
        subtype = str_at(message, "subtype") or ""
        if subtype in GONE_SUBTYPES:
            yield Skipped(ref, DELETED)
            return
        service = subtype not in PERSON_SUBTYPES
        if service and not self.options.keep_service:
            yield Skipped(ref, SERVICE)
            return
        author = str_at(message, "user") or str_at(message, "bot_id") or ""
        metadata: dict[str, Any] = {}
        name = self.workspace.users.get(author) or _profile_name(message)
        if name:
            metadata["author_name"] = name
        if message.get("bot_id") or subtype == "bot_message":
            metadata["is_bot"] = True
        edited_at = utc_from_unix(dict_at(message, "edited").get("ts"))
        if edited_at:
            metadata["edited_at"] = edited_at.isoformat()
        thread_ts = str_at(message, "thread_ts")
        text = render_markup(str_at(message, "text") or "", self.workspace)
        if service:
            metadata["service_type"] = subtype
            role = Role.SYSTEM
        else:
            if not text.strip():
                text = render_markup(_substitute_text(message), self.workspace)
            ids = {str_at(message, "user"), str_at(message, "bot_id")} - {None}
            role = Role.ASSISTANT if ids & self.options.assistant_ids else Role.USER
            for file in list_at(message, "files"):
                if isinstance(file, dict):
                    # The export's file links carry a token of the workspace (?t=xoxe-…): a secret,
                    # never copied. The file's name and type are kept.
                    metadata.setdefault("attachments_not_included", []).append(
                        {k: file[k] for k in ("name", "mimetype") if isinstance(file.get(k), str)}
                        | {"reason": FILE_NOT_FETCHED}
                    )
                    yield AttachmentSkipped(ref, FILE_NOT_FETCHED)
            if not text.strip():
                yield Skipped(ref, EMPTY)
                return
        yield from message_events(
            {
                "event_id": safe_id(f"slack:{self.conv_id}:{ts}"),
                "thread_id": self.thread_id,
                "user_id": safe_id(f"slack:{author or self.conv_id}"),
                "platform": PLATFORM,
                "role": role,
                "text": text,
                "occurred_at": occurred_at,
                "platform_message_id": ts,
                "reply_to": thread_ts if thread_ts and thread_ts != ts else None,
                "metadata": metadata,
            },
            ref=ref,
            max_text_chars=self.options.max_text_chars,
        )


def _profile_name(message: dict[str, Any]) -> str | None:
    profile = dict_at(message, "user_profile")
    for name in (profile.get("display_name"), profile.get("real_name"), message.get("username")):
        if isinstance(name, str) and name:
            return name
    return None


def _substitute_text(message: dict[str, Any]) -> str:
    """What stands for an empty `text`: the legacy attachments' words (bots often post only those)."""
    lines = []
    for item in list_at(message, "attachments"):
        if isinstance(item, dict):
            words = [item[k] for k in ("pretext", "title", "text") if isinstance(item.get(k), str) and item[k]]
            lines += words or ([item["fallback"]] if isinstance(item.get("fallback"), str) and item["fallback"] else [])
    return "\n".join(lines)
