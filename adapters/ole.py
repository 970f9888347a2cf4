"""Office 97-2003 files are compound files (OLE2): a small file system whose streams name what
the file is. This module tells them apart by those streams (`compound_type`), and reads the text
of a Word 97-2003 document (`word_paragraphs`) and of a PowerPoint 97-2003 presentation
(`powerpoint_slides`), and the pictures of both (`word_pictures`, `powerpoint_pictures`), which
no maintained library does in pure Python: olefile opens the
container, and the text is found as [MS-DOC] and [MS-PPT] lay it out (a Word document's piece
table; a presentation's persist directory, slide list and text atoms)."""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from chatmem.memory.attachments.errors import BadFile
from chatmem.memory.attachments.filetypes import DOC_MIME, ENCRYPTED_OFFICE_MIME, PPT_MIME, XLS_MIME

CFB_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# The stream that makes a compound file each kind; Excel 5 and 95 named theirs "Book".
_STREAMS = (
    ("WordDocument", DOC_MIME),
    ("Workbook", XLS_MIME),
    ("Book", XLS_MIME),
    ("PowerPoint Document", PPT_MIME),
    ("EncryptedPackage", ENCRYPTED_OFFICE_MIME),
)


def compound_type(data: bytes) -> str | None:
    """The kind of Office file a compound file is, by the streams it holds; None for another
    compound file (an Outlook message, a Windows installer ...) or one that cannot be opened."""
    import olefile

    try:
        with olefile.OleFileIO(data) as container:
            names = {path[0] for path in container.listdir(streams=True, storages=False) if len(path) == 1}
    except (OSError, ValueError, IndexError, struct.error, RecursionError):
        return None
    return next((mime for stream, mime in _STREAMS if stream in names), None)


# --- a Word 97-2003 document's text ---------------------------------------------------------------
_WORD_IDENT = 0xA5EC
_WORD_95 = 0x0068  # nFib of Word 95 (Word 6: 0x0065); theirs is another layout. Word 97: 0x00C1
_ENCRYPTED, _WHICH_TABLE, _OBFUSCATED = 0x0100, 0x0200, 0x8000
# FibRgFcLcb97's (fc, lcb) pairs read: the style sheet, the paragraph properties' index, the
# piece table.
_STSHF_INDEX, _PAPX_INDEX, _CLX_INDEX = 1, 13, 33
_TTP = 0x2417  # sprmPFTtp: the paragraph mark ends a table row
_HEADINGS = {**{sti: sti for sti in range(1, 10)}, 62: 1}  # built-in Heading 1-9; Title (62)
# Field marks: the instruction between begin and separator is code ("HYPERLINK ..."), the result
# after the separator is what the page shows.
_FIELD_BEGIN, _FIELD_SEPARATOR, _FIELD_END = "\x13", "\x14", "\x15"
_CELL = "\x07"  # ends a table cell; one more ends the row
_TOKENS = re.compile(r"([^\r\x07]*)([\r\x07]|$)")
# Characters that stand for something else, or for nothing the text says (a picture, a drawing,
# a footnote or comment reference).
_CHARACTERS = str.maketrans(
    {"\x0b": " ", "\x0c": "\r", "\x0e": "\r", "\x1e": "-", "\xa0": " ", "\x1f": None, "\x01": None, "\x02": None,
     "\x03": None, "\x04": None, "\x05": None, "\x08": None}
)  # fmt: skip


