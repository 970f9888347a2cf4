"""Facebook Messenger and Instagram chats from Meta's "Download your information" export (JSON) as
message events: one thread per conversation. Rules: docs/importing.md."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatmem.producers.importers import (
    DELETED,
    EMPTY,
    FILE_MISSING,
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
    list_at,
    local_file_url,
    make_attachment,
    message_events,
    name_id,
    safe_id,
    str_at,
    top_level,
    unpack_beside,
    utc_from_unix,
)
from chatmem.schemas.events import DEFAULT_MAX_TEXT_CHARS, Attachment, AttachmentKind, Role

WHAT = {"messenger": "a Facebook Messenger export", "instagram": "an Instagram export"}
# messages/<section>/<conversation>/message_<n>.json; the sections are inbox, archived_threads,
# filtered_threads, message_requests, e2ee_cutover …
_MESSAGE_FILE = re.compile(r"(?:^|/)messages/[^/]+/[^/]+/message_(\d+)\.json$")
_MEDIA_KEYS = (
    ("photos", AttachmentKind.IMAGE),
    ("videos", AttachmentKind.VIDEO),
    ("gifs", None),
    ("audio_files", AttachmentKind.AUDIO),
    ("files", None),
    ("media", None),  # the encrypted chats export's, of every kind
)
# Older exports name a message's type; the encrypted chats' "placeholder" is Messenger's own line.
_SERVICE_TYPES = frozenset({"Call", "Subscribe", "Unsubscribe", "Placeholder"})


@dataclass(frozen=True)
class MetaOptions:
    platform: str = "messenger"  # or "instagram": the ids' prefix
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    keep_service: bool = False  # calls, joins and leaves as role=system events instead of skipping them
    assistant_names: frozenset[str] = frozenset()  # senders whose messages are the bot's own


def find_meta_exports(path: Path, platform: str) -> list[Path]:
    """Every conversation's message files under `path` (the export's folder, its .zip, a
    `messages` folder or one conversation's), conversation by conversation, oldest file first
    (message_1.json holds the newest messages)."""
    if path.suffix.lower() == ".zip" and path.is_file():
        path = unpack_beside(
            path,
            holds=lambda names: (
                any(_MESSAGE_FILE.search(n.replace("\\", "/")) for n in names)
                or any(n.lower().endswith(".json") for n in top_level(names))
            ),
            what="no messages/…/message_1.json (Meta: Accounts Center, Download your information, JSON)",
            unpacked=lambda folder: (
                any(_is_message_file(p) for p in folder.rglob("message_*.json"))
                or any(map(_is_encrypted_chats_file, folder.glob("*.json")))
            ),
        )
    if path.is_file():
        return [path]
    files = [p for p in path.rglob("message_*.json") if _is_message_file(p)]
    if not files:
        # Messenger's end-to-end encrypted chats export apart: one <thread>.json a conversation.
        encrypted = sorted(p for p in path.glob("*.json") if _is_encrypted_chats_file(p))
        if encrypted:
            return encrypted
        raise ImportFormatError(
            f"not {WHAT[platform]}: no messages/…/message_1.json, nor a chat file of the end-to-end"
            f" encrypted chats, in {path} (the JSON format)"
        )
    by_conversation: dict[Path, list[Path]] = defaultdict(list)
    for file in files:
        by_conversation[file.parent].append(file)
    number = lambda p: int(p.stem.split("_")[1])  # noqa: E731
    return [f for folder in sorted(by_conversation) for f in sorted(by_conversation[folder], key=number, reverse=True)]


def _is_message_file(path: Path) -> bool:
    return path.is_file() and _MESSAGE_FILE.search(path.as_posix()) is not None


def _is_encrypted_chats_file(path: Path) -> bool:
    """A conversation of Messenger's end-to-end encrypted chats export: camelCase fields."""
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    return b'"threadName"' in head or b'"senderName"' in head


def fixed_text(value: str) -> str:
    """Meta writes each UTF-8 byte of a text as its own character ("caf\\u00c3\\u00a9" for
    "café"): the bytes read back as UTF-8. A text that is not so written (a character above
    U+00FF, or bytes that are not UTF-8) is kept as it is."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _fixed(value: Any) -> Any:
    if isinstance(value, str):
        return fixed_text(value)
    if isinstance(value, list):
        return [_fixed(v) for v in value]
    if isinstance(value, dict):
        return {fixed_text(k): _fixed(v) for k, v in value.items()}
    return value


def meta_items(fh: JsonFile, base_dir: Path, options: MetaOptions) -> Iterator[ImportItem]:
    """Events (and skip / failure records) of one message file, oldest message first. A file
    holds at most some thousands of messages and is read whole."""
    what = WHAT[options.platform]
    try:
        doc = json.loads(fh.read())
        if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
            raise ImportFormatError(f"not {what}: no 'messages' list")
        doc = _fixed(doc)
    except RecursionError:
        raise ImportFormatError("not valid JSON (nested too deeply)") from None
    except ValueError as error:  # the caller names the file (ImportFormatError is one too)
        if isinstance(error, ImportFormatError):
            raise
        raise ImportFormatError(f"not valid JSON ({error})") from None
    if "threadName" in doc or any(isinstance(m, dict) and "senderName" in m for m in doc["messages"][:50]):
        doc = _from_encrypted_chats(doc)
    conversation = _Conversation(doc, base_dir, options)
    timed = [(m.get("timestamp_ms"), i, m) for i, m in enumerate(doc["messages"]) if isinstance(m, dict)]
    for index, message in enumerate(doc["messages"]):
        if not isinstance(message, dict):
            yield Failed(f"item {index + 1} of {conversation.name}", "not a JSON object")
    # Meta lists the newest first; by time (then as listed, reversed) the conversation reads forward.
    timed.sort(key=lambda t: (t[0] if isinstance(t[0], int | float) and not isinstance(t[0], bool) else 0, -t[1]))
    for _, _, message in timed:
        yield from conversation.items(message)


def _from_encrypted_chats(doc: dict[str, Any]) -> dict[str, Any]:
    """Messenger's end-to-end encrypted chats export in the main export's fields: senderName,
    timestamp (milliseconds), text, isUnsent, media with paths beside the file ("./media/…"), and
    a type, of which "placeholder" marks Messenger's own lines."""
    messages = []
    for message in doc["messages"]:
        if not isinstance(message, dict):
            messages.append(message)
            continue
        messages.append(
            {
                "sender_name": message.get("senderName"),
                "timestamp_ms": message.get("timestamp"),
                "content": message.get("text"),
                "is_unsent": message.get("isUnsent"),
                "media": message.get("media"),
                **({"type": "Placeholder"} if message.get("type") == "placeholder" else {}),
            }
        )
    return {"thread_path": doc.get("threadName"), "title": doc.get("threadName"), "messages": messages}


