"""Office 97-2003 compound files: told apart by their streams, and a Word 97-2003 document's text
read through its piece table (adapters/ole.py), on documents written to the formats'
specifications (tests/office97.py)."""

from __future__ import annotations

import struct

import filetype
import olefile
import pytest

from chatmem.adapters.documents import DocumentReader
from chatmem.adapters.images import guess_binary
from chatmem.adapters.ole import compound_type, word_paragraphs
from chatmem.memory.attachments import BadFile
from chatmem.memory.attachments.filetypes import DOC_MIME, PPT_MIME, XLS_MIME, Sniffed, sniff
from tests.office97 import (
    ROW_END,
    STYLE_HEADING_2,
    STYLE_TITLE,
    compound_file,
    powerpoint_document,
    record,
    word_document,
)

PLAN = [
    # One byte a character (Windows-1252): a heading, a paragraph with a hyperlink field whose
    # result is shown and whose code is not, and a nested field.
    ('Office plan\rThe board approved the \x13 HYPERLINK "https://b" \x14budget\x15 for next year.\r', True),
    ("Page \x13 PAGE \x14\x13 QUOTE \x14seven\x15\x15 of the plan.\r", True),
    # UTF-16: a table of two rows of three cells (one empty), then text no code page holds.
    ("Item\x07Supplier\x07Cost\x07" + ROW_END + "Standing desks\x07\x074,200 €\x07" + ROW_END, False),
    ("Ünïcödé line\x0bbreak, a non\x1ebreaking hyphen, a pic\x01ture and a foot\x02note.\r", False),
]


DECK = [
    ("Budget for the Porto office", ["The standing desks cost 4,200 EUR", "Chairs: 950 EUR"], "Ask Maria first."),
    ("", ["Launch date: 14 March", "Two engineers | spring"], None),
    ("Questions?", [], None),
]
READ = [
    ("Budget for the Porto office", True, 1),
    ("The standing desks cost 4,200 EUR", False, 1),
    ("Chairs: 950 EUR", False, 1),
    ("Ask Maria first.", False, 1),  # the notes page
    ("Slide 2", True, 2),  # no title of its own
    ("Launch date: 14 March", False, 2),
    ("Two engineers | spring", False, 2),
    ("Questions?", True, 3),
]


def test_compound_files_are_told_apart_by_their_streams():
    assert compound_type(compound_file({"1Table": b"x", "WordDocument": b"y"})) == DOC_MIME
    assert compound_type(compound_file({"Workbook": b"x"})) == XLS_MIME
    assert compound_type(compound_file({"Book": b"x"})) == XLS_MIME  # Excel 5 and 95
    assert compound_type(compound_file({"Current User": b"x", "PowerPoint Document": b"y"})) == PPT_MIME
    assert compound_type(compound_file({"__properties_version1.0": b"x"})) is None  # an Outlook message, say
    assert compound_type(word_document(PLAN)[:1500]) is None  # cut short: cannot be opened
    assert compound_type(b"PK\x03\x04 not a compound file") is None


def test_a_word_97_document_is_sniffed_by_its_streams_not_its_first_sector():
    document = word_document(PLAN)
    found = filetype.guess(document[:8192])
    assert found is not None and found.mime == PPT_MIME  # how filetype took it
    assert guess_binary(document) == DOC_MIME
    assert sniff(document, "plan.doc", guess_binary) == Sniffed(DOC_MIME, "document")


def test_powerpoint_97_files_are_no_longer_taken_for_spreadsheets_and_encrypted_ones_say_so():
    # filetype took PowerPoint 97 files for Excel ones: they failed as "broken spreadsheet".
    deck = powerpoint_document(DECK)
    assert sniff(deck, "talk.ppt", guess_binary) == Sniffed(PPT_MIME, "document")
    locked = compound_file({"EncryptionInfo": b"x", "EncryptedPackage": b"y"})  # a .docx with a password
    with pytest.raises(BadFile, match=r"the Office file is encrypted \(password protected\)"):
        sniff(locked, "plan.docx", guess_binary)