def word_paragraphs(data: bytes, max_chars: int) -> list[tuple[str, int]]:
    """The main text of a Word 97-2003 document (not its headers, footnotes or text boxes), as
    (paragraph, heading level or 0), a table row's cells joined by " | ", up to about
    `max_chars`. BadFile for an encrypted, older or broken one. Its title is not read: olefile's
    property-set parser loops over whatever count a broken file declares."""
    import olefile

    try:
        with olefile.OleFileIO(data) as container:
            document = container.openstream("WordDocument").read()
            ident, version = struct.unpack_from("<HH", document, 0)
            (flags,) = struct.unpack_from("<H", document, 0x0A)
            if ident != _WORD_IDENT:
                raise BadFile("broken Word document: its WordDocument stream does not begin a Word file")
            if flags & (_ENCRYPTED | _OBFUSCATED):
                raise BadFile("the Word document is encrypted (password protected)")
            if version <= _WORD_95:
                raise BadFile("a Word 6 or Word 95 document: only Word 97-2003 documents are read")
            table = container.openstream("1Table" if flags & _WHICH_TABLE else "0Table").read()
            text, offsets = _main_text(document, table, max_chars)
            marks = _paragraph_marks(document, table)
    except BadFile:
        raise
    except (OSError, ValueError, IndexError, KeyError, struct.error, RecursionError) as error:
        raise BadFile(f"broken Word document: {error}") from None
    return list(_paragraphs(*_without_fields(text, offsets), marks))


_PICF_HEADER, _NAMED_PICTURE = 0x44, 0x66  # a picture's header size; a picture that carries its file's name


def word_pictures(data: bytes, limit: int) -> list[bytes]:
    """The pictures of a Word 97-2003 document, at most `limit`, as its Data stream holds them:
    one structure a picture (PICFAndOfficeArtData: a header of 68 bytes that gives the
    structure's size, the picture's shape, then the store entry that holds the picture itself),
    walked by their sizes; the walk ends at anything else. Metafiles are left out, as a slide's."""
    import olefile

    try:
        with olefile.OleFileIO(data) as container:
            if not container.exists("Data"):
                return []
            stream = container.openstream("Data").read()
    except OSError as error:
        raise BadFile(f"broken Word document: {error}") from None
    found: list[bytes] = []
    at = 0
    while at + 8 <= len(stream) and len(found) < limit:
        size, header, mode = struct.unpack_from("<IHH", stream, at)
        if header != _PICF_HEADER or size < header:
            break
        start, end = at + header, min(at + size, len(stream))
        if mode == _NAMED_PICTURE and start < end:
            start += 1 + stream[start]  # the name's length, then the name
        for kind, _, (entry, stop) in _children(stream, start, end):
            if kind == _FBSE and entry + 36 <= stop:
                if image := _blip(stream, entry + 36 + stream[entry + 33], stop):
                    found.append(image)
        at += size
    return found[:limit]


def _main_text(document: bytes, table: bytes, max_chars: int) -> tuple[str, list[int]]:
    """The first ccpText characters of the document, piece by piece (each piece is either
    Windows-1252, one byte a character, or UTF-16), at most about 2 × `max_chars` of them, and
    each character's offset in the WordDocument stream (paragraph properties are found by it)."""
    csw = struct.unpack_from("<H", document, 0x20)[0]
    lw = 0x22 + 2 * csw + 2  # FibRgLw97, after its count
    cslw = struct.unpack_from("<H", document, lw - 2)[0]
    if (csw, cslw) != (14, 22):  # what every Word 97-2003 file holds
        raise BadFile("broken Word document: its File Information Block is not a Word 97-2003 one")
    ccp_text = struct.unpack_from("<i", document, lw + 12)[0]
    pairs = lw + 4 * cslw + 2  # FibRgFcLcb, after its count
    fc_clx, lcb_clx = struct.unpack_from("<II", document, pairs + 8 * _CLX_INDEX)
    clx = table[fc_clx : fc_clx + lcb_clx]
    if len(clx) != lcb_clx or lcb_clx == 0:
        raise BadFile("broken Word document: its piece table is missing")
    at = 0
    while at < len(clx) and clx[at] == 0x01:  # property modifiers before the piece table
        (size,) = struct.unpack_from("<h", clx, at + 1)
        if size < 0:  # would step back, or stay, for ever
            raise BadFile("broken Word document: a property modifier of negative size")
        at += 3 + size
    if at >= len(clx) or clx[at] != 0x02:
        raise BadFile("broken Word document: its piece table is missing")
    (size,) = struct.unpack_from("<I", clx, at + 1)
    plc = clx[at + 5 : at + 5 + size]
    pieces = (len(plc) - 4) // 12
    if pieces < 1:
        raise BadFile("broken Word document: its piece table is empty")
    cps = struct.unpack_from(f"<{pieces + 1}i", plc, 0)
    wanted = min(ccp_text, 2 * max_chars)
    out: list[str] = []
    offsets: list[int] = []
    for n in range(pieces):
        start, end = max(cps[n], 0), min(cps[n + 1], wanted)
        if start >= wanted:
            break
        if end <= start:
            continue
        (fc,) = struct.unpack_from("<I", plc, 4 * (pieces + 1) + 8 * n + 2)
        if fc & 0x40000000:  # compressed: one byte a character, at half the offset
            offset, width = (fc & 0x3FFFFFFF) // 2, 1
            piece = document[offset : offset + end - start].decode("cp1252", "replace")
        else:
            offset, width = fc, 2
            piece = document[fc : fc + 2 * (end - start)].decode("utf-16-le", "replace")
        out.append(piece)
        offsets += range(offset, offset + width * len(piece), width)
    return "".join(out), offsets


