"""Office 97-2003 files for the tests, written from the formats' specifications: a compound file
([MS-CFB], version 3, every stream in regular sectors) holding a Word 97-2003 document (a
WordDocument stream with its File Information Block and text, a 1Table stream with the piece
table, [MS-DOC]) or a PowerPoint 97-2003 presentation (a PowerPoint Document stream of records
and a Current User stream, [MS-PPT]). No Python library writes these formats; the readers were
also checked against files saved by Office itself (docs/attachments.md)."""

from __future__ import annotations

import struct

SECTOR = 512
FREE, END, FAT_SECTOR, NO_STREAM = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF
MINI_CUTOFF = 4096  # smaller streams would belong in the mini stream: every stream is padded past it


def compound_file(streams: dict[str, bytes]) -> bytes:
    """A compound file with these streams under its root, in the order given (which must be the
    order [MS-CFB] sorts names in: shorter first, then by upper-case letters). The FAT takes the
    first sectors (up to the 109 the header lists), the directory the next one."""
    padded = {name: data.ljust(MINI_CUTOFF, b"\0") for name, data in streams.items()}
    counts = [-(-len(data) // SECTOR) for data in padded.values()]
    per_fat = SECTOR // 4
    fats = 1
    while fats * per_fat < fats + 1 + sum(counts):
        fats += 1
    if fats > 109:
        raise ValueError("the header's list of FAT sectors is enough for the tests' files")
    chains: list[tuple[int, int]] = []  # (first sector, sectors) of each stream
    next_free = fats + 1
    for count in counts:
        chains.append((next_free, count))
        next_free += count
    fat = [FAT_SECTOR] * fats + [END] + [FREE] * (fats * per_fat - fats - 1)
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
        + struct.pack("<IIIIIIIII", 0, fats, fats, 0, MINI_CUTOFF, END, 0, END, 0)
        + struct.pack("<109I", *range(fats), *([FREE] * (109 - fats)))
    )
    body = b"".join(data.ljust(count * SECTOR, b"\0") for data, count in zip(padded.values(), counts, strict=True))
    return header + struct.pack(f"<{len(fat)}I", *fat) + directory + body


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
ROW_END = "\ue000"  # in a piece's text: the mark that ends a table row (written as a cell mark)
# The document's style sheet, by style index: (built-in style id, name).
STYLES = [(0, "Normal"), (1, "heading 1"), (2, "heading 2"), (62, "Title")]
STYLE_NORMAL, STYLE_HEADING_1, STYLE_HEADING_2, STYLE_TITLE = range(4)


def word_document(
    pieces: list[tuple[str, bool]],
    *,
    styles: dict[int, int] | None = None,
    properties: bool = True,
    encrypted: bool = False,
    n_fib: int = 0x00C1,
    modifier_size: int = 2,
    pictures: list[tuple[str, bytes]] | None = None,
) -> bytes:
    """A Word 97-2003 document whose main text is `pieces`, each (text, compressed): a compressed
    piece is stored one byte a character (Windows-1252), the others in UTF-16. Its text uses Word's
    marks: "\\r" ends a paragraph, "\\x07" a table cell and ROW_END a row, "\\x13", "\\x14" and
    "\\x15" open a field, separate its code from its result and close it. `styles` gives the
    paragraphs (counted by their marks, from 0) their style index in STYLES; with `properties`
    off the file has no style sheet and no paragraph properties. `pictures` ((kind, bytes); kind
    "form" for a form field's data, which is no picture) go to the Data stream as Word keeps
    inline pictures."""
    text = b""
    cps, descriptors = [0], []
    marks: list[tuple[int, int, bool]] = []  # (offset after the mark, style, ends a row)
    for chars, compressed in pieces:
        at = TEXT_AT + len(text)
        width = 1 if compressed else 2
        written = chars.replace(ROW_END, "\x07")
        text += written.encode("cp1252") if compressed else written.encode("utf-16-le")
        descriptors.append(struct.pack("<HIH", 0, (at * 2) | 0x40000000 if compressed else at, 0))
        cps.append(cps[-1] + len(chars))
        for n, ch in enumerate(chars):
            if ch in "\r\x07" + ROW_END:
                marks.append((at + width * (n + 1), (styles or {}).get(len(marks), STYLE_NORMAL), ch == ROW_END))
    plc = struct.pack(f"<{len(cps)}I", *cps) + b"".join(descriptors)
    # A property modifier before the piece table, which a reader must step over.
    clx = b"\x01" + struct.pack("<h", modifier_size) + b"\x00\x00" + b"\x02" + struct.pack("<I", len(plc)) + plc
    table, pairs = clx, {33: (0, len(clx))}  # fcClx
    document = bytearray(FIB_SIZE)
    document = bytes(document).ljust(TEXT_AT, b"\0") + text
    if properties:
        sheet = _style_sheet()
        pairs[1] = (len(table), len(sheet))  # fcStshf
        table += sheet
        # Pages of paragraph properties, 20 paragraphs a page, indexed by where each page starts.
        groups = [marks[n : n + 20] for n in range(0, len(marks), 20)]
        firsts = [TEXT_AT] + [group[-1][0] for group in groups[:-1]]
        numbers = []
        for first, group in zip(firsts, groups, strict=True):
            page_at = -(-len(document) // 512) * 512
            document = document.ljust(page_at, b"\0") + _papx_page(first, group)
            numbers.append(page_at // 512)
        index = struct.pack(f"<{2 * len(groups) + 1}I", *firsts, marks[-1][0], *numbers) if marks else b""
        pairs[13] = (len(table), len(index))  # fcPlcfBtePapx
        table += index
    fib = bytearray(document[:FIB_SIZE])
    flags = 0x0200 | (0x0100 if encrypted else 0)  # the table stream is 1Table
    struct.pack_into("<HHHHH", fib, 0, 0xA5EC, n_fib, 0, 0x0409, 0)
    struct.pack_into("<H", fib, 0x0A, flags)
    struct.pack_into("<H", fib, 0x20, 14)  # csw: FibRgW97's 14 words
    struct.pack_into("<H", fib, 0x3E, 22)  # cslw: FibRgLw97's 22 longs
    struct.pack_into("<i", fib, 0x40 + 3 * 4, cps[-1])  # ccpText
    struct.pack_into("<H", fib, 0x98, 93)  # cbRgFcLcb: FibRgFcLcb97's 93 pairs
    for n, (fc, lcb) in pairs.items():
        struct.pack_into("<II", fib, 0x9A + n * 8, fc, lcb)
    streams = {"Data": word_picture_data(pictures)} if pictures else {}
    return compound_file({**streams, "1Table": table, "WordDocument": bytes(fib) + document[FIB_SIZE:]})


def word_picture_data(pictures: list[tuple[str, bytes]]) -> bytes:
    """A Word document's Data stream: each picture a PICFAndOfficeArtData ([MS-DOC] 2.9.192): a
    68-byte header (its size, the header's size, the mapping mode: a shape, or a named picture
    whose name follows), the picture's shape, then a store entry with the picture's record in it."""
    data = b""
    for n, (kind, image) in enumerate(pictures):
        named = n % 2 == 1  # every other picture carries its file's name, as a pasted file does
        if kind == "form":  # a form field's data: the same header, then no records
            body = image
            mode = 0x64
        else:
            rec_type, instance, bt = BLIPS[kind]
            blip = record(rec_type, bytes(16) + (bytes(34) if kind == "emf" else b"\xff") + image, instance=instance)
            entry = struct.pack("<BB16sHIII4B", bt, bt, bytes(16), 0xFF, len(blip), 1, 0, 0, 0, 0, 0)
            shape = record(SP, record(0xF00A, struct.pack("<II", 1025 + n, 0xA00)), container=True)
            body = (b"\x08picture." if named else b"") + shape + record(FBSE, entry + blip, instance=bt)
            mode = 0x66 if named else 0x64
        size = 0x44 + len(body)
        data += (struct.pack("<IHHHHH", size, 0x44, mode, 0, 0, 0)).ljust(0x44, b"\0") + body
    return data


def _style_sheet() -> bytes:
    """STSH: its header (the count of styles, their base's size of 10 bytes), then each style:
    its base (the built-in id in the low 12 bits of its first word) and its name."""
    header = struct.pack("<HH", len(STYLES), 10) + bytes(14)
    out = struct.pack("<H", len(header)) + header
    for sti, name in STYLES:
        std = struct.pack("<H", sti) + bytes(8) + struct.pack("<H", len(name)) + name.encode("utf-16-le") + bytes(2)
        out += struct.pack("<H", len(std)) + std
    return out


def _papx_page(first: int, marks: list[tuple[int, int, bool]]) -> bytes:
    """One 512-byte page of paragraph properties: each paragraph's run (from the end of the one
    before to the end of its mark) with its style and, for a row's mark, sprmPFTtp = 1."""
    count = len(marks)
    page = bytearray(512)
    bounds = [first] + [end for end, _, _ in marks]
    struct.pack_into(f"<{count + 1}I", page, 0, *bounds)
    free = 511
    for n, (_, style, row_end) in enumerate(marks):
        body = struct.pack("<H", style) + (struct.pack("<HB", 0x2417, 1) if row_end else b"")
        entry = bytes([(len(body) + 1) // 2]) + body if len(body) % 2 else b"\x00" + bytes([len(body) // 2]) + body
        free = (free - len(entry)) & ~1
        if free < 4 * (count + 1) + 13 * count:
            raise ValueError("the tests' documents fit one page of paragraph properties")
        page[free : free + len(entry)] = entry
        page[4 * (count + 1) + 13 * n] = free // 2
    page[511] = count
    return bytes(page)


# --- PowerPoint 97-2003 ----------------------------------------------------------------------------
DOCUMENT, SLIDE, SLIDE_ATOM, NOTES, NOTES_ATOM = 0x03E8, 0x03EE, 0x03EF, 0x03F0, 0x03F1
SLIDE_LIST, SLIDE_PERSIST, USER_EDIT, PERSIST_DIRECTORY = 0x0FF0, 0x03F3, 0x0FF5, 0x1772
TEXT_HEADER, TEXT_CHARS, TEXT_BYTES, CURRENT_USER = 0x0F9F, 0x0FA0, 0x0FA8, 0x0FF6
# A shape's text sits in a drawing: PPDrawing > DgContainer > SpgrContainer > SpContainer >
# ClientTextbox, all containers.
DRAWING = (0x040C, 0xF002, 0xF003, 0xF004, 0xF00D)
TITLE, BODY, NOTES_TEXT = 0, 1, 2


def record(kind: int, data: bytes = b"", *, instance: int = 0, container: bool = False) -> bytes:
    return struct.pack("<HHI", (instance << 4) | (0xF if container else 0), kind, len(data)) + data


def _text(kind: int, text: str, one_byte: bool) -> bytes:
    atom = record(TEXT_BYTES, text.encode("latin-1")) if one_byte else record(TEXT_CHARS, text.encode("utf-16-le"))
    return record(TEXT_HEADER, struct.pack("<I", kind)) + atom


def _drawn(texts: bytes, shapes: bytes = b"") -> bytes:
    """A slide's drawing: one shape holding `texts`, then `shapes` (picture shapes) beside it."""
    for kind in reversed(DRAWING[3:]):
        texts = record(kind, texts, container=True)
    texts += shapes
    for kind in reversed(DRAWING[:3]):
        texts = record(kind, texts, container=True)
    return texts


# Pictures: the document's drawing group holds a store of entries (OfficeArtFBSE), each saying
# where a picture's record is in the Pictures stream; a picture shape names its entry (pib).
DRAWING_GROUP, DGG, BSTORE, FBSE, FOPT, SP = 0x040B, 0xF000, 0xF001, 0xF007, 0xF00B, 0xF004
BLIPS = {"png": (0xF01E, 0x6E0, 6), "jpeg": (0xF01D, 0x46A, 5), "dib": (0xF01F, 0x7A8, 7), "emf": (0xF01A, 0x3D4, 2)}


def _picture_store(pictures: list[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """The drawing group record and the Pictures stream for `pictures` ((kind, bytes), in store
    order). A metafile's record has no tag byte, and holds its own header first."""
    stream, entries = b"", b""
    for kind, image in pictures:
        rec_type, instance, bt = BLIPS[kind]
        body = bytes(16) + (bytes(34) if kind == "emf" else b"\xff") + image
        entries += record(
            FBSE,
            struct.pack("<BB16sHIII4B", bt, bt, bytes(16), 0xFF, len(body) + 8, 1, len(stream), 0, 0, 0, 0),
            instance=bt,
        )
        stream += record(rec_type, body, instance=instance)
    group = record(
        DRAWING_GROUP,
        record(DGG, record(BSTORE, entries, instance=len(pictures), container=True), container=True),
        container=True,
    )
    return group, stream


def picture_shape(pib: int) -> bytes:
    return record(SP, record(FOPT, struct.pack("<HI", 0x4000 | 0x0104, pib), instance=1), container=True)


Slide = tuple[str, list[str], str | None]  # title, paragraphs of the body, notes


def powerpoint_document(
    slides: list[Slide],
    *,
    listed: int = 0,
    encrypted: bool = False,
    draft: str | None = None,
    pictures: list[tuple[str, bytes]] | None = None,
    shown: dict[int, list[int]] | None = None,
) -> bytes:
    """A presentation of `slides`. The first `listed` slides keep their text in the document's
    slide list, as PowerPoint 97-2003 saved placeholders; the others in their shapes, as later
    versions save. Slide records are written in the stream in reverse order, so only the slide
    list gives the order. With `draft`, the first slide's title was `draft` in an earlier save,
    whose record stays in the stream: the last save's persist directory must win. `pictures`
    ((kind, bytes)) are the store; `shown` gives each slide's picture shapes (1-based store
    indexes, by slide index)."""
    ids = {"document": 1, **{f"slide{n}": 2 + n for n in range(len(slides))}}
    notes = [n for n, (_, _, note) in enumerate(slides) if note]
    ids.update({f"notes{n}": 2 + len(slides) + i for i, n in enumerate(notes)})
    slide_list, notes_list = b"", b""
    for n, (title, body, _) in enumerate(slides):
        slide_list += record(SLIDE_PERSIST, struct.pack("<IIiII", ids[f"slide{n}"], 0, 2, 256 + n, 0))
        if n < listed:
            slide_list += _text(TITLE, title, True) + _text(BODY, "\r".join(body), False)
    for n in notes:
        notes_list += record(SLIDE_PERSIST, struct.pack("<IIiII", ids[f"notes{n}"], 0, 1, 512 + n, 0))
    group, picture_stream = _picture_store(pictures) if pictures else (b"", b"")
    document = record(
        DOCUMENT,
        group
        + record(SLIDE_LIST, slide_list, instance=0, container=True)
        + record(SLIDE_LIST, notes_list, instance=2, container=True),
        container=True,
    )

    def slide_record(n: int, title: str, body: list[str]) -> bytes:
        atom = record(SLIDE_ATOM, struct.pack("<I8sIIHH", 0, bytes(8), 0, 512 + n if n in notes else 0, 0, 0))
        drawn = b"" if n < listed else _text(TITLE, title, False) + _text(BODY, "\r".join(body), True)
        shapes = b"".join(picture_shape(pib) for pib in (shown or {}).get(n, []))
        return record(SLIDE, atom + _drawn(drawn, shapes), container=True)

    stream = document
    offsets = {"document": 0}
    earlier_edit = 0
    if draft is not None:  # an earlier save: its own slide record, directory and edit
        offsets_then = len(stream)
        stream += slide_record(0, draft, slides[0][1])
        directory_then = len(stream)
        stream += record(PERSIST_DIRECTORY, struct.pack("<II", (1 << 20) | ids["slide0"], offsets_then))
        earlier_edit = len(stream)
        stream += record(USER_EDIT, struct.pack("<IHBBIIIIHH", 256, 0, 0, 3, 0, directory_then, 1, 99, 1, 0))
    for n in reversed(range(len(slides))):
        offsets[f"slide{n}"] = len(stream)
        stream += slide_record(n, *slides[n][:2])
    for n in notes:
        offsets[f"notes{n}"] = len(stream)
        page = record(NOTES_ATOM, struct.pack("<IHH", 256 + n, 0, 0)) + _drawn(
            _text(NOTES_TEXT, slides[n][2] or "", False)
        )
        stream += record(NOTES, page, container=True)
    directory = len(stream)
    entries = [offsets[name] for name in sorted(ids, key=ids.get)]
    stream += record(PERSIST_DIRECTORY, struct.pack(f"<I{len(entries)}I", (len(entries) << 20) | 1, *entries))
    edit = len(stream)
    stream += record(USER_EDIT, struct.pack("<IHBBIIIIHH", 256, 0, 0, 3, earlier_edit, directory, 1, 99, 1, 0))
    token = 0xF3D1C4DF if encrypted else 0xE391C05F
    current = record(CURRENT_USER, struct.pack("<IIIHHBBH", 20, token, edit, 0, 0x03F4, 3, 0, 0))
    streams = {"Pictures": picture_stream} if pictures else {}
    return compound_file({**streams, "Current User": current, "PowerPoint Document": stream})