def test_a_word_97_documents_text_reads_as_shown_with_its_headings_and_rows():
    styled = word_document(PLAN, styles={0: STYLE_TITLE, 2: STYLE_HEADING_2})
    assert word_paragraphs(styled, 10_000) == [
        ("Office plan", 1),  # styled Title
        ("The board approved the budget for next year.", 0),
        ("Page seven of the plan.", 2),  # Heading 2
        ("Item | Supplier | Cost", 0),
        ("Standing desks | 4,200 €", 0),  # an empty cell; the row ends where its properties say
        ("Ünïcödé line break, a non-breaking hyphen, a picture and a footnote.", 0),
    ]
    blocks, meta = DocumentReader(max_pages=5, max_chars=10_000).read(styled, DOC_MIME)
    assert [(b.text, b.heading, b.level) for b in blocks][:3] == [
        ("Office plan", True, 1),
        ("The board approved the budget for next year.", False, 0),
        ("Page seven of the plan.", True, 2),
    ]
    assert meta == {}


def test_a_word_97_document_without_paragraph_properties_still_reads():
    # Its text is all there; a mark right after a cell's then ends the row, so the empty cell
    # splits its row.
    assert word_paragraphs(word_document(PLAN, properties=False), 10_000)[3:5] == [
        ("Item | Supplier | Cost", 0),
        ("Standing desks", 0),
    ]


def test_a_long_word_97_document_is_read_up_to_the_limit():
    long = word_document([("A paragraph of some forty characters.\r" * 500, True)])
    blocks, _ = DocumentReader(max_pages=5, max_chars=1_000).read(long, DOC_MIME)
    assert 20 <= len(blocks) <= 60


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (word_document(PLAN, encrypted=True), r"the Word document is encrypted \(password protected\)"),
        (word_document(PLAN, n_fib=0x0065), "a Word 6 or Word 95 document"),
        (word_document(PLAN, modifier_size=-3), "negative size"),  # it looped for ever
        (compound_file({"1Table": b"", "WordDocument": b"\x00" * 64}), "does not begin a Word file"),
        (word_document(PLAN)[:2600], "broken Word document"),
        (compound_file({"WordDocument": word_document(PLAN)[:10]}), "broken Word document"),
        (compound_file({"1Table": b"\x03", "WordDocument": b"\xec\xa5\xc1\x00" + bytes(1020)}), "broken Word"),
    ],
    ids=["encrypted", "word-95", "negative-modifier", "not-word", "cut-short", "no-table-stream", "no-piece-table"],
)
def test_a_word_97_document_that_cannot_be_read_says_why(document, reason):
    with pytest.raises(BadFile, match=reason):
        DocumentReader(max_pages=5, max_chars=10_000).read(document, DOC_MIME)


def slides_of(deck: bytes, max_pages: int = 5) -> tuple[list[tuple[str, bool, int | None]], dict]:
    blocks, meta = DocumentReader(max_pages=max_pages, max_chars=10_000).read(deck, PPT_MIME)
    return [(b.text, b.heading, b.page) for b in blocks], meta


@pytest.mark.parametrize("listed", [0, 1, 3], ids=["in-shapes", "mixed", "in-the-slide-list"])
def test_a_powerpoint_97_presentation_is_read_slide_by_slide_in_the_lists_order(listed):
    # Slide records are written in reverse: the document's slide list gives the order. Text in
    # the list (PowerPoint 97-2003's placeholders) and in shapes (later versions) reads alike.
    assert slides_of(powerpoint_document(DECK, listed=listed)) == (READ, {"slides": 3})


def test_a_powerpoint_97_presentation_is_read_as_last_saved():
    read, _ = slides_of(powerpoint_document(DECK, draft="Draft budget"))
    assert read == READ  # the earlier save's title stays in the file, unread
    first, meta = slides_of(powerpoint_document(DECK), max_pages=1)
    assert first == READ[:4] and meta == {"slides": 3, "slides_read": 1}


