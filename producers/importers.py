"""Importers: turn files into events published through the normal publisher."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import mimetypes
import re
import shutil
import stat
import tempfile
import time
import unicodedata
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote

import ijson
from pydantic import ValidationError

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import (
    Attachment,
    AttachmentKind,
    InvalidEvent,
    MessageEvent,
    describe_validation_error,
    parse_event,
)
from chatmem.schemas.settings import Settings

LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"
# Spellings of a session's time that the format's own files do not use but an edited copy may.
LOCOMO_DATE_VARIANTS = (LOCOMO_DATE_FORMAT, "%I:%M %p on %d %B %Y", "%I:%M %p on %B %d, %Y", "%d %B, %Y", "%d %B %Y")
LOCOMO_GAP = timedelta(hours=1)  # a session with no readable time: this long after the one before
UTF8_BOM = b"\xef\xbb\xbf"  # written first by some editors on Windows; JSON parsers refuse it

log = logging.getLogger(__name__)


@dataclass
class ImportResult:
    accepted: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)


def publish_jsonl(pub: Publisher, path: Path, settings: Settings, batch: int = 500) -> ImportResult:
    """Validate each line as a wire event; publish the valid ones in order, report the rest."""
    result = ImportResult()
    pending = []
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line_no == 1:
                line = line.removeprefix(UTF8_BOM)  # as an editor on Windows saves a file
            if not line.strip():
                continue
            try:
                pending.append(
                    parse_event(
                        line,
                        max_text_chars=settings.max_text_chars,
                        max_data_uri_bytes=settings.max_data_uri_bytes,
                    )
                )
            except InvalidEvent as error:
                result.rejected.append((line_no, error.reason))
            if len(pending) >= batch:
                result.accepted += len(pub.publish_many(pending))
                pending.clear()
    if pending:
        result.accepted += len(pub.publish_many(pending))
    return result


def locomo_events(path: Path, samples: set[str] | None = None) -> Iterator[MessageEvent]:
    """LoCoMo conversations as message events, in order: one thread per sample, one event per
    turn (user_id = the speaker, platform message id = dia_id, time = the session's time plus
    the turn's index in seconds, an image's caption as an attachment caption). Event ids are
    derived from the turn, so importing twice stores everything once."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    for sample in data:
        sample_id = str(sample["sample_id"])
        if samples is not None and sample_id not in samples:
            continue
        conv = sample["conversation"]
        sessions = sorted(
            (k for k, v in conv.items() if re.fullmatch(r"session_\d+", k) and isinstance(v, list)),
            key=lambda k: int(k.split("_")[1]),
        )
        last: datetime | None = None
        for key in sessions:
            start = locomo_session_time(conv.get(f"{key}_date_time"))
            if start is None:
                # The turns keep their place after the session before; questions about its dates lose.
                log.warning(
                    "LoCoMo %s %s: no readable session time (%r); placed after the session before",
                    sample_id,
                    key,
                    conv.get(f"{key}_date_time"),
                )
                start = (last or datetime(2000, 1, 1, tzinfo=UTC)) + LOCOMO_GAP
            last = start + timedelta(seconds=len(conv[key]))
            for index, turn in enumerate(conv[key]):
                urls = turn.get("img_url") or []
                original = (urls[0] if urls else None) if isinstance(urls, list) else urls
                attachments = []
                if turn.get("blip_caption"):
                    # Only https references are accepted; the dataset has some http ones.
                    url = original if str(original).startswith("https://") else "https://locomo.invalid/image"
                    attachments.append(Attachment(url=url, kind=AttachmentKind.IMAGE, caption=turn["blip_caption"]))
                yield MessageEvent(
                    event_id=f"locomo:{sample_id}:{turn['dia_id']}",
                    thread_id=sample_id,
                    user_id=re.sub(r"[^\w.:@-]", "_", turn["speaker"]),
                    platform="locomo",
                    text=turn.get("text") or "",
                    occurred_at=start + timedelta(seconds=index),
                    platform_message_id=turn["dia_id"],
                    attachments=attachments,
                    metadata={"author_name": turn["speaker"], **({"img_url": original} if original else {})},
                )