def _without_fields(text: str, offsets: list[int]) -> tuple[str, list[int]]:
    """The text as shown, with its characters' offsets: a field's instruction left out, its result
    kept (nested fields too)."""
    out: list[str] = []
    kept: list[int] = []
    hidden = 0  # depth of open fields whose instruction is being read
    stack: list[bool] = []  # for each open field: still in its instruction
    for ch, offset in zip(text, offsets, strict=True):
        if ch == _FIELD_BEGIN:
            stack.append(True)
            hidden += 1
        elif ch == _FIELD_SEPARATOR and stack:
            if stack[-1]:
                stack[-1] = False
                hidden -= 1
        elif ch == _FIELD_END and stack:
            if stack.pop():
                hidden -= 1
        elif not hidden:
            out.append(ch)
            kept.append(offset)
    return "".join(out), kept


@dataclass(frozen=True)
class _Marks:
    """Paragraph properties by stream offset: runs starting at `starts`, each its heading level
    (0 for none) and whether its mark ends a table row."""

    starts: list[int]
    levels: list[int]
    row_ends: list[bool]

    def at(self, offset: int) -> tuple[int, bool | None]:
        """The heading level and, when known, whether the mark at `offset` ends a row."""
        n = bisect.bisect_right(self.starts, offset) - 1
        return (self.levels[n], self.row_ends[n]) if n >= 0 else (0, None)


def _paragraphs(text: str, offsets: list[int], marks: _Marks) -> Iterator[tuple[str, int]]:
    """(paragraph, heading level), and table rows with their cells joined by " | ". A cell ends
    with a cell mark; the row with one more, which the paragraph properties name. Without them
    (a file whose properties cannot be read) a mark right after a cell's ends the row, so an
    empty cell ends its row early."""
    cells: list[str] = []
    after_cell = False  # the last mark was a cell's
    for found in _TOKENS.finditer(text.translate(_CHARACTERS)):
        words = " ".join("".join(c for c in found[1] if c >= " " or c == "\t").split())
        level, row_end = marks.at(offsets[found.end() - 1]) if found[2] else (0, None)
        if found[2] == _CELL:
            if row_end or (row_end is None and not words and after_cell):  # the row's own mark
                if cells:
                    yield " | ".join(dict.fromkeys(cells)), 0
                cells = []
            elif words:
                cells.append(words)
            after_cell = True
            continue
        after_cell = False
        if words and cells:  # a cell's earlier paragraph: part of the cell
            cells.append(words)
        elif words:
            yield words, level
    if cells:
        yield " | ".join(dict.fromkeys(cells)), 0