def test_a_powerpoint_97_presentation_that_cannot_be_read_says_why():
    whole = powerpoint_document(DECK)
    stream_only = compound_file({"PowerPoint Document": record(0x03E8, b"", container=True)})
    # The last save names itself as the save before it.
    with olefile.OleFileIO(whole) as container:
        current, stream = (container.openstream(n).read() for n in ("Current User", "PowerPoint Document"))
    edit = struct.unpack_from("<I", current, 16)[0]
    looped = bytearray(stream)
    struct.pack_into("<I", looped, edit + 8 + 8, edit)
    looping = compound_file({"Current User": current, "PowerPoint Document": bytes(looped)})
    assert slides_of(looping) == (READ, {"slides": 3})  # each save is read once
    for deck, reason in [
        (powerpoint_document(DECK, encrypted=True), r"the presentation is encrypted \(password protected\)"),
        (stream_only, "broken presentation"),  # no Current User stream
        (whole[:4000], "broken presentation"),
    ]:
        with pytest.raises(BadFile, match=reason):
            slides_of(deck)


def test_the_pictures_on_a_powerpoint_97_slide_are_found_through_its_store():
    store = [("png", b"PNG one"), ("jpeg", b"JPEG two"), ("emf", b"EMF three"), ("dib", b"DIB four")]
    shown = {0: [2, 1, 2], 1: [3], 2: [4, 9]}  # slide 1 names the JPEG twice; 9 is no entry
    deck = powerpoint_document(DECK, pictures=store, shown=shown)
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    assert reader.pictures(deck, PPT_MIME, 20) == [(1, b"JPEG two"), (1, b"PNG one"), (3, b"DIB four")]
    assert reader.pictures(deck, PPT_MIME, 2) == [(1, b"JPEG two"), (1, b"PNG one")]
    assert DocumentReader(max_pages=1, max_chars=10_000).pictures(deck, PPT_MIME, 20)[-1] == (1, b"PNG one")
    assert reader.pictures(powerpoint_document(DECK), PPT_MIME, 20) == []  # no Pictures stream
    # Store entries that point past the pictures' records (into the zeros the writer pads the
    # stream with, or past its end) are skipped, not read from elsewhere.
    with olefile.OleFileIO(deck) as container:
        streams = {n: container.openstream(n).read() for n in ("Pictures", "Current User", "PowerPoint Document")}
    cut = compound_file({**streams, "Pictures": streams["Pictures"][:32]})  # the first record alone
    assert reader.pictures(cut, PPT_MIME, 20) == [(1, b"PNG one")]


def test_the_pictures_of_a_word_97_document_are_read_from_its_data_stream():
    pictures = [
        ("png", b"PNG one"),
        ("jpeg", b"JPEG two"),  # carries its file's name
        ("emf", b"EMF three"),  # a metafile: left out
        ("form", b"a form field's data, no records"),
        ("dib", b"DIB four"),
    ]
    document = word_document(PLAN, pictures=pictures)
    reader = DocumentReader(max_pages=5, max_chars=10_000)
    assert reader.pictures(document, DOC_MIME, 20) == [(None, b"PNG one"), (None, b"JPEG two"), (None, b"DIB four")]
    assert reader.pictures(document, DOC_MIME, 1) == [(None, b"PNG one")]
    assert reader.pictures(word_document(PLAN), DOC_MIME, 20) == []  # no Data stream
    assert [text for text, _ in word_paragraphs(document, 10_000)] == [
        text for text, _ in word_paragraphs(word_document(PLAN), 10_000)
    ]  # the text is the same
    # The walk ends at anything that is not a picture's header; what came before it stays found.
    with olefile.OleFileIO(document) as container:
        streams = {n: container.openstream(n).read() for n in ("Data", "1Table", "WordDocument")}
    first = struct.unpack_from("<I", streams["Data"], 0)[0]
    broken = compound_file({**streams, "Data": streams["Data"][:first] + b"\xff" * 80})
    assert reader.pictures(broken, DOC_MIME, 20) == [(None, b"PNG one")]
