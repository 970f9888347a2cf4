"""WhatsApp "Export chat" text files as message events: one thread per exported chat. The file
carries no ids and no time zone, and its line format follows the phone's language and region.
Rules: docs/importing.md."""

from __future__ import annotations

import codecs
import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from chatmem.producers.importers import (
    DELETED,
    DIRECTION_MARKS,
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
    local_file_url,
    make_attachment,
    message_events,
    name_id,
    safe_id,
    top_level,
    unpack_beside,
)
from chatmem.schemas.events import DEFAULT_MAX_TEXT_CHARS, Attachment, Role

PLATFORM = "whatsapp"
WHAT = "a WhatsApp chat export"
MEDIA_NOT_EXPORTED = "media not in the export (exported without media)"
VIEW_ONCE = "view-once media (never exported)"
BEFORE_FIRST = "text before the first dated line"
BUDDHIST_ERA = 543
OCCURRENCE_WINDOW = timedelta(hours=3)  # of local time: a message's occurrence is counted within it
OCCURRENCE_TIMES = 512  # times held before the older ones are let go
HEADER_PROBE_LINES = 200  # non-empty lines read for a dated one before the file is refused


class DateOrder(StrEnum):
    DMY = "dmy"
    MDY = "mdy"
    YMD = "ymd"


_MARKS = DIRECTION_MARKS
_PM = frozenset({"pm", "午後", "下午", "오후", "nachm", "م"})
_AMPM = r"[AaPp]\.?\s?[Mm]\.?|午前|午後|上午|下午|오전|오후|vorm\.|nachm\.|ص|م"
# One dated line: Android "31/12/2023, 23:59 - Name: text", iOS "[31/12/2023, 23:59:59] Name: text",
# with the date's order and separators, the clock and the spaces of the phone's region.
_HEADER = re.compile(
    rf"^[{_MARKS}]*(?P<br>\[)?"
    r"(?P<a>\d{1,4})(?P<sep>[./-])\s?(?P<b>\d{1,2})(?P=sep)\s?(?P<c>\d{1,4})\.?(?P<be>\s?BE)?"
    r"[,،]?\s"
    rf"(?:(?P<ap1>{_AMPM})\s?)?"
    r"(?P<h>\d{1,2})[:.](?P<mi>\d{2})(?:[:.](?P<s>\d{2}))?"
    rf"(?:\s?(?P<ap2>{_AMPM}))?"
    r"(?(br)\][ \u00a0]?|\s[-–]\s)"
    r"(?P<rest>.*)$"
)
_AUTHOR = re.compile(r"^(?P<author>[^:\n]{1,200}?): (?P<text>.*)$", re.S)
_QUOTES = re.compile('["“”„«»]')  # in a subject change ('… to "Trip: day 1"'), never before a message
# A file the message carries. iOS: "<attached: 00000012-PHOTO-2023-12-31-23-59-59.jpg>" (the word
# is the phone's language); Android: "IMG-20231231-WA0001.jpg (file attached)" (so is the bracket).
_IOS_FILE = re.compile(rf"[{_MARKS}]?<[^<>:\n]{{1,40}}:\s?(?P<file>[^<>\n]+?)>\s*$")
_ANDROID_FILE = re.compile(rf"^[{_MARKS}]?(?P<file>[^\s<>/\\][^<>/\\\n]*?\.[A-Za-z0-9]{{1,6}}) \([^()\n]{{1,40}}\)$")
# WhatsApp's own media names: a line naming one is an attachment even when the file is missing.
_MEDIA_NAME = re.compile(
    r"^(?:(?:IMG|VID|AUD|PTT|DOC|STK|PHOTO)-\d{8}-WA\d+|\d{8}-(?:PHOTO|VIDEO|AUDIO|STICKER|GIF|CONTACT)-[\d-]+)"
)
# "<Media omitted>" and its translations: a whole text in angle brackets, no file in it.
_MEDIA_PLACEHOLDER = re.compile(r"^<[^<>:/\\\n]{1,40}>$")
# iOS's words for media the export left out ("image omitted", "Notes.pdf • 2 pages document omitted").
_IOS_OMITTED = re.compile(r"^(?:(?:image|video|audio|sticker|GIF|Contact card) omitted|.+ document omitted)$")
_DELETED_TEXTS = frozenset({"this message was deleted", "you deleted this message"})
_EDITED = re.compile(r"\s*<This message was edited>$")
# WhatsApp's own notices in whole, as iOS (and Android, for a few in one-to-one chats) writes
# them under a name; iOS also marks them with U+200E, which some copies of a file have lost.
_SYSTEM_TEXT = re.compile(
    r"^(?:Messages and calls are end-to-end encrypted\. .*|Messages to this group are now secured with end-to-end"
    r" encryption\. .*|Your security code with .+ changed\. Tap to learn more\.|Missed (?:voice|video) call"
    r"|You (?:un)?blocked this contact\.|This chat is with a business account\. .*"
    r"|.+ changed their phone number to a new number\. .*|.+ changed (?:the subject|this group's icon) .*"
    r"|.+ turned (?:on|off) disappearing messages\..*|.+ updated the message timer\..*"
    r"|You use a default timer for disappearing messages in new chats\..*)$",
    re.S,
)
PLACEHOLDER_REPEATS = 3  # a bracketed text this often in one file is the phone's "<Media omitted>"


