"""What the bytes are: the type of a file from its content, never from the event, and whether
the event's declared type contradicts it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from chatmem.memory.attachments.errors import BadFile

IMAGE_MIMES = {
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/bmp",
    "image/tiff",
}
DOCUMENT_MIMES = {"application/pdf", "text/plain", "text/markdown", "text/html"}


@dataclass(frozen=True)
class Sniffed:
    mime: str
    kind: str  # image | document


_HTML = re.compile(rb"^\s*(<!--.*?-->\s*)*(<!doctype\s+html|<html|<head|<body)", re.I | re.S)
_MARKDOWN_NAME = re.compile(r"\.(md|markdown|mdown)$", re.I)
_MARKDOWN_SHAPE = re.compile(r"^(#{1,6} \S|[-*] \S|\d+\. \S|```)", re.M)


def sniff(data: bytes, filename: str | None, guess_binary: Callable[[bytes], str | None]) -> Sniffed:
    """The type of `data`, from its bytes (`guess_binary` reads magic numbers). Text is told
    apart by shape: HTML by its opening tags, Markdown by its name or its headings and lists."""
    if not data:
        raise BadFile("the file is empty")
    mime = guess_binary(data)
    if mime in IMAGE_MIMES:
        return Sniffed(mime, "image")
    if mime == "application/pdf":
        return Sniffed(mime, "document")
    if mime is not None:
        raise BadFile(f"files of type {mime} are not understood")
    head = data[:65536]
    if b"\x00" in head:
        raise BadFile("binary file of an unknown type")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # a cut multi-byte character at the end is fine
            raise BadFile("binary file of an unknown type (not UTF-8 text)") from None
    if _HTML.match(head):
        return Sniffed("text/html", "document")
    if (filename and _MARKDOWN_NAME.search(filename)) or len(
        _MARKDOWN_SHAPE.findall(head.decode("utf-8", "ignore"))
    ) >= 2:
        return Sniffed("text/markdown", "document")
    return Sniffed("text/plain", "document")


_GENERIC_MIMES = {"application/octet-stream", "binary/octet-stream", "application/unknown", ""}


def declared_mismatch(declared_kind: str | None, declared_mime: str | None, sniffed: Sniffed) -> str | None:
    """Why the event's declared type contradicts the bytes, or None. A generic or absent
    declaration never contradicts; a specific one must name the same kind of file."""
    mime = (declared_mime or "").split(";")[0].strip().lower()
    if mime and mime not in _GENERIC_MIMES:
        declared_family = (
            "image"
            if mime.startswith("image/")
            else "document"
            if mime in DOCUMENT_MIMES or mime.startswith("text/")
            else mime
        )
        if declared_family != sniffed.kind:
            return f"declared as {mime} but the bytes are {sniffed.mime}"
    if declared_kind == "image" and sniffed.kind != "image":
        return f"declared as an image but the bytes are {sniffed.mime}"
    if declared_kind in ("audio", "video"):
        return f"declared as {declared_kind}; the bytes are {sniffed.mime}"
    return None
