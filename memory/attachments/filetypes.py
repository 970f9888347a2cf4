"""What the bytes are: the type of a file from its content, never from the event, and whether
the event's declared type contradicts it."""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import charset_normalizer

from chatmem.memory.attachments.errors import BadFile

IMAGE_MIMES = {
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/apng",  # an animated PNG, which `filetype` names apart (refused until 2026-12-01)
    "image/webp",
    "image/bmp",
    "image/tiff",
    "image/avif",  # what newer Android phones and browsers save
    "image/heic",  # what iPhones save
}
# Recordings speech-to-text endpoints take (OpenAI's: flac, mp3, mp4/m4a, ogg, wav, webm), by the
# name `filetype` gives each, with the extension the upload is named by (the endpoint reads the
# format from it). Telegram's and Discord's voice notes are OGG/Opus; Telegram's round video
# messages are MP4.
AUDIO_EXTENSIONS = {
    "audio/ogg": "ogg",
    "audio/mpeg": "mp3",
    "audio/mp4": "m4a",
    "audio/x-flac": "flac",
    "audio/x-wav": "wav",
}
# Videos are read for their pictures in any of these containers (FFmpeg reads them all), and for
# their speech in those the endpoints take. An iPhone's QuickTime .mov and an .m4v are sent named
# .mp4: the endpoints list no .mov, and FFmpeg, which such servers decode with, reads the three
# with one demuxer.
VIDEO_EXTENSIONS = {"video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mp4", "video/x-m4v": "mp4"}
VIDEO_MIMES = {*VIDEO_EXTENSIONS, "video/x-matroska", "video/3gpp", "video/x-msvideo"}
RECORDING_EXTENSIONS = {**AUDIO_EXTENSIONS, **VIDEO_EXTENSIONS}
DOCX_MIME = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX_MIME = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX_MIME = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLS_MIME = "application/vnd.ms-excel"  # Excel 97-2003 (and 5 and 95)
DOC_MIME = "application/msword"  # Word 97-2003
PPT_MIME = "application/vnd.ms-powerpoint"  # PowerPoint 97-2003
# A password-protected .docx, .xlsx or .pptx: the package, encrypted, inside a compound file.
ENCRYPTED_OFFICE_MIME = "application/x-encrypted-office"
# OpenDocument (LibreOffice, and what Google Docs and Office can save): text, spreadsheet and
# presentation.
ODT_MIME = "application/vnd.oasis.opendocument.text"
ODP_MIME = "application/vnd.oasis.opendocument.presentation"
ODF_MIMES = {ODT_MIME, "application/vnd.oasis.opendocument.spreadsheet", ODP_MIME}
# The same documents saved as one XML file (LibreOffice's "Flat XML": .fodt, .fods, .fodp), told
# by the type their root element names.
FLAT_ODF_MIMES = {f"{mime}-flat-xml" for mime in ODF_MIMES}
_FLAT_ODF = re.compile(
    r"^\s*(?:<\?xml[^>]*\?>\s*)?<office:document\b[^>]*?\boffice:mimetype=[\"'](application/vnd\.oasis\.opendocument\."
    r"(?:text|spreadsheet|presentation))[\"']",
    re.S,
)
# Documents told by their magic number (a Word, Excel or PowerPoint file is a ZIP whose parts
# name it, an OpenDocument file a ZIP whose first part names its type; an older Word or Excel
# file, a compound file whose streams name it); the text kinds are told apart by their shape.
BINARY_DOCUMENT_MIMES = {"application/pdf", DOCX_MIME, XLSX_MIME, PPTX_MIME, XLS_MIME, DOC_MIME, PPT_MIME, *ODF_MIMES}
# XML is text: a flat OpenDocument file is often declared as such.
DOCUMENT_MIMES = {
    *BINARY_DOCUMENT_MIMES,
    *FLAT_ODF_MIMES,
    "text/plain",
    "text/markdown",
    "text/html",
    "application/xml",
}


@dataclass(frozen=True)
class Sniffed:
    mime: str
    kind: str  # image | document | audio | video


_HTML = re.compile(r"^\s*(<!--.*?-->\s*)*(<!doctype\s+html|<html|<head|<body)", re.I | re.S)
_MARKDOWN_NAME = re.compile(r"\.(md|markdown|mdown)$", re.I)
_MARKDOWN_SHAPE = re.compile(r"^(#{1,6} \S|[-*] \S|\d+\. \S|```)", re.M)

HEAD_BYTES = 65536  # what the type and a text's encoding are read from
# A byte order mark names its encoding. UTF-32's begin with UTF-16's, so they come first.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# The code pages a text saved by an older program is likely to be in: Windows' for Western,
# Central European, Cyrillic, Greek, Turkish, Hebrew, Arabic, Baltic and Thai text, the Russian
# and Ukrainian Unix ones, DOS Cyrillic, and the East Asian multi-byte ones. Letting the detector
# choose among every code page it knows reads short texts in a rare one.
LEGACY_ENCODINGS = (
    "cp1252", "cp1251", "cp1250", "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp874",
    "koi8_r", "koi8_u", "cp866", "cp932", "euc_jp", "gb18030", "big5", "euc_kr",
)  # fmt: skip