def _paragraph_marks(document: bytes, table: bytes) -> _Marks:
    """Each paragraph run's style and row-end flag, from the paragraph properties' pages (PAPX
    FKPs) and the style sheet. A file whose properties cannot be read loses only its headings
    and its rows' ends, not its text."""
    try:
        stis = _style_ids(document, table)
        fc, lcb = struct.unpack_from("<II", document, 0x9A + 8 * _PAPX_INDEX)
        count = (lcb - 4) // 8
        pages = struct.unpack_from(f"<{count}I", table, fc + 4 * (count + 1)) if count > 0 else ()
        runs: list[tuple[int, int, bool]] = []
        for page_number in dict.fromkeys(n & 0x3FFFFF for n in pages):  # a page named twice is read once
            runs += _fkp_runs(document, page_number * 512)
    except (struct.error, IndexError, ValueError):
        return _Marks([], [], [])
    runs.sort()
    levels = [_HEADINGS.get(stis[istd], 0) if istd < len(stis) else 0 for _, istd, _ in runs]
    return _Marks([start for start, _, _ in runs], levels, [ttp for _, _, ttp in runs])


def _fkp_runs(document: bytes, at: int) -> list[tuple[int, int, bool]]:
    """(first offset, style index, ends a row) of each run on one 512-byte page of paragraph
    properties."""
    page = document[at : at + 512]
    if len(page) < 512:
        raise IndexError("a page of paragraph properties is cut short")
    count = page[511]
    starts = struct.unpack_from(f"<{count + 1}I", page, 0)
    runs = []
    for n in range(count):
        place = 2 * page[4 * (count + 1) + 13 * n]
        if place == 0:  # the default properties: style 0
            runs.append((starts[n], 0, False))
            continue
        size = 2 * page[place] - 1 if page[place] else 2 * page[place + 1]
        body = page[place + 1 : place + 1 + size] if page[place] else page[place + 2 : place + 2 + size]
        (istd,) = struct.unpack_from("<H", body, 0)
        runs.append((starts[n], istd, _has_ttp(body[2:])))
    return runs


_OPERAND_SIZES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 2, 5: 2, 7: 3}  # by spra; 6: sized by its first byte


def _has_ttp(grpprl: bytes) -> bool:
    """Whether a paragraph's property modifiers say its mark ends a table row."""
    at = 0
    while at + 2 <= len(grpprl):
        (sprm,) = struct.unpack_from("<H", grpprl, at)
        at += 2
        if sprm == _TTP:
            return at < len(grpprl) and grpprl[at] == 1
        spra = sprm >> 13
        at += _OPERAND_SIZES[spra] if spra != 6 else 1 + (grpprl[at] if at < len(grpprl) else 0)
    return False


def _style_ids(document: bytes, table: bytes) -> list[int]:
    """The built-in style id (sti) of each style index (istd); 0xFFF for a style of the user's
    own, or an empty slot."""
    fc, lcb = struct.unpack_from("<II", document, 0x9A + 8 * _STSHF_INDEX)
    sheet = table[fc : fc + lcb]
    header = struct.unpack_from("<H", sheet, 0)[0]
    (count,) = struct.unpack_from("<H", sheet, 2)
    at, stis = 2 + header, []
    for _ in range(count):
        (size,) = struct.unpack_from("<H", sheet, at)
        stis.append(struct.unpack_from("<H", sheet, at + 2)[0] & 0x0FFF if size else 0xFFF)
        at += 2 + size
    return stis


# --- a PowerPoint 97-2003 presentation's text -------------------------------------------------
_ENCRYPTED_TOKEN = 0xF3D1C4DF  # the Current User stream's token when the presentation is encrypted
_DOCUMENT, _SLIDE, _SLIDE_ATOM, _NOTES, _NOTES_ATOM = 0x03E8, 0x03EE, 0x03EF, 0x03F0, 0x03F1
_SLIDE_LIST, _SLIDE_PERSIST, _USER_EDIT, _PERSIST_DIRECTORY = 0x0FF0, 0x03F3, 0x0FF5, 0x1772
_TEXT_HEADER, _TEXT_CHARS, _TEXT_BYTES = 0x0F9F, 0x0FA0, 0x0FA8
_SLIDES, _NOTES_PAGES = 0, 2  # instances of the document's slide lists (1: the masters, not read)
_TITLES, _NOTES_TEXT = {0, 6}, 2  # text types: title, centred title; a notes page's text
_MAX_EDITS = 1_000  # saves kept in one file; a loop of edits is a broken file