def locomo_session_time(value: object) -> datetime | None:
    """A session's time as LoCoMo writes it ("1:56 pm on 8 May, 2023"), or None."""
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    for fmt in LOCOMO_DATE_VARIANTS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def publish_locomo(pub: Publisher, path: Path, samples: set[str] | None = None, batch: int = 500) -> ImportResult:
    result = ImportResult()
    pending: list[MessageEvent] = []
    for event in locomo_events(path, samples):
        pending.append(event)
        if len(pending) >= batch:
            result.accepted += len(pub.publish_many(pending))
            pending.clear()
    if pending:
        result.accepted += len(pub.publish_many(pending))
    return result


# --- chat exports (Telegram, Discord, ChatGPT): what the importers share ---------------------
# Rules: docs/importing.md. A parser is a generator over one open export file that yields events
# and records of what it skipped or could not use; ChatImport publishes the events, skipping
# those the event log already holds, and counts the rest.

# Reasons are fixed phrases (counted per phrase in the report), except validation failures.
DUPLICATE = "duplicate id in the export"
DELETED = "deleted message"
SERVICE = "service message"
EMPTY = "empty message"
FILE_MISSING = "file missing from the export folder"
FILE_OUTSIDE = "file outside the export folder"
FILE_UNNAMEABLE = "file path this system cannot hold (a NUL character, or a name too long)"
# What pathlib's is_file took for "no such file" up to Python 3.13.
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)
HTTP_URL = "http:// URL (only https:// is accepted)"
TOO_MANY = "more than 32 attachments on one message"
MAX_ATTACHMENTS = 32
MAX_FAILURES_SHOWN = 20
UNPACK_HEADROOM = 256 * 2**20  # left free on the disk after an export's zip is unpacked

_ID_REFUSED = re.compile(r"[^A-Za-z0-9_.:@-]")
_DOCUMENT_TYPES = frozenset(
    {
        "application/pdf",
        "application/rtf",
        "application/msword",
        "application/json",
        "application/xml",
        "application/epub+zip",
    }
)
_DOCUMENT_PREFIXES = (
    "text/",
    "application/vnd.openxmlformats-officedocument.",
    "application/vnd.oasis.opendocument.",
    "application/vnd.ms-",
)


class ImportFormatError(ValueError):
    """The file is not the export it was said to be; the message is shown to the user as is."""


@dataclass(frozen=True)
class Skipped:
    """An export item not published on purpose (a service message, an empty one)."""

    ref: str
    reason: str


@dataclass(frozen=True)
class Failed:
    """An export item that cannot become a valid event; `reason` names the field and the problem."""

    ref: str
    reason: str


@dataclass(frozen=True)
class AttachmentSkipped:
    """A file a message refers to that is not attached to its event (the message itself is
    published or skipped on its own account)."""

    ref: str
    reason: str


ImportItem = MessageEvent | Skipped | Failed | AttachmentSkipped


class JsonFile(Protocol):
    """What a parser reads an export from: a binary file, or LoneSurrogatesReplaced over one."""

    def read(self, size: int = -1, /) -> bytes: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def tell(self) -> int: ...


# (open export file, the folder it is in) -> what it holds, in file order.
Parser = Callable[[JsonFile, Path], Iterator[ImportItem]]


