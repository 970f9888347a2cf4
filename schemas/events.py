"""Wire events: what bots publish. JSON on the wire, one `schema_version` per event, the event id
set by the producer (it is the idempotency key). Bots in other languages use the JSON Schema
exported to `schemas/jsonschema/`."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

SCHEMA_VERSION = 1
# metadata flag of an event whose content was erased (its data key destroyed): a tombstone
ERASED = "erased"
SUPPORTED_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})
DEFAULT_MAX_TEXT_CHARS = 32_000
DEFAULT_MAX_DATA_URI_BYTES = 65_536
# Discord's bulk delete takes at most 100 messages and Telegram's deleteMessages 100; a larger
# purge comes as several events.
MAX_DELETED_IDS = 1_000


def _no_nul(value: str) -> str:
    # Postgres text cannot hold NUL; refusing it here keeps one bad event from failing a batch.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


# Ids become server-side filter values; a strict alphabet keeps wildcards and quotes out.
Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[\w.:@\-]+$"),
]
EventId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\w.:@\-]+$")]
SafeText = Annotated[str, AfterValidator(_no_nul)]
ShortText = Annotated[str, StringConstraints(max_length=512), AfterValidator(_no_nul)]
MessageRef = Annotated[str, StringConstraints(min_length=1, max_length=512), AfterValidator(_no_nul)]


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("must carry a timezone (for example 2024-05-08T13:56:00Z)")
    return value


AwareDatetime = Annotated[datetime, AfterValidator(_aware)]


def _find(item: dict[str, Any] | list[Any], kind: type, bad: Callable[[Any], bool]) -> tuple[list[str], Any] | None:
    """The first key or value of type `kind` inside `item` that `bad` picks, with its path; None
    if there is none. Every event's metadata passes through here: a leaf of another type costs
    one type check, and no path is built unless something is found."""
    pairs: Iterable[tuple[Any, Any]] = item.items() if isinstance(item, dict) else enumerate(item)
    for key, inner in pairs:
        if isinstance(key, kind) and bad(key):
            return [str(key)], key
        if isinstance(inner, dict | list):
            found = _find(inner, kind, bad)
            if found is not None:
                return [str(key), *found[0]], found[1]
        elif isinstance(inner, kind) and bad(inner):
            return [str(key)], inner
    return None


def _pointer(path: list[str]) -> str:
    """A path as a JSON Pointer (RFC 6901), NUL shown escaped: a reason is stored in Postgres text."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1").replace("\x00", "\\u0000") for p in path) or "/"


def _not_finite(item: float) -> bool:
    return not math.isfinite(item)


def _holds_nul(item: str) -> bool:
    return "\x00" in item