@dataclass(frozen=True)
class SlideText:
    title: str
    texts: list[str]  # paragraphs of the slide's other text, in its order
    notes: list[str]


@dataclass(frozen=True)
class _Deck:
    """A presentation as its last save left it: the PowerPoint Document stream, where each persist
    object is, the document record, and the document's slide lists by instance."""

    stream: bytes
    persist: dict[int, int]
    document: Span
    lists: dict[int, Span]
    pictures: bytes  # the Pictures stream, where the pictures' bytes are (b"" without one)


def _deck(data: bytes) -> _Deck:
    """Found as PowerPoint does: the Current User stream names the last save, whose persist
    directory gives where each record is."""
    import olefile

    with olefile.OleFileIO(data) as container:
        stream = container.openstream("PowerPoint Document").read()
        current = container.openstream("Current User").read()
        pictures = container.openstream("Pictures").read() if container.exists("Pictures") else b""
    token, edit = struct.unpack_from("<II", current, 12)
    if token == _ENCRYPTED_TOKEN:
        raise BadFile("the presentation is encrypted (password protected)")
    persist, document_ref = _persist_directory(stream, edit)
    document = _record_at(stream, persist.get(document_ref), _DOCUMENT)
    lists = {inst: body for kind, inst, body in _children(stream, *document) if kind == _SLIDE_LIST}
    return _Deck(stream, persist, document, lists, pictures)


def powerpoint_slides(data: bytes, max_slides: int, max_chars: int) -> tuple[list[SlideText], int]:
    """The first `max_slides` slides of a PowerPoint 97-2003 presentation (of a file with more,
    while their text stays within about `max_chars`) and how many it has. Slides are found as
    PowerPoint does: the last save's persist directory gives where each record is, and the
    document's slide list gives their order. A slide's text is the text its list holds (placeholders,
    as PowerPoint 97-2003 saved them) and the text of its shapes."""
    try:
        deck = _deck(data)
        stream, persist, lists = deck.stream, deck.persist, deck.lists
        slides = _slide_list(stream, lists.get(_SLIDES))
        notes_by_id = {slide_id: ref for ref, slide_id, _ in _slide_list(stream, lists.get(_NOTES_PAGES))}
        out: list[SlideText] = []
        chars = 0
        for ref, _slide_id, listed in slides[:max_slides]:
            body = _record_at(stream, persist.get(ref), _SLIDE)
            texts = listed + _texts(stream, *body)
            notes_ref = notes_by_id.get(notes_id) if (notes_id := _notes_id(stream, body)) else None
            notes = _texts(stream, *_record_at(stream, persist.get(notes_ref), _NOTES)) if notes_ref else []
            title = next((t for kind, t in texts if kind in _TITLES), "")
            rest = list(dict.fromkeys(t for kind, t in texts if t != title or kind not in _TITLES))
            out.append(SlideText(title, rest, [t for kind, t in notes if kind == _NOTES_TEXT]))
            chars += sum(len(t) for t in (title, *rest, *out[-1].notes))
            if chars > max_chars:
                break
    except BadFile:
        raise
    except (OSError, ValueError, IndexError, KeyError, struct.error, RecursionError) as error:
        raise BadFile(f"broken presentation: {error}") from None
    return out, len(slides)


Span = tuple[int, int]  # a record's data: (start, end) in the stream