@dataclass(frozen=True)
class WhatsAppOptions:
    chat: str  # the chat's name: the thread is whatsapp:<it>
    zone: tzinfo  # the exporting phone's: the file's times are its local times
    date_order: DateOrder | None = None  # None: read from the file
    keep_service: bool = False  # system lines as role=system events instead of skipping them
    assistant_names: frozenset[str] = frozenset()  # authors whose messages are the bot's own
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    # What sniff_layout already read of this very file (the command prints it first): given, the
    # file is not read a third time for it.
    layout: Layout | None = None


@dataclass
class Layout:
    """What a file's dated lines say about its format."""

    date_order: DateOrder
    decided_by: str  # how the order was told, for the user to check
    placeholders: Counter[str] = field(default_factory=Counter)  # whole texts in angle brackets


def find_whatsapp_export(path: Path) -> Path:
    """The .txt itself, or the chat file in an export folder: `_chat.txt` from an iPhone, else the
    one .txt that starts with a dated line (Android's `WhatsApp Chat with ….txt`; a .txt shared in
    the chat lies beside it as media). The .zip WhatsApp shares is unpacked first."""
    if path.suffix.lower() == ".zip" and path.is_file():
        path = unpack_export(path)
    if not path.is_dir():
        return path
    if (path / "_chat.txt").is_file():
        return path / "_chat.txt"
    texts = sorted(p for p in path.glob("*.txt") if p.is_file())
    chats = [p for p in texts if _starts_dated(p)]
    if len(chats) != 1:
        found = "no .txt file that starts with a dated line" if not chats else f"{len(chats)} chat files; name one"
        raise ImportFormatError(f"{found} in {path} (WhatsApp: the chat's menu, More, Export chat)")
    return chats[0]


def unpack_export(archive: Path) -> Path:
    """The folder the export's zip unpacks to, beside it (the attachments worker reads the media
    from there); a folder already there holding a chat is used as it is."""
    return unpack_beside(
        archive,
        holds=lambda names: any(name.lower().endswith(".txt") for name in top_level(names)),
        what="no chat .txt (WhatsApp: the chat's menu, Export chat)",
        unpacked=lambda folder: (folder / "_chat.txt").is_file() or any(map(_starts_dated, folder.glob("*.txt"))),
    )


def _starts_dated(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        head = fh.read(4096).decode("utf-8", "replace").lstrip("\ufeff")
    return any(_HEADER.match(line) for line in head.splitlines()[:5])


# "WhatsApp Chat with Anna", "WhatsApp-Chat mit Anna", "Chat de WhatsApp con Anna", "Conversa do
# WhatsApp com Anna", "Чат WhatsApp с контактом Anna", iOS's "WhatsApp Chat - Anna": up to the name.
_CHAT_PREFIX = re.compile(
    r"^(?:[^\W\d_]+(?: d[eo])?[\s._-]+)?WhatsApp(?:[\s._-]*Chat)?[\s._]*"
    r"(?:with|mit|con|com|avec|met|dengan|ile|s uživatelem|с контактом|з контактом|-|–)?[\s._]+",
    re.I,
)


def chat_name(path: Path) -> str:
    """The chat's name as the export's file name gives it ("WhatsApp Chat with Anna.txt" → "Anna";
    an iPhone's _chat.txt → its folder, "WhatsApp Chat - Anna"); the whole name otherwise."""
    stem = path.parent.name if path.name == "_chat.txt" else path.stem
    name = _CHAT_PREFIX.sub("", stem).strip(" -–._") or stem
    return re.sub(r"\s*\(\d+\)$", "", name) or name  # "Anna (1)": the same chat exported twice


def thread_id_for(chat: str) -> str:
    return safe_id(f"whatsapp:{name_id(chat)}")


def time_zone(name: str | None) -> tuple[tzinfo, str]:
    """The zone an IANA name gives (Europe/Berlin, UTC), or this computer's when None; with the
    name to show. ValueError for a name no zone has."""
    if name is None:
        import tzlocal

        try:
            zone = tzlocal.reload_localzone()  # read now, not as cached by an earlier call
        except (ZoneInfoNotFoundError, ValueError) as error:  # TZ=UTC+3 and the like (a KeyError: args[0])
            raise ValueError(
                f"this computer's time zone cannot be read ({' '.join(str(error.args[0]).split())});"
                " give the phone's with --timezone,"
                " e.g. Europe/Berlin"
            ) from None
        shown = getattr(zone, "key", None) or tzlocal.get_localzone_name() or str(zone)
        return zone, f"{shown} (this computer's; --timezone to change)"
    try:
        return ZoneInfo(name), name
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as Europe/Berlin, or UTC)") from None


