"""Office 97-2003 files are compound files (OLE2): a small file system whose streams name what
the file is. This module tells them apart by those streams (`compound_type`), and reads a Word
97-2003 document's text (`word_paragraphs`), which no maintained library does in pure Python:
olefile opens the container, and the text is found through the document's piece table as
[MS-DOC] lays it out (File Information Block, then the Clx in the table stream)."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator

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
_CLX_INDEX = 33  # fcClx is the 34th (fc, lcb) pair of FibRgFcLcb97
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


def word_paragraphs(data: bytes, max_chars: int) -> list[str]:
    """The main text of a Word 97-2003 document (not its headers, footnotes or text boxes), as
    paragraphs (a table row's cells joined by " | "), up to about `max_chars`. BadFile for an
    encrypted, older or broken one. Its title is not read: olefile's property-set parser loops
    over whatever count a broken file declares."""
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
            text = _main_text(document, table, max_chars)
    except BadFile:
        raise
    except (OSError, ValueError, IndexError, KeyError, struct.error, RecursionError) as error:
        raise BadFile(f"broken Word document: {error}") from None
    return list(_paragraphs(_without_fields(text)))


def _main_text(document: bytes, table: bytes, max_chars: int) -> str:
    """The first ccpText characters of the document, piece by piece (each piece is either
    Windows-1252, one byte a character, or UTF-16), at most about 2 × `max_chars` of them."""
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
        at += 3 + struct.unpack_from("<h", clx, at + 1)[0]
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
    for n in range(pieces):
        start, end = max(cps[n], 0), min(cps[n + 1], wanted)
        if start >= wanted:
            break
        if end <= start:
            continue
        (fc,) = struct.unpack_from("<I", plc, 4 * (pieces + 1) + 8 * n + 2)
        if fc & 0x40000000:  # compressed: one byte a character, at half the offset
            offset = (fc & 0x3FFFFFFF) // 2
            out.append(document[offset : offset + end - start].decode("cp1252", "replace"))
        else:
            out.append(document[fc : fc + 2 * (end - start)].decode("utf-16-le", "replace"))
    return "".join(out)


def _without_fields(text: str) -> str:
    """The text as shown: a field's instruction left out, its result kept (nested fields too)."""
    out: list[str] = []
    hidden = 0  # depth of open fields whose instruction is being read
    stack: list[bool] = []  # for each open field: still in its instruction
    for ch in text:
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
    return "".join(out)


def _paragraphs(text: str) -> Iterator[str]:
    """Paragraphs, and table rows with their cells joined by " | ". A cell ends with a cell
    mark, a row with one more mark; an empty cell therefore ends its row early (Word's table
    properties, which say where a row ends, are not read)."""
    cells: list[str] = []
    after_cell = False  # the last mark was a cell's
    for found in _TOKENS.finditer(text.translate(_CHARACTERS)):
        words = " ".join("".join(c for c in found[1] if c >= " " or c == "\t").split())
        if found[2] == _CELL:
            if words:
                cells.append(words)
            elif after_cell and cells:  # the row's own mark
                yield " | ".join(dict.fromkeys(cells))
                cells = []
            after_cell = True
            continue
        after_cell = False
        if words and cells:  # a cell's earlier paragraph: part of the cell
            cells.append(words)
        elif words:
            yield words
    if cells:
        yield " | ".join(dict.fromkeys(cells))