def powerpoint_pictures(data: bytes, max_slides: int, limit: int) -> list[tuple[int, bytes]]:
    """(slide number, image bytes) of the pictures on the first `max_slides` slides of a
    PowerPoint 97-2003 presentation, in order, at most `limit`. A picture shape names a picture
    of the drawing group's store (its `pib` property), whose entry says where its bytes are in the
    Pictures stream. Pictures on masters and layouts (a logo on every slide) are no slide's.
    Metafiles (EMF, WMF, PICT) are left out: Pillow reads them only on Windows."""
    try:
        deck = _deck(data)
        if not deck.pictures:
            return []
        stream = deck.stream
        store = [at for kind, at, _ in _records(stream, *deck.document) if kind == _FBSE]
        found: list[tuple[int, bytes]] = []
        for number, (ref, _id, _listed) in enumerate(
            _slide_list(stream, deck.lists.get(_SLIDES))[:max_slides], start=1
        ):
            body = _record_at(stream, deck.persist.get(ref), _SLIDE)
            for pib in dict.fromkeys(_picture_ids(stream, body)):
                if 0 < pib <= len(store) and (image := _blip(deck.pictures, _delay_offset(stream, store[pib - 1]))):
                    found.append((number, image))
                    if len(found) >= limit:
                        return found
        return found
    except BadFile:
        raise
    except (OSError, ValueError, IndexError, KeyError, struct.error, RecursionError) as error:
        raise BadFile(f"broken presentation: {error}") from None


_FBSE, _FOPT, _PIB = 0xF007, 0xF00B, 0x0104  # a picture store entry; a shape's properties; which picture
# Picture records in the Pictures stream: JPEG, PNG, DIB, TIFF, CMYK JPEG; an odd instance has a
# second 16-byte id before the one-byte tag.
_BITMAPS = {0xF01D, 0xF01E, 0xF01F, 0xF029, 0xF02A}


def _records(stream: bytes, start: int, end: int, depth: int = 0) -> Iterator[tuple[int, int, Span]]:
    """(type, data start, data span) of every record inside a container, nested ones too, in order."""
    for kind, _, (at, stop) in _children(stream, start, end):
        yield kind, at, (at, stop)
        if struct.unpack_from("<H", stream, at - 8)[0] & 0xF == 0xF and depth < 32:
            yield from _records(stream, at, stop, depth + 1)


def _picture_ids(stream: bytes, slide: Span) -> Iterator[int]:
    """The store index (1-based) each picture shape of a slide names, in the slide's order."""
    for kind, at, (_, stop) in _records(stream, *slide):
        if kind != _FOPT:
            continue
        count = struct.unpack_from("<H", stream, at - 8)[0] >> 4
        for n in range(count):
            if at + 6 * (n + 1) > stop:
                break
            opid, value = struct.unpack_from("<HI", stream, at + 6 * n)
            if opid & 0x3FFF == _PIB and opid & 0x4000:  # fBid: the value is a store index
                yield value


def _delay_offset(stream: bytes, entry: int) -> int:
    """Where a store entry's picture is in the Pictures stream (its foDelay)."""
    return int(struct.unpack_from("<I", stream, entry + 28)[0])


def _blip(pictures: bytes, offset: int, end: int | None = None) -> bytes | None:
    """The image bytes of the picture record at `offset` (ending by `end` at the latest); None for
    a metafile or a bad offset."""
    end = len(pictures) if end is None else min(end, len(pictures))
    if offset + 8 > end:
        return None
    head, kind, length = struct.unpack_from("<HHI", pictures, offset)
    if kind not in _BITMAPS:
        return None
    skip = 16 + (16 if (head >> 4) & 1 else 0) + 1  # one or two ids, then the tag
    start = offset + 8 + skip
    return pictures[start : min(offset + 8 + length, end)] or None