def dict_at(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """obj[key] if it is an object, else {} (export fields are not to be trusted for shape)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def list_at(obj: dict[str, Any], key: str) -> list[Any]:
    """obj[key] if it is a list, else []."""
    value = obj.get(key)
    return value if isinstance(value, list) else []


def str_at(obj: dict[str, Any], key: str) -> str | None:
    """obj[key] if it is a string, else None."""
    value = obj.get(key)
    return value if isinstance(value, str) else None


def safe_id(raw: str) -> str:
    """`raw` as an identifier the wire accepts (letters, digits, _ . : @ -, at most 128): other
    characters become '_'; a longer id keeps its start plus a hash of the whole, so it stays
    stable across runs (it is the idempotency key) and distinct."""
    cleaned = _ID_REFUSED.sub("_", raw) or "_"
    if len(cleaned) <= 128:
        return cleaned
    return f"{cleaned[:111]}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


# Direction marks: WhatsApp on iOS puts U+200E before notices and media, Android wraps phone
# numbers in U+202A…U+202C; none of them is part of a name or a text's meaning at its edges.
DIRECTION_MARKS = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff"
_PHONE = re.compile(r"^\+?[\d\s().-]{7,}$")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9 ._@-]+$")


def name_id(name: str) -> str:
    """A person's or chat's name as an id part, for exports that give names and no ids: a phone
    number as its digits, a plain ASCII name as itself (spaces as _), any other name folded to
    ASCII plus a hash of the name, so two names that fold alike stay apart."""
    name = " ".join(name.strip(DIRECTION_MARKS + " ").split())
    if _PHONE.match(name) and sum(ch.isdigit() for ch in name) >= 7:
        return "".join(ch for ch in name if ch.isdigit())
    if _PLAIN_NAME.match(name):
        return safe_id(name.replace(" ", "_"))
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9]+", "_", folded).strip("_")[:60]
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{slug}-{digest}" if slug else digest


def utc_from_unix(value: object) -> datetime | None:
    """Seconds since the epoch (a number or a numeric string) as an aware UTC time; None if absent or invalid."""
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
        return datetime.fromtimestamp(seconds, UTC) if math.isfinite(seconds) else None
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def utc_from_iso(value: object) -> datetime:
    """An ISO 8601 time with an offset, converted to UTC; ValueError (a readable reason) otherwise."""
    if not isinstance(value, str) or not value:
        raise ValueError("no timestamp")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"timestamp {value!r} is not ISO 8601") from None
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no time zone offset")
    return parsed.astimezone(UTC)


def attachment_kind(mime_type: str | None, filename: str | None = None) -> AttachmentKind:
    """The kind from the declared MIME type, else from the file name's extension."""
    mime = (mime_type or mimetypes.guess_type(filename or "")[0] or "").lower()
    major = mime.split("/", 1)[0]
    if major in ("image", "audio", "video"):
        return AttachmentKind(major)
    if mime in _DOCUMENT_TYPES or mime.startswith(_DOCUMENT_PREFIXES):
        return AttachmentKind.DOCUMENT
    return AttachmentKind.OTHER


def local_file_url(base_dir: Path, reference: str, *, inside_only: bool) -> tuple[str | None, str]:
    """(file:// URL of the absolute path, '') for a file an export refers to, resolved against the
    export's folder; (None, reason) when it is missing, or outside that folder with inside_only."""
    candidates = [reference.replace("\\", "/")]
    if "%" in reference:  # some exporters percent-encode the relative paths they write
        candidates.append(unquote(candidates[0]))
    root = base_dir.resolve()
    for candidate in candidates:
        try:
            path = (root / candidate).resolve()  # an absolute `candidate` replaces root
            if inside_only and not path.is_relative_to(root):
                return None, FILE_OUTSIDE
            # stat, not is_file: from Python 3.14 is_file answers False for a name too long too.
            if stat.S_ISREG(path.stat().st_mode):
                return path.as_uri(), ""
        except OSError as error:
            if error.errno not in _ABSENT:  # ENAMETOOLONG and the like
                return None, FILE_UNNAMEABLE
        except ValueError:  # a NUL in the path
            return None, FILE_UNNAMEABLE
    return None, FILE_MISSING


def make_attachment(ref: str, **fields: Any) -> Attachment | AttachmentSkipped:
    try:
        return Attachment(**fields)
    except ValidationError as error:
        return AttachmentSkipped(ref, f"attachment {describe_validation_error(error)}")


def split_text(text: str, limit: int) -> list[str]:
    """Pieces of at most `limit` characters that join back to `text`, cut after the last paragraph
    break, else line break, else space in the second half of each window, else at the limit."""
    parts = []
    while len(text) > limit:
        window = text[:limit]
        cut = limit
        for separator in ("\n\n", "\n", " "):
            at = window.rfind(separator)
            if at >= limit // 2:
                cut = at + len(separator)
                break
        parts.append(text[:cut])
        text = text[cut:]
    parts.append(text)
    return parts


def message_events(fields: dict[str, Any], *, ref: str, max_text_chars: int) -> Iterator[MessageEvent | Failed]:
    """The event for one exported message. A text above the limit is split into parts rather than
    lost or refused: ids `<event_id>`, `<event_id>:2`, …, metadata part/parts, the attachments
    with the first part; the same platform message id on each."""
    text = fields.get("text") or ""
    pieces = split_text(text, max_text_chars) if len(text) > max_text_chars else [text]
    context = {"max_text_chars": max_text_chars}
    for number, piece in enumerate(pieces, start=1):
        data = {**fields, "text": piece}
        if len(pieces) > 1:
            data["metadata"] = {**fields.get("metadata", {}), "part": number, "parts": len(pieces)}
            if number > 1:
                data["event_id"] = safe_id(f"{fields['event_id']}:{number}")
                data["attachments"] = []
        try:
            yield MessageEvent.model_validate(data, context=context)
        except ValidationError as error:
            where = ref if len(pieces) == 1 else f"{ref} (part {number} of {len(pieces)})"
            yield Failed(where, describe_validation_error(error))


def unpack_beside(
    archive: Path, *, holds: Callable[[list[str]], bool], what: str, unpacked: Callable[[Path], bool]
) -> Path:
    """The folder an export's zip unpacks to, beside it and named as it is (`export.zip` →
    `export/`). `holds` tells from the zip's names whether it is the export (else ImportFormatError
    with `what`); a folder already there that is `unpacked` is used as it is, so a rerun does not
    unpack again. A zip is unpacked whole or not at all (into a temporary folder renamed at the
    end), so a stopped unpack is never taken for a finished one."""
    target = archive.with_suffix("")
    if target.exists():
        if target.is_dir() and unpacked(target):
            return target
        raise ImportFormatError(f"{target} is in the way: unpack {archive.name} elsewhere and import that folder")
    try:
        with zipfile.ZipFile(archive) as package:
            members = package.infolist()
            if not holds([m.filename for m in members]):
                raise ImportFormatError(f"{archive.name} holds {what}")
            if any(m.flag_bits & 0x1 for m in members):
                raise ImportFormatError(f"{archive.name} is password protected: unpack it and import the folder")
            needed = sum(m.file_size for m in members)
            free = shutil.disk_usage(archive.parent).free
            if needed + UNPACK_HEADROOM > free:
                raise ImportFormatError(
                    f"{archive.name} unpacks to {needed / 2**20:,.0f} MiB and {free / 2**20:,.0f} MiB are free"
                )
            partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".unpacking", dir=archive.parent))
            try:
                package.extractall(partial)  # names with .. or a leading / are kept inside it
                partial.rename(target)
            except OSError as error:
                shutil.rmtree(partial, ignore_errors=True)
                raise ImportFormatError(f"cannot unpack {archive.name} beside it: {error}") from None
            except BaseException:  # Ctrl-C
                shutil.rmtree(partial, ignore_errors=True)
                raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as error:
        raise ImportFormatError(f"{archive.name} is not a zip that can be read ({error})") from None
    return target