def sniff(data: bytes, filename: str | None, guess_binary: Callable[[bytes], str | None]) -> Sniffed:
    """The type of `data`, from its bytes (`guess_binary` reads magic numbers). Text is told
    apart by shape: HTML by its opening tags, Markdown by its name or its headings and lists."""
    if not data:
        raise BadFile("the file is empty")
    mime = guess_binary(data)
    if mime in IMAGE_MIMES:
        return Sniffed(mime, "image")
    if mime in BINARY_DOCUMENT_MIMES:
        return Sniffed(mime, "document")
    if mime in AUDIO_EXTENSIONS:
        return Sniffed(mime, "audio")
    if mime in VIDEO_MIMES:
        return Sniffed(mime, "video")
    if mime == ENCRYPTED_OFFICE_MIME:
        raise BadFile("the Office file is encrypted (password protected)")
    if mime is not None:
        raise BadFile(f"files of type {mime} are not understood")
    encoding = text_encoding(data)
    if encoding is None:
        raise BadFile("binary file of an unknown type (not text in UTF-8, UTF-16 or a known code page)")
    head = data[:HEAD_BYTES].decode(encoding, "ignore")
    if flat := _FLAT_ODF.match(head):
        return Sniffed(f"{flat[1]}-flat-xml", "document")
    if _HTML.match(head):
        return Sniffed("text/html", "document")
    if (filename and _MARKDOWN_NAME.search(filename)) or len(_MARKDOWN_SHAPE.findall(head)) >= 2:
        return Sniffed("text/markdown", "document")
    return Sniffed("text/plain", "document")


# A sound track: an MP4's or QuickTime file's handler box of type `soun`, a WebM's audio codec ids.
_ISO_SOUND = re.compile(rb"hdlr.{8}soun", re.S)
_SOUND_TRACK = {
    "video/mp4": _ISO_SOUND,
    "video/quicktime": _ISO_SOUND,
    "video/x-m4v": _ISO_SOUND,
    "video/webm": re.compile(rb"A_(?:OPUS|VORBIS|AAC|MPEG)"),
}


def has_sound(data: bytes, mime: str) -> bool:
    """Whether a recording has sound to read. A chat's GIFs travel as MP4 without a sound track
    (Telegram's animations): sending them to a speech model would cost a call each for nothing."""
    pattern = _SOUND_TRACK.get(mime)
    return pattern is None or pattern.search(data) is not None


def text_encoding(data: bytes) -> str | None:
    """The encoding a file is text in, read from its first HEAD_BYTES: its byte order mark's,
    else UTF-8, else the legacy code page that reads it best (a text file saved by an older
    Windows or DOS program); None for bytes that are not text."""
    head = data[:HEAD_BYTES]
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding if _reads_as_text(head, encoding) else None
    if b"\x00" in head:
        return None
    try:
        head.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError as error:
        if error.start >= len(head) - 4:  # a multi-byte character cut at the end
            return "utf-8"
    if len(data) > len(head):  # cut at a line's end, not inside a multi-byte character
        head = head[: head.rfind(b"\n") + 1] or head
    best = charset_normalizer.from_bytes(head, cp_isolation=list(LEGACY_ENCODINGS)).best()
    return best.encoding if best is not None else None


def _reads_as_text(head: bytes, encoding: str) -> bool:
    # A byte order mark can begin binary bytes too: the rest must decode, and to printable text.
    try:
        text = codecs.getincrementaldecoder(encoding)().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    # Control characters other than white space, and code points no character is assigned to.
    odd = sum(unicodedata.category(c) in ("Cc", "Cn") and c not in "\t\n\r\f\v" for c in text)
    return odd <= 0.05 * len(text)


def decode_text(data: bytes) -> str:
    """A text file's characters, in the encoding `text_encoding` finds (a byte order mark
    dropped); a byte that does not decode becomes U+FFFD."""
    return data.decode(text_encoding(data) or "utf-8", errors="replace")


_GENERIC_MIMES = {"application/octet-stream", "binary/octet-stream", "application/unknown", ""}


def declared_mismatch(declared_kind: str | None, declared_mime: str | None, sniffed: Sniffed) -> str | None:
    """Why the event's declared type contradicts the bytes, or None. A generic or absent
    declaration never contradicts; a specific one must name the same kind of file."""
    mime = (declared_mime or "").split(";")[0].strip().lower()
    if mime and mime not in _GENERIC_MIMES:
        declared_family = (
            "image"
            if mime.startswith("image/")
            else "audio"
            if mime.startswith("audio/")
            else "video"
            if mime.startswith("video/")
            else "document"
            if mime in DOCUMENT_MIMES or mime.startswith("text/")
            else mime
        )
        if declared_family != sniffed.kind:
            return f"declared as {mime} but the bytes are {sniffed.mime}"
    if declared_kind == "image" and sniffed.kind != "image":
        return f"declared as an image but the bytes are {sniffed.mime}"
    if declared_kind in ("audio", "video") and sniffed.kind not in ("audio", "video"):
        return f"declared as {declared_kind}; the bytes are {sniffed.mime}"
    return None