def _persist_directory(stream: bytes, edit: int) -> tuple[dict[int, int], int]:
    """Where each persist object is, by id, after the last save (a later save's entries win), and
    the id of the document record."""
    persist: dict[int, int] = {}
    document_ref: int | None = None
    seen: set[int] = set()
    while edit and edit not in seen:
        if len(seen) >= _MAX_EDITS:
            raise BadFile("broken presentation: its saves loop")
        seen.add(edit)
        start, _ = _record_at(stream, edit, _USER_EDIT)
        last_edit, directory, document = struct.unpack_from("<III", stream, start + 8)
        document_ref = document if document_ref is None else document_ref
        at, end = _record_at(stream, directory, _PERSIST_DIRECTORY)
        while at + 4 <= end:
            (entry,) = struct.unpack_from("<I", stream, at)
            first, count = entry & 0xFFFFF, entry >> 20
            offsets = struct.unpack_from(f"<{count}I", stream, at + 4)
            for n, offset in enumerate(offsets):
                persist.setdefault(first + n, offset)
            at += 4 + 4 * count
        edit = last_edit
    if document_ref is None:
        raise BadFile("broken presentation: no save to read")
    return persist, document_ref


def _record_at(stream: bytes, offset: int | None, kind: int) -> Span:
    if offset is None or offset + 8 > len(stream):
        raise BadFile("broken presentation: a record it names is missing")
    _, found, length = struct.unpack_from("<HHI", stream, offset)
    if found != kind:
        raise BadFile(f"broken presentation: record {found:#x} where {kind:#x} belongs")
    return offset + 8, min(offset + 8 + length, len(stream))


def _children(stream: bytes, start: int, end: int) -> Iterator[tuple[int, int, Span]]:
    """(type, instance, data span) of each record directly inside a container's data."""
    at = start
    while at + 8 <= end:
        head, kind, length = struct.unpack_from("<HHI", stream, at)
        yield kind, head >> 4, (at + 8, min(at + 8 + length, end))
        at += 8 + length


def _texts(stream: bytes, start: int, end: int, depth: int = 0) -> list[tuple[int, str]]:
    """(text type, paragraph) of every text atom inside a container, in order, nested ones too."""
    out: list[tuple[int, str]] = []
    kind_of_text = 4  # "other" until a text header says
    for kind, _, (at, stop) in _children(stream, start, end):
        head = struct.unpack_from("<H", stream, at - 8)[0]
        if kind == _TEXT_HEADER and stop - at >= 4:
            kind_of_text = struct.unpack_from("<I", stream, at)[0]
        elif kind in (_TEXT_CHARS, _TEXT_BYTES):
            out += [(kind_of_text, p) for p in _atom_lines(stream, kind, at, stop)]
        elif head & 0xF == 0xF and depth < 32:  # a container
            out += _texts(stream, at, stop, depth + 1)
    return out


def _atom_lines(stream: bytes, kind: int, start: int, end: int) -> list[str]:
    """The paragraphs of a text atom: UTF-16, or one byte a character (the low byte of each)."""
    raw = stream[start:end].decode("utf-16-le" if kind == _TEXT_CHARS else "latin-1", "replace")
    return [words for part in raw.replace("\x0b", " ").split("\r") if (words := " ".join(part.split()))]


def _slide_list(stream: bytes, span: Span | None) -> list[tuple[int, int, list[tuple[int, str]]]]:
    """(persist id, slide id, text listed with it) of each entry of a slide list, in order."""
    entries: list[tuple[int, int, list[tuple[int, str]]]] = []
    if span is None:
        return entries
    kind_of_text = 4
    for kind, _, (at, stop) in _children(stream, *span):
        if kind == _SLIDE_PERSIST and stop - at >= 16:
            ref, _flags, _texts_count, slide_id = struct.unpack_from("<IIiI", stream, at)
            entries.append((ref, slide_id, []))
        elif kind == _TEXT_HEADER and stop - at >= 4:
            kind_of_text = struct.unpack_from("<I", stream, at)[0]
        elif kind in (_TEXT_CHARS, _TEXT_BYTES) and entries:
            entries[-1][2].extend((kind_of_text, p) for p in _atom_lines(stream, kind, at, stop))
    return entries


def _notes_id(stream: bytes, slide: Span) -> int:
    """The id of the notes page a slide's atom names; 0 for none."""
    for kind, _, (at, stop) in _children(stream, *slide):
        if kind == _SLIDE_ATOM and stop - at >= 20:
            return int(struct.unpack_from("<I", stream, at + 16)[0])
    return 0