def top_level(names: list[str]) -> set[str]:
    """The names of a zip's members that are at its top, not in a folder."""
    return {name for name in names if "/" not in name.replace("\\", "/").rstrip("/")}


class KnownIds(Protocol):
    """Which of these event ids the event log already holds (adapters/imported_pg.py)."""

    def __call__(self, ids: list[str], /) -> set[str]: ...


class EventPublisher(Protocol):
    def publish_many(self, events: Iterable[MessageEvent], /) -> list[str]: ...


@dataclass
class ImportReport:
    published: int = 0
    already_imported: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # the first MAX_FAILURES_SHOWN
    attachments: int = 0
    attachments_skipped: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    bytes_total: int = 0
    seconds: float = 0.0

    @property
    def items(self) -> int:
        """Items handled so far (events counted once they are published or found known)."""
        return self.published + self.already_imported + sum(self.skipped.values()) + self.failed


def _reason(error: ijson.JSONError | UnicodeDecodeError) -> str:
    if isinstance(error, UnicodeDecodeError):  # the C parser's output: bytes that are not UTF-8
        return f"text that is not UTF-8: {error.reason}"
    return str(error)


class ChatImport:
    """Runs a parser over export files and publishes its events in batches, in file order.

    Before each batch is published the event log is asked which of its ids it already holds
    (`known_ids`); those are skipped. A second import of the same export therefore publishes
    nothing, and an interrupted one, run again, continues where the stored events end. Memory
    stays bounded: one parsed item at a time plus one batch of events."""

    def __init__(
        self,
        publisher: EventPublisher,
        known_ids: KnownIds,
        *,
        batch_size: int = 1000,
        on_progress: Callable[[ImportReport], None] | None = None,
        json_files: bool = True,
    ):
        self.publisher = publisher
        # A JSON export is read past its byte order mark and with lone surrogate escapes mended;
        # a text export (WhatsApp) as it is: there `\\ud83d` would be words someone typed.
        self.json_files = json_files
        self.known_ids = known_ids
        self.batch_size = batch_size
        self.on_progress = on_progress
        self.report = ImportReport()

    def run(self, files: list[Path], parse: Parser) -> ImportReport:
        """Import the files in order; the report is also left in `self.report` when this raises
        (KeyboardInterrupt, ImportFormatError, PublishError)."""
        report = self.report
        report.bytes_total = sum(path.stat().st_size for path in files)
        started = time.monotonic()
        done = 0
        pending: list[MessageEvent] = []
        try:
            for path in files:
                with open(path, "rb") as fh:
                    try:
                        source = LoneSurrogatesReplaced(fh) if self.json_files else fh
                        for count, item in enumerate(parse(source, path.parent), start=1):
                            if isinstance(item, MessageEvent):
                                pending.append(item)
                                if len(pending) >= self.batch_size:
                                    self._publish(pending)
                                    pending = []
                            else:
                                self._note(item)
                            if count % self.batch_size == 0:
                                report.bytes_read = done + fh.tell()
                                report.seconds = time.monotonic() - started
                                self._progress()
                    except (ijson.JSONError, UnicodeDecodeError) as error:
                        self._publish(pending)  # what was read before the damage is good
                        pending = []
                        raise ImportFormatError(
                            f"{path.name}: not valid JSON near byte {fh.tell():,} ({_reason(error)})"
                        ) from None
                    except ImportFormatError as error:
                        self._publish(pending)
                        pending = []
                        raise ImportFormatError(f"{path.name}: {error}") from None
                done += path.stat().st_size
            self._publish(pending)
            report.bytes_read = done
        finally:
            report.seconds = time.monotonic() - started
        self._progress()
        return report

    def _note(self, item: Skipped | Failed | AttachmentSkipped) -> None:
        if isinstance(item, Skipped):
            self.report.skipped[item.reason] += 1
        elif isinstance(item, AttachmentSkipped):
            self.report.attachments_skipped[item.reason] += 1
        else:
            self.report.failed += 1
            if len(self.report.failures) < MAX_FAILURES_SHOWN:
                self.report.failures.append((item.ref, item.reason))

    def _publish(self, batch: list[MessageEvent]) -> None:
        if not batch:
            return
        known = self.known_ids([e.event_id for e in batch])
        fresh: list[MessageEvent] = []
        seen: set[str] = set()
        for event in batch:
            if event.event_id in known:
                self.report.already_imported += 1
            elif event.event_id in seen:
                self.report.skipped[DUPLICATE] += 1
            else:
                seen.add(event.event_id)
                fresh.append(event)
        if fresh:
            self.report.published += len(self.publisher.publish_many(fresh))
            self.report.attachments += sum(len(e.attachments) for e in fresh)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.report)