def _finite_numbers(value: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN or Infinity, yet Python's json writes them and reads them back, and reads a
    number beyond ±1.8e308 as Infinity. Such a value would be logged as null by the model's own
    JSON, or refused by Postgres, so it is refused here, where the producer or the dead letter
    can say where it is."""
    found = _find(value, float, _not_finite)
    if found is not None:
        path, number = found
        raise ValueError(f"{_pointer(path)} is {number}: JSON has no NaN or Infinity (nor a number beyond ±1.8e308)")
    return value


def _no_nul_inside(value: dict[str, Any]) -> dict[str, Any]:
    # A command's arguments reach Postgres text and jsonb (a thread's settings, a remembered fact),
    # which cannot hold NUL; metadata is only logged, sealed (docs/architecture.md, "Bad input").
    found = _find(value, str, _holds_nul)
    if found is not None:
        raise ValueError(f"{_pointer(found[0])} contains a NUL character")
    return value


# The free-form parts of an event: any JSON object.
JsonObject = Annotated[dict[str, Any], AfterValidator(_finite_numbers)]
CommandArgs = Annotated[JsonObject, AfterValidator(_no_nul_inside)]


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


class CommandName(StrEnum):
    REMEMBER = "remember"
    FORGET = "forget"
    CLOSE_EPISODE = "close_episode"
    SUMMARIZE_NOW = "summarize_now"
    MEMORY_ON = "memory_on"
    MEMORY_OFF = "memory_off"
    CONFIGURE = "configure"
    FORGET_ME = "forget_me"  # erase everything held about the sender (chatmem erase --user)
    ERASED = "erased"  # written by chatmem: an erasure happened here (no content)


class AttachmentKind(StrEnum):
    IMAGE = "image"
    DOCUMENT = "document"
    AUDIO = "audio"
    VIDEO = "video"
    OTHER = "other"


class Attachment(BaseModel):
    """A reference to a file; bytes never travel through Redis."""

    model_config = ConfigDict(extra="forbid")

    url: Annotated[str, StringConstraints(min_length=1, max_length=200_000)] = Field(
        description="file://, https://, a small data: URI, or telegram:file/<file_id> (a file the Telegram "
        "bot received; the attachments worker fetches it through the Bot API with the bot token from its settings)"
    )
    kind: AttachmentKind = AttachmentKind.OTHER
    mime_type: ShortText | None = Field(None, description="as declared by the platform; not trusted")
    filename: ShortText | None = None
    caption: SafeText | None = Field(None, description="the user's caption, if any")
    size_bytes: int | None = Field(None, ge=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str, info: ValidationInfo) -> str:
        scheme = value.split(":", 1)[0].lower() if ":" in value else ""
        if scheme == "data":
            limit = (info.context or {}).get("max_data_uri_bytes", DEFAULT_MAX_DATA_URI_BYTES)
            if len(value) > limit:
                raise ValueError(f"data: URI is {len(value)} bytes, above the limit of {limit}")
            return value
        if scheme == "file" and value.startswith("file://"):
            return value
        if scheme == "https" and value.startswith("https://") and len(value) > len("https://"):
            return value
        # A Bot API file_id is URL-safe base64; the reference names no token (the worker has it).
        if scheme == "telegram" and re.fullmatch(r"telegram:file/[A-Za-z0-9_\-]{1,512}", value):
            return value
        raise ValueError("must be a file://, https:// or data: URI, or telegram:file/<file_id>")


class _EventBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(SCHEMA_VERSION, description="version of this wire format")
    event_id: EventId = Field(
        default_factory=lambda: uuid.uuid4().hex,
        description="set by the producer; the idempotency key (a retried publish reuses it)",
    )
    thread_id: Identifier = Field(description="one conversation stream (a chat, a DM, a channel)")
    user_id: Identifier = Field(description="who the event is about or from")
    platform: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[\w.\-]+$")] = "generic"
    occurred_at: AwareDatetime = Field(default_factory=lambda: datetime.now(UTC))
    metadata: JsonObject = Field(
        default_factory=dict, description="any JSON object; its numbers must be finite (no NaN or Infinity)"
    )

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value not in SUPPORTED_SCHEMA_VERSIONS:
            supported = ", ".join(str(v) for v in sorted(SUPPORTED_SCHEMA_VERSIONS))
            raise ValueError(f"unsupported schema_version {value} (supported: {supported})")
        return value


def _check_text_limit(value: str, info: ValidationInfo) -> str:
    limit = (info.context or {}).get("max_text_chars", DEFAULT_MAX_TEXT_CHARS)
    if len(value) > limit:
        raise ValueError(f"is {len(value)} characters, above the limit of {limit}")
    return value


class MessageEvent(_EventBase):
    type: Literal["message"] = "message"
    role: Role = Role.USER
    text: SafeText = ""
    platform_message_id: ShortText | None = Field(None, description="the platform's own message id")
    reply_to: ShortText | None = Field(None, description="platform message id this one answers")
    attachments: list[Attachment] = Field(default_factory=list, max_length=32)

    _text_limit = field_validator("text")(_check_text_limit)


class MessageEditedEvent(_EventBase):
    type: Literal["message_edited"] = "message_edited"
    platform_message_id: ShortText = Field(description="the edited message's platform id")
    text: SafeText

    _text_limit = field_validator("text")(_check_text_limit)


class MessageDeletedEvent(_EventBase):
    """Messages deleted on the platform. Memory forgets them: their content is shredded in the log
    and their thread rebuilt without them, as retention does (docs/privacy.md)."""

    type: Literal["message_deleted"] = "message_deleted"
    platform_message_ids: list[MessageRef] = Field(
        min_length=1,
        max_length=MAX_DELETED_IDS,
        description="the deleted messages' platform ids: one, or a bulk delete's",
    )


class CommandEvent(_EventBase):
    type: Literal["command"] = "command"
    command: CommandName
    args: CommandArgs = Field(
        default_factory=dict,
        description="command arguments, e.g. {'text': ...}; finite numbers, no NUL characters",
    )


AnyEvent = MessageEvent | MessageEditedEvent | MessageDeletedEvent | CommandEvent
Event = Annotated[AnyEvent, Field(discriminator="type")]
EVENT_TYPES: dict[str, type[_EventBase]] = {
    "message": MessageEvent,
    "message_edited": MessageEditedEvent,
    "message_deleted": MessageDeletedEvent,
    "command": CommandEvent,
}
_KNOWN_TYPES = ", ".join(EVENT_TYPES)
_EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(Event)


class InvalidEvent(ValueError):
    """An event that cannot be accepted; `reason` names the field and the problem."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def describe_validation_error(error: ValidationError) -> str:
    """'text: is 40001 characters, above the limit of 32000; user_id: field required'."""
    parts = []
    for item in error.errors(include_url=False):
        path = list(item["loc"])
        if path and path[0] in EVENT_TYPES:  # the discriminated union's tag, not a field
            path = path[1:]
        loc = ".".join(str(p) for p in path) or "event"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            msg = "field required"
        elif item["type"] == "string_pattern_mismatch":
            msg = "may contain only letters, digits and _ . : @ -"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_event(
    raw: bytes | str,
    *,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    max_data_uri_bytes: int = DEFAULT_MAX_DATA_URI_BYTES,
    require_event_id: bool = True,
) -> AnyEvent:
    """Validate one JSON event from the wire; raise InvalidEvent with a readable reason.

    On the wire the producer must set event_id: a default made here would differ on every
    redelivery of the same entry and defeat deduplication."""
    context = {"max_text_chars": max_text_chars, "max_data_uri_bytes": max_data_uri_bytes}
    try:
        event = _EVENT_ADAPTER.validate_json(raw, context=context)
    except ValidationError as error:
        if any(e["type"] == "json_invalid" for e in error.errors()):
            raise InvalidEvent(f"malformed JSON: {error.errors()[0]['msg']}") from None
        types = {e["type"] for e in error.errors()}
        if types & {"union_tag_invalid", "union_tag_not_found", "model_attributes_type"}:
            raise InvalidEvent(_tag_reason(error)) from None
        raise InvalidEvent(describe_validation_error(error)) from None
    if require_event_id and "event_id" not in event.model_fields_set:
        raise InvalidEvent("event_id: field required (the producer sets it; it is the idempotency key)")
    return event


def _tag_reason(error: ValidationError) -> str:
    item = error.errors()[0]
    if item["type"] == "union_tag_not_found":
        return f"type: field required (one of {_KNOWN_TYPES})"
    if item["type"] == "model_attributes_type":
        return "event: must be a JSON object"
    found = (item.get("ctx") or {}).get("tag", "?")
    return f"type: unknown event type {found!r} (one of {_KNOWN_TYPES})"


def event_json_schemas() -> dict[str, dict[str, Any]]:
    """One JSON Schema per event kind, as committed under schemas/jsonschema/."""
    return {name: model.model_json_schema() for name, model in EVENT_TYPES.items()}


_IDENTIFIER_ADAPTER: TypeAdapter[str] = TypeAdapter(Identifier)


def validate_identifier(value: object, field: str = "thread_id") -> str:
    """Check a client-supplied id before it reaches any query or filter."""
    try:
        return _IDENTIFIER_ADAPTER.validate_python(value)
    except ValidationError as error:
        raise InvalidEvent(describe_validation_error(error).replace("event:", f"{field}:", 1)) from None
