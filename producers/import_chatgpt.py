"""ChatGPT data exports (conversations.json) as message events: one thread per conversation,
the branch that was on screen (current_node up to the root). Rules: docs/importing.md."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeGuard

import ijson

from chatmem.producers.importers import (
    EMPTY,
    Failed,
    ImportFormatError,
    ImportItem,
    JsonFile,
    Skipped,
    dict_at,
    json_events,
    message_events,
    safe_id,
    str_at,
    utc_from_unix,
)
from chatmem.schemas.events import DEFAULT_MAX_TEXT_CHARS, Role

PLATFORM = "chatgpt"
WHAT = "a ChatGPT export"
OTHER_BRANCH = "not on the conversation's current branch"
HIDDEN = "hidden message"
TOOL_CALL = "tool call"
_TEXT_CONTENT = frozenset({"text", "multimodal_text"})


@dataclass(frozen=True)
class ChatGPTOptions:
    user_id: str = "me"  # the account's owner: user_id of every event, whatever the role
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS


def find_chatgpt_export(path: Path) -> Path:
    """conversations.json in an unpacked export folder (or the file itself)."""
    if not path.is_dir():
        return path
    if not (path / "conversations.json").is_file():
        raise ImportFormatError(f"no conversations.json in {path} (ChatGPT: Settings, Data controls, Export data)")
    return path / "conversations.json"


def chatgpt_items(fh: JsonFile, base_dir: Path, options: ChatGPTOptions | None = None) -> Iterator[ImportItem]:
    """Events (and skip / failure records) conversation by conversation, one conversation in
    memory at a time."""
    options = options or ChatGPTOptions()
    first, _ = next(json_events(fh), ("", None))
    if first != "start_array":
        raise ImportFormatError(f"not {WHAT}: conversations.json holds a list of conversations")
    fh.seek(0)
    for index, conversation in enumerate(ijson.items(fh, "item", use_float=True)):
        yield from _conversation_items(index, conversation, options)


def current_branch(mapping: dict[str, Any], current_node: object) -> list[str]:
    """Node ids from the root to `current_node` (the answer on screen). Without a usable
    current_node: from the root, always the last child (the latest regeneration or edit)."""
    node_id = current_node if _node_in(current_node, mapping) else _last_leaf(mapping)
    path: list[str] = []
    seen: set[str] = set()
    while _node_in(node_id, mapping) and node_id not in seen:
        seen.add(node_id)
        path.append(node_id)
        node = mapping[node_id]
        node_id = node.get("parent") if isinstance(node, dict) else None
    path.reverse()
    return path


def _node_in(value: object, mapping: dict[str, Any]) -> TypeGuard[str]:
    """Whether `value` names a node (node ids are the mapping's keys, always strings)."""
    return isinstance(value, str) and value in mapping


def _last_leaf(mapping: dict[str, Any]) -> str | None:
    roots = [k for k, n in mapping.items() if isinstance(n, dict) and not _node_in(n.get("parent"), mapping)]
    node_id = roots[0] if roots else None
    seen: set[str] = set()
    while node_id is not None and node_id not in seen:
        seen.add(node_id)
        node = mapping[node_id]
        listed = node.get("children") if isinstance(node, dict) else None
        children = [c for c in listed if _node_in(c, mapping)] if isinstance(listed, list) else []
        if not children:
            break
        node_id = children[-1]
    return node_id


def _conversation_items(index: int, conversation: object, options: ChatGPTOptions) -> Iterator[ImportItem]:
    where = f"conversation #{index + 1}"
    if not isinstance(conversation, dict) or not isinstance(conversation.get("mapping"), dict):
        yield Failed(where, "no 'mapping' (not a ChatGPT conversation)")
        return
    conv_id = conversation.get("conversation_id") or conversation.get("id")
    if not isinstance(conv_id, str) or not conv_id:
        yield Failed(where, "no conversation id")
        return
    mapping: dict[str, Any] = conversation["mapping"]
    branch = current_branch(mapping, conversation.get("current_node"))
    on_branch = set(branch)
    for node_id, node in mapping.items():
        if node_id not in on_branch and isinstance(node, dict) and isinstance(node.get("message"), dict):
            yield Skipped(f"message {node_id} in conversation {conv_id}", OTHER_BRANCH)

    title = conversation.get("title")
    thread_id = safe_id(f"chatgpt:{conv_id}")
    last_time: datetime | None = utc_from_unix(conversation.get("create_time"))
    for node_id in branch:
        message = mapping[node_id].get("message") if isinstance(mapping[node_id], dict) else None
        if not isinstance(message, dict):
            continue  # the root node carries no message
        msg_id = str(message.get("id") or node_id)
        ref = f"message {msg_id} in conversation {conv_id}"
        role = dict_at(message, "author").get("role")
        content = dict_at(message, "content")
        meta = dict_at(message, "metadata")
        skip = _skip_reason(role, message, content, meta)
        if skip:
            yield Skipped(ref, skip)
            continue
        parts: list[Any] = content["parts"] if isinstance(content.get("parts"), list) else []
        text = "\n".join(p for p in parts if isinstance(p, str))
        if not text.strip():
            yield Skipped(ref, EMPTY)
            continue
        # A message without a time (it happens) takes the one before it, so order is kept.
        occurred_at = utc_from_unix(message.get("create_time")) or last_time
        if occurred_at is None:
            yield Failed(ref, "no create_time on the message or the conversation")
            continue
        last_time = occurred_at
        metadata: dict[str, Any] = {}
        if isinstance(title, str) and title:
            metadata["conversation_title"] = title
        model = str_at(meta, "model_slug")
        if role == "assistant" and model:
            metadata["model"] = model
        not_text = sum(1 for p in parts if not isinstance(p, str))
        if not_text:  # images and other objects: not imported, but their existence is noted
            metadata["parts_not_imported"] = not_text
        yield from message_events(
            {
                "event_id": safe_id(f"chatgpt:{conv_id}:{msg_id}"),
                "thread_id": thread_id,
                "user_id": options.user_id,
                "platform": PLATFORM,
                "role": Role(str(role)),
                "text": text,
                "occurred_at": occurred_at,
                "platform_message_id": msg_id,
                "metadata": metadata,
            },
            ref=ref,
            max_text_chars=options.max_text_chars,
        )


def _skip_reason(role: object, message: dict[str, Any], content: dict[str, Any], meta: dict[str, Any]) -> str:
    if role not in ("user", "assistant"):
        return f"{role or 'unknown'} message"  # system prompts, tool outputs
    if meta.get("is_visually_hidden_from_conversation"):
        return HIDDEN
    if role == "assistant" and message.get("recipient") not in (None, "all"):
        return TOOL_CALL  # the model addressing a tool (browser, python, dalle), not the user
    content_type = content.get("content_type")
    if not isinstance(content_type, str) or content_type not in _TEXT_CONTENT:
        return f"non-text content ({content_type})"
    return ""
