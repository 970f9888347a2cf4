"""Word 97-2003 documents for the tests, written from the formats' specifications: a compound file
([MS-CFB], version 3, every stream in regular sectors) holding a WordDocument stream (its File
Information Block, then the text) and a 1Table stream (the piece table), as [MS-DOC] lays them
out. No Python library writes either format; the reader was also checked against documents saved
by Word itself (docs/attachments.md)."""

from __future__ import annotations

import struct

SECTOR = 512
FREE, END, FAT_SECTOR, NO_STREAM = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF
MINI_CUTOFF = 4096  # smaller streams would belong in the mini stream: every stream is padded past it


def compound_file(streams: dict[str, bytes]) -> bytes:
    """A compound file with these streams under its root, in the order given (which must be the
    order [MS-CFB] sorts names in: shorter first, then by upper-case letters)."""
    padded = {name: data.ljust(MINI_CUTOFF, b"\0") for name, data in streams.items()}
    chains: list[tuple[int, int]] = []  # (first sector, sectors) of each stream
    next_free = 2  # sector 0 holds the FAT, sector 1 the directory
    for data in padded.values():
        count = -(-len(data) // SECTOR)
        chains.append((next_free, count))
        next_free += count
    if next_free > SECTOR // 4:
        raise ValueError("one FAT sector is enough for the tests' files")
    fat = [FAT_SECTOR, END] + [FREE] * (SECTOR // 4 - 2)
    for first, count in chains:
        for sector in range(first, first + count):
            fat[sector] = sector + 1 if sector < first + count - 1 else END
    entries = [_entry("Root Entry", 5, child=1 if streams else NO_STREAM, start=END, size=0)]
    for n, ((name, data), (first, _)) in enumerate(zip(padded.items(), chains, strict=True), start=1):
        right = n + 1 if n < len(padded) else NO_STREAM
        entries.append(_entry(name, 2, right=right, start=first, size=len(data)))
    directory = b"".join(entries).ljust(SECTOR, b"\0")  # unused entries are zeros... of type 0
    header = (
        bytes.fromhex("d0cf11e0a1b11ae1")
        + bytes(16)
        + struct.pack("<HHHHH", 0x3E, 3, 0xFFFE, 9, 6)
        + bytes(6)
        + struct.pack("<IIIIIIIII", 0, 1, 1, 0, MINI_CUTOFF, END, 0, END, 0)
        + struct.pack("<109I", 0, *([FREE] * 108))
    )
    body = b"".join(data.ljust(count * SECTOR, b"\0") for data, (_, count) in zip(padded.values(), chains, strict=True))
    return header + struct.pack(f"<{SECTOR // 4}I", *fat) + directory + body


def _entry(name: str, kind: int, *, child: int = NO_STREAM, right: int = NO_STREAM, start: int, size: int) -> bytes:
    encoded = (name + "\0").encode("utf-16-le")
    return (
        encoded.ljust(64, b"\0")
        + struct.pack("<HBB", len(encoded), kind, 1)
        + struct.pack("<III", NO_STREAM, right, child)
        + bytes(16 + 4 + 8 + 8)
        + struct.pack("<IQ", start, size)
    )


FIB_SIZE = 0x9A + 93 * 8 + 2
TEXT_AT = 1024  # where the text's pieces start in the WordDocument stream


def word_document(pieces: list[tuple[str, bool]], *, encrypted: bool = False, n_fib: int = 0x00C1) -> bytes:
    """A Word 97-2003 document whose main text is `pieces`, each (text, compressed): a compressed
    piece is stored one byte a character (Windows-1252), the others in UTF-16. Its text uses Word's
    marks: "\\r" ends a paragraph, "\\x07" a table cell (one more ends the row), "\\x13", "\\x14" and
    "\\x15" open a field, separate its code from its result and close it."""
    text = b""
    cps, descriptors = [0], []
    for chars, compressed in pieces:
        at = TEXT_AT + len(text)
        if compressed:
            text += chars.encode("cp1252")
            descriptors.append(struct.pack("<HIH", 0, (at * 2) | 0x40000000, 0))
        else:
            text += chars.encode("utf-16-le")
            descriptors.append(struct.pack("<HIH", 0, at, 0))
        cps.append(cps[-1] + len(chars))
    plc = struct.pack(f"<{len(cps)}I", *cps) + b"".join(descriptors)
    # A property modifier before the piece table, which a reader must step over.
    clx = b"\x01" + struct.pack("<h", 2) + b"\x00\x00" + b"\x02" + struct.pack("<I", len(plc)) + plc
    flags = 0x0200 | (0x0100 if encrypted else 0)  # the table stream is 1Table
    fib = bytearray(FIB_SIZE)
    struct.pack_into("<HHHHH", fib, 0, 0xA5EC, n_fib, 0, 0x0409, 0)
    struct.pack_into("<H", fib, 0x0A, flags)
    struct.pack_into("<H", fib, 0x20, 14)  # csw: FibRgW97's 14 words
    struct.pack_into("<H", fib, 0x3E, 22)  # cslw: FibRgLw97's 22 longs
    struct.pack_into("<i", fib, 0x40 + 3 * 4, cps[-1])  # ccpText
    struct.pack_into("<H", fib, 0x98, 93)  # cbRgFcLcb: FibRgFcLcb97's 93 pairs
    struct.pack_into("<II", fib, 0x9A + 33 * 8, 0, len(clx))  # fcClx, lcbClx
    document = bytes(fib).ljust(TEXT_AT, b"\0") + text
    return compound_file({"1Table": clx, "WordDocument": document})