class _Conversation:
    def __init__(self, doc: dict[str, Any], base_dir: Path, options: MetaOptions):
        self.options = options
        thread_path = str_at(doc, "thread_path") or base_dir.name
        self.name = thread_path.rstrip("/").rsplit("/", 1)[-1] or base_dir.name
        self.thread_id = safe_id(f"{options.platform}:{self.name}")
        self.title = str_at(doc, "title")
        # uri values are relative to the export's top: the folder above messages/ (older exports)
        # or above your_facebook_activity/ (newer ones), both tried.
        messages_dir = base_dir.parent.parent
        self.roots = [messages_dir.parent, messages_dir.parent.parent, base_dir]  # the last: "./media/…"
        self.seen = Counter[str]()

    def items(self, message: dict[str, Any]) -> Iterator[ImportItem]:
        stamp = message.get("timestamp_ms")
        occurred_at = utc_from_unix(stamp / 1000) if isinstance(stamp, int) and not isinstance(stamp, bool) else None
        sender = str_at(message, "sender_name")
        ref = f"message at {stamp} in {self.name}"
        if occurred_at is None:
            yield Failed(ref, "no timestamp_ms")
            return
        if message.get("is_unsent"):
            yield Skipped(ref, DELETED)
            return
        content = str_at(message, "content") or ""
        # The id: the conversation, the time to the millisecond, the sender and the words, and
        # which occurrence of those this is, so a later export gives the same ids.
        key = f"{stamp}\x1f{sender or ''}\x1f{content}"
        self.seen[key] += 1
        digest = hashlib.sha256(f"{key}\x1f{self.seen[key]}".encode()).hexdigest()[:20]
        fields: dict[str, Any] = {
            "event_id": safe_id(f"{self.options.platform}:{self.name}:{digest}"),
            "thread_id": self.thread_id,
            "user_id": safe_id(f"{self.options.platform}:{name_id(sender) if sender else self.name}"),
            "platform": self.options.platform,
            "occurred_at": occurred_at,
            "platform_message_id": digest,
        }
        metadata: dict[str, Any] = {}
        if sender:
            metadata["author_name"] = sender
        if self.title:
            metadata["conversation_title"] = self.title
        if str_at(message, "type") in _SERVICE_TYPES or "call_duration" in message:
            if not self.options.keep_service:
                yield Skipped(ref, SERVICE)
                return
            metadata["service_type"] = str_at(message, "type") or "Call"
            yield from message_events(
                {
                    **fields,
                    "role": Role.SYSTEM,
                    "text": content or f"{sender or 'someone'} called",
                    "metadata": metadata,
                },
                ref=ref,
                max_text_chars=self.options.max_text_chars,
            )
            return
        share = dict_at(message, "share")
        text = content or str_at(share, "share_text") or str_at(share, "link") or ""
        attachments: list[Attachment] = []
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
                **fields,
                "role": Role.ASSISTANT if sender in self.options.assistant_names else Role.USER,
                "text": text,
                "attachments": attachments,
                "metadata": metadata,
            },
            ref=ref,
            max_text_chars=self.options.max_text_chars,
        )

    def _attachments(self, message: dict[str, Any], ref: str) -> Iterator[Attachment | AttachmentSkipped]:
        count = 0
        for key, kind in _MEDIA_KEYS:
            for media in list_at(message, key):
                uri = str_at(media, "uri") if isinstance(media, dict) else None
                if not uri:
                    continue
                url, reason = None, FILE_MISSING
                for root in self.roots:
                    url, reason = local_file_url(root, uri, inside_only=True)
                    if url is not None:
                        break
                if url is None:
                    yield AttachmentSkipped(ref, reason)
                    continue
                count += 1
                if count > MAX_ATTACHMENTS:
                    yield AttachmentSkipped(ref, TOO_MANY)
                    continue
                name = Path(uri).name
                yield make_attachment(ref, url=url, kind=kind or attachment_kind(None, name), filename=name)