# --- unpaired surrogates: the escape of half an emoji ------------------------------------------
# `\\u` and a UTF-16 surrogate's hex digits: a high half (group 1), with the low half after it
# (group 2), or a low half. Each pattern starts with a literal, which `re` finds at memchr speed.
_SURROGATE_ESCAPE = re.compile(
    rb"\\u(?:([dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?|[dD][c-fC-F][0-9a-fA-F]{2})"
)
_HIGH_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_LOW_ESCAPE = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
# A superset of the lone halves, found in one C-speed search: a high half not followed by a low
# one, or a low half not after a high one whose backslash stands alone (a longer run may make
# the high half plain text; the exact pass below decides).
_MAYBE_LONE = re.compile(
    rb"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|[c-fC-F](?<!(?<!\\)\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F]))"
)
_LONGEST_PAIR = 12  # two escapes: what one decision may need to see


class LoneSurrogatesReplaced:
    """A JSON file read as the parser should see it: from after a byte order mark if it starts with
    one, and with the escape of a UTF-16 surrogate without its other half as `\\ufffd`, the
    replacement character. Exporters that count text in UTF-16 write such an escape when they
    cut a text inside an emoji; the C parser reads a lone high half as '?' but fails on a lone
    low half with UnicodeDecodeError, which would end the whole import. The escape keeps its
    length, so byte offsets stay true."""

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.pending = b""  # read, not yet decided: it may end inside an escape or a pair
        # RFC 8259 lets a parser ignore a byte order mark; a rewind comes back to after it.
        self.start = len(UTF8_BOM) if raw.read(len(UTF8_BOM)) == UTF8_BOM else 0
        raw.seek(self.start)

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""  # ijson asks, to learn that the file gives bytes
        while True:
            data = self.raw.read(size)
            final = not data or size < 0
            decided, self.pending = replace_lone_surrogates(self.pending + data, final=final)
            if decided or final:  # b"" only at the end
                return decided

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise OSError("this reader only rewinds")
        self.raw.seek(self.start)
        self.pending = b""
        return 0

    def tell(self) -> int:
        return self.raw.tell() - len(self.pending) - self.start