def read_lines(fh: JsonFile) -> Iterator[str]:
    """The file's lines, decoded as UTF-8 (a byte that is not becomes U+FFFD), split on \\n only:
    a message's own U+2028 stays in its text."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    first = True
    while chunk := fh.read(1 << 16):
        pending += decoder.decode(chunk)
        if first:
            pending = pending.removeprefix("\ufeff")  # written by some editors on Windows
            first = False
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending.removesuffix("\r")


def sniff_layout(fh: JsonFile, *, order: DateOrder | None = None) -> Layout:
    """Read the dated lines once to tell the date order (then rewind). A four-digit first part is
    year first. Otherwise a first part above 12 means day first, a second part above 12 month
    first; when neither occurs, the part that changes more often between messages is the day."""
    dated = probed = 0
    day_first = month_first = year_first = ""
    changes = Counter[str]()
    placeholders = Counter[str]()
    last: tuple[str, str] | None = None
    for line in read_lines(fh):
        match = _HEADER.match(line)
        if not match:
            if dated == 0 and line.strip():
                probed += 1
                if probed > HEADER_PROBE_LINES:
                    break
            continue
        dated += 1
        said = _AUTHOR.match(match["rest"])
        if said and _MEDIA_PLACEHOLDER.match(said["text"].strip(_MARKS + " ")):
            placeholders[said["text"].strip(_MARKS + " ")] += 1
        a, b = match["a"], match["b"]
        written = f"{a}{match['sep']}{b}{match['sep']}{match['c']}"
        if len(a) == 4:
            year_first = year_first or written
            continue
        if int(a) > 12:
            day_first = day_first or written
        if int(b) > 12:
            month_first = month_first or written
        if last is not None:
            changes["a"] += a != last[0]
            changes["b"] += b != last[1]
        last = (a, b)
    fh.seek(0)
    if dated == 0:
        raise ImportFormatError(
            f"not {WHAT}: no line starts with a date and a time such as '31/12/2023, 23:59 - '"
            " or '[31/12/2023, 23:59:59] '"
        )
    if order is not None:
        by = "given"
    elif year_first:
        order, by = DateOrder.YMD, f"year first ({year_first})"
    elif day_first and not month_first:
        order, by = DateOrder.DMY, f"day first ({day_first})"
    elif month_first and not day_first:
        order, by = DateOrder.MDY, f"month first ({month_first})"
    elif changes["b"] > changes["a"]:
        order, by = DateOrder.MDY, "month first (guessed: the second number changes more often)"
    else:
        order, by = DateOrder.DMY, "day first (guessed)"
    return Layout(order, by, placeholders)


@dataclass
class _Message:
    line_no: int
    header: re.Match[str]
    lines: list[str] = field(default_factory=list)


def whatsapp_items(fh: JsonFile, base_dir: Path, options: WhatsAppOptions) -> Iterator[ImportItem]:
    """Events (and skip / failure records) message by message; a message is its dated line and
    the undated lines after it."""
    layout = options.layout or sniff_layout(fh, order=options.date_order)
    reader = _Reader(options, layout, base_dir)
    current: _Message | None = None
    for line_no, line in enumerate(read_lines(fh), start=1):
        match = _HEADER.match(line)
        if match:
            if current is not None:
                yield from reader.items(current)
            current = _Message(line_no, match, [match["rest"]])
        elif current is not None:
            current.lines.append(line)
        elif line.strip():
            yield Skipped(f"line {line_no}", BEFORE_FIRST)
    if current is not None:
        yield from reader.items(current)


class _Reader:
    def __init__(self, options: WhatsAppOptions, layout: Layout, base_dir: Path):
        self.options = options
        self.layout = layout
        self.base_dir = base_dir
        self.chat_id = name_id(options.chat)
        self.thread_id = thread_id_for(options.chat)
        # Per local time: how often each author and text came at that time so far. Only the last
        # few hours are kept (a clock going back repeats one hour), so memory stays flat.
        self.seen: dict[datetime, Counter[str]] = {}
        self.latest = datetime.min
        self.previous = datetime.min  # the message before's local time
        self.folded = False  # in the second pass of an hour the clock went back over

    def items(self, message: _Message) -> Iterator[ImportItem]:
        ref = f"line {message.line_no}"
        body = "\n".join(message.lines)
        try:
            local = self._local_time(message.header)
        except ValueError as error:
            yield Failed(ref, str(error))
            return
        matched = _AUTHOR.match(body)
        author = matched["author"].strip(_MARKS + " ") if matched else None
        text = matched["text"] if matched else body
        if author is not None and _QUOTES.search(author):
            author, text = None, body  # a subject change whose new subject has a colon
        # The id: the chat, the local time as written, the author and the text, and which
        # occurrence of those this is, so a newer export of the same chat gives the same ids.
        key = f"{local.isoformat()}\x1f{author or ''}\x1f{body}"
        digest = hashlib.sha256(f"{key}\x1f{self._occurrence(local, key)}".encode()).hexdigest()[:20]
        fields: dict[str, Any] = {
            "event_id": safe_id(f"whatsapp:{self.chat_id}:{digest}"),
            "thread_id": self.thread_id,
            "platform": PLATFORM,
            "occurred_at": self._utc(local),
            "platform_message_id": digest,
        }
        marked = text.lstrip(" ").startswith("\u200e")  # iOS marks its system lines and media
        text = text.strip(_MARKS + " ").rstrip()
        if author is None:
            yield from self._service(ref, fields, None, text)
            return
        metadata: dict[str, Any] = {"author_name": author}
        edited = _EDITED.search(text)
        if edited:
            text = text[: edited.start()]
            metadata["edited"] = True
        if text.casefold().rstrip(".") in _DELETED_TEXTS:
            yield Skipped(ref, DELETED)
            return
        if text == "null":  # what Android writes for a view-once photo or video
            yield Skipped(ref, VIEW_ONCE)
            return
        attachments: list[Attachment] = []
        kept: list[str] = []
        lines = text.split("\n")
        for index, line in enumerate(lines):
            found, rest = self._attachment(line, ref, metadata)
            if isinstance(found, AttachmentSkipped):
                yield found
            elif found is not None:
                if len(attachments) < MAX_ATTACHMENTS:
                    attachments.append(found)
                else:
                    yield AttachmentSkipped(ref, TOO_MANY)
            elif self._placeholder(rest, marked=index > 0 and rest.startswith("\u200e")):
                metadata.setdefault("attachments_not_included", []).append({"reason": MEDIA_NOT_EXPORTED})
                yield AttachmentSkipped(ref, MEDIA_NOT_EXPORTED)
                rest = ""
            if rest:
                kept.append(rest)
        whole = len(kept) == len(lines) and not attachments  # no line was a file or a placeholder
        text = "\n".join(kept).strip()
        if whole and (marked or _SYSTEM_TEXT.match(text)):
            # iOS's notices, and its placeholders in other languages than English, carry the mark
            yield from self._service(ref, fields, author, text)
            return
        if not text and not attachments:
            yield Skipped(ref, EMPTY)
            return
        role = Role.ASSISTANT if author in self.options.assistant_names else Role.USER
        yield from message_events(
            {
                **fields,
                "user_id": safe_id(f"whatsapp:{name_id(author)}"),
                "role": role,
                "text": text,
                "attachments": attachments,
                "metadata": metadata,
            },
            ref=ref,
            max_text_chars=self.options.max_text_chars,
        )

    def _utc(self, local: datetime) -> datetime:
        """The local time in UTC. In the hour a clock goes back, the same times come twice: the
        second ones from when the file goes back in that hour until it leaves it."""
        aware = local.replace(tzinfo=self.options.zone)
        later = aware.replace(fold=1)
        if later.utcoffset() == aware.utcoffset():
            self.folded = False
        elif local < self.previous:
            self.folded = True
        self.previous = local
        return (later if self.folded else aware).astimezone(UTC)

    def _occurrence(self, local: datetime, key: str) -> int:
        """Which occurrence of this time, author and text this message is (1 for the first)."""
        if local > self.latest:
            self.latest = local
            if len(self.seen) > OCCURRENCE_TIMES:
                horizon = local - OCCURRENCE_WINDOW
                self.seen = {at: seen for at, seen in self.seen.items() if at >= horizon}
        seen = self.seen.setdefault(local, Counter())
        seen[key] += 1
        return seen[key]

    def _placeholder(self, line: str, *, marked: bool) -> bool:
        """Whether a line stands for media the export left out: Android's "<Media omitted>" (in the
        phone's language: any bracketed text the file repeats), iOS's "image omitted", or a line
        iOS marked after a caption (its placeholder in any language)."""
        line = line.strip(_MARKS + " ")
        if marked or _IOS_OMITTED.match(line):
            return bool(line)
        if not _MEDIA_PLACEHOLDER.match(line):
            return False
        return " ".join(line[1:-1].split()) == "Media omitted" or self.layout.placeholders[line] >= PLACEHOLDER_REPEATS

    def _service(self, ref: str, fields: dict[str, Any], author: str | None, text: str) -> Iterator[ImportItem]:
        if not self.options.keep_service:
            yield Skipped(ref, SERVICE)
            return
        # No sender: the chat stands in, as for Telegram's service messages without one.
        metadata = {"service_author": author} if author else {}
        yield from message_events(
            {
                **fields,
                "user_id": safe_id(f"whatsapp:{self.chat_id}"),
                "role": Role.SYSTEM,
                "text": text,
                "metadata": metadata,
            },
            ref=ref,
            max_text_chars=self.options.max_text_chars,
        )

    def _attachment(
        self, line: str, ref: str, metadata: dict[str, Any]
    ) -> tuple[Attachment | AttachmentSkipped | None, str]:
        """(the file a line names, the line's words besides it); (None, line) when it names none.
        A name the folder lacks counts as a file only when WhatsApp's wording or naming says so."""
        ios = _IOS_FILE.search(line)
        match = ios or _ANDROID_FILE.match(line)
        if match is None:
            return None, line
        name = match["file"].strip(_MARKS + " ")
        rest = (line[: match.start()] + line[match.end() :]).strip(_MARKS + " ")
        url, reason = local_file_url(self.base_dir, name, inside_only=True)
        if url is None:
            if not ios and not _MEDIA_NAME.match(name) and reason == FILE_MISSING:
                return None, line  # "notes.pdf (see below)": words, not a file
            metadata.setdefault("attachments_not_included", []).append({"file_name": name, "reason": reason})
            return AttachmentSkipped(ref, reason), rest
        return make_attachment(ref, url=url, kind=attachment_kind(None, name), filename=name), rest

    def _local_time(self, header: re.Match[str]) -> datetime:
        a, b, c = int(header["a"]), int(header["b"]), int(header["c"])
        order = DateOrder.YMD if len(header["a"]) == 4 else self.layout.date_order
        if order is DateOrder.YMD:
            year, month, day = a, b, c
        elif order is DateOrder.DMY:
            day, month, year = a, b, c
        else:
            month, day, year = a, b, c
        if year < 100:
            year += 2000
        if header["be"]:
            year -= BUDDHIST_ERA  # a phone set to the Thai solar calendar: "3/18/2565 BE"
        hour, minute, second = int(header["h"]), int(header["mi"]), int(header["s"] or 0)
        marker = header["ap1"] or header["ap2"]
        if marker:
            if not 1 <= hour <= 12:
                raise ValueError(f"time {header['h']}:{header['mi']} {marker} is not a 12-hour time")
            hour = hour % 12 + (12 if re.sub(r"[\s.]", "", marker.lower()) in _PM else 0)
        try:
            naive = datetime(year, month, day, hour, minute, second)
        except ValueError:
            written = f"{header['a']}{header['sep']}{header['b']}{header['sep']}{header['c']}"
            raise ValueError(
                f"date {written} {header['h']}:{header['mi']} does not exist read as {order.value}"
            ) from None
        return naive  # fold=0: in the hour a clock goes back, the first of the two times it shows