def replace_lone_surrogates(buf: bytes, *, final: bool) -> tuple[bytes, bytes]:
    """(the decided start of `buf` with each unpaired surrogate escape as `\\ufffd`, the rest).
    Unless `final`, the rest begins at the first run of backslashes within the last twelve bytes
    (it may be an escape cut short), never between the halves of a pair."""
    cut = len(buf) if final else _undecided_from(buf)
    if _MAYBE_LONE.search(buf, 0, cut) is None:
        return buf[:cut], buf[cut:]
    out = bytearray(buf)
    for match in _SURROGATE_ESCAPE.finditer(buf, 0, cut):
        start = match.start()
        if buf[start - 1 : start] == b"\\" and (start - _run_start(buf, start)) % 2:
            if match.group(2) is None:
                continue  # an escaped backslash, then a plain 'u'
            hex_at = match.start(2) + 2  # and after it a low half that is an escape, alone
        elif match.group(2) is not None:
            continue  # a pair
        else:
            hex_at = start + 2
        out[hex_at : hex_at + 4] = b"fffd"
    return bytes(out[:cut]), buf[cut:]


def _undecided_from(buf: bytes) -> int:
    tail = buf.find(b"\\", max(0, len(buf) - _LONGEST_PAIR))
    if tail < 0:
        return len(buf)
    cut = _run_start(buf, tail)  # the whole run: its length decides what it escapes
    if cut >= 6 and _HIGH_ESCAPE.match(buf, cut - 6, cut):  # a high half just before
        if _LOW_ESCAPE.match(buf, cut):
            return cut + 6  # with its low half: decided together
        if len(buf) - cut < 6:
            return _run_start(buf, cut - 6)  # its other half may be coming
    return cut


def _run_start(buf: bytes, at: int) -> int:
    """Where the run of backslashes that ends at `at` begins."""
    while at > 0 and buf[at - 1] == 0x5C:
        at -= 1
    return at


# --- streaming JSON: walk a document's structure without holding it ---------------------------
# basic_parse yields (event, value) pairs; these helpers read one level of an object or array at
# a time, so only the item being looked at is ever built.
JsonEvents = Iterator[tuple[str, Any]]
_OPEN = ("start_map", "start_array")
_CLOSE = ("end_map", "end_array")


def json_events(fh: JsonFile) -> JsonEvents:
    return ijson.basic_parse(fh, use_float=True)


def json_members(events: JsonEvents) -> Iterator[tuple[str, str, Any]]:
    """After a start_map: (key, first event of its value, that event's value) per member. The
    caller consumes each value (json_value, json_skip, or a nested walk) before the next."""
    for event, value in events:
        if event == "end_map":
            return
        first, first_value = next(events)
        yield value, first, first_value


def json_array_items(events: JsonEvents) -> Iterator[tuple[str, Any]]:
    """After a start_array: (first event, value) per item; the caller consumes each item."""
    for event, value in events:
        if event == "end_array":
            return
        yield event, value


def json_value(events: JsonEvents, first: str, value: Any) -> Any:
    """The whole value that starts with (first, value)."""
    if first not in _OPEN:
        return value
    builder = ijson.ObjectBuilder()
    builder.event(first, value)
    depth = 1
    for event, item in events:
        builder.event(event, item)
        if event in _OPEN:
            depth += 1
        elif event in _CLOSE:
            depth -= 1
            if depth == 0:
                break
    return builder.value


def json_skip(events: JsonEvents, first: str) -> None:
    """Read past the value that starts with `first` without building it."""
    if first not in _OPEN:
        return
    depth = 1
    for event, _ in events:
        if event in _OPEN:
            depth += 1
        elif event in _CLOSE:
            depth -= 1
            if depth == 0:
                return


def json_top_level(
    fh: JsonFile, *, what: str, wanted: set[str], stream_key: str, stop_at: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], set[str]]:
    """The wanted members of the top-level object (built whole: they are small) and the top-level
    keys seen. Stops at the array under `stream_key` once the wanted members are known (exports
    write their header first; otherwise it reads past the array), or at a key in `stop_at`; then
    rewinds the file."""
    events = json_events(fh)
    first, _ = next(events, ("", None))
    if first != "start_map":
        raise ImportFormatError(f"not {what}: the top level is not a JSON object")
    found: dict[str, Any] = {}
    seen: set[str] = set()
    for key, event, value in json_members(events):
        seen.add(key)
        if key == stream_key and event != "start_array":
            raise ImportFormatError(f"not {what}: '{stream_key}' is not a list")
        if key in stop_at or (key == stream_key and event == "start_array" and wanted <= found.keys()):
            break
        if key in wanted:
            found[key] = json_value(events, event, value)
        else:
            json_skip(events, event)
    fh.seek(0)
    return found, seen
