"""Office 97-2003 compound files: told apart by their streams, and a Word 97-2003 document's text
read through its piece table (adapters/ole.py), on documents written to the formats'
specifications (tests/word97.py)."""

from __future__ import annotations

import filetype
import pytest

from chatmem.adapters.documents import DocumentReader
from chatmem.adapters.images import guess_binary
from chatmem.adapters.ole import compound_type, word_paragraphs
from chatmem.memory.attachments import BadFile
from chatmem.memory.attachments.filetypes import DOC_MIME, PPT_MIME, XLS_MIME, Sniffed, sniff
from tests.word97 import compound_file, word_document

PLAN = [
    # One byte a character (Windows-1252): a heading, a paragraph with a hyperlink field whose
    # result is shown and whose code is not, and a nested field.
    ('Office plan\rThe board approved the \x13 HYPERLINK "https://b" \x14budget\x15 for next year.\r', True),
    ("Page \x13 PAGE \x14\x13 QUOTE \x14seven\x15\x15 of the plan.\r", True),
    # UTF-16: a table of two rows of three cells, then text no code page holds.
    ("Item\x07Supplier\x07Cost\x07\x07Standing desks\x07Deskworks\x074,200 €\x07\x07", False),
    ("Ünïcödé line\x0bbreak, a non\x1ebreaking hyphen, a pic\x01ture and a foot\x02note.\r", False),
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


def test_powerpoint_97_and_encrypted_office_files_are_refused_for_what_they_are():
    # filetype took PowerPoint 97 files for Excel ones: they failed as "broken spreadsheet".
    deck = compound_file({"Current User": b"x", "PowerPoint Document": b"y"})
    with pytest.raises(BadFile, match="files of type application/vnd.ms-powerpoint are not understood"):
        sniff(deck, "talk.ppt", guess_binary)
    locked = compound_file({"EncryptionInfo": b"x", "EncryptedPackage": b"y"})  # a .docx with a password
    with pytest.raises(BadFile, match=r"the Office file is encrypted \(password protected\)"):
        sniff(locked, "plan.docx", guess_binary)


def test_a_word_97_documents_text_reads_as_shown():
    paragraphs = word_paragraphs(word_document(PLAN), 10_000)
    assert paragraphs == [
        "Office plan",
        "The board approved the budget for next year.",
        "Page seven of the plan.",
        "Item | Supplier | Cost",
        "Standing desks | Deskworks | 4,200 €",
        "Ünïcödé line break, a non-breaking hyphen, a picture and a footnote.",
    ]
    blocks, meta = DocumentReader(max_pages=5, max_chars=10_000).read(word_document(PLAN), DOC_MIME)
    assert [b.text for b in blocks] == paragraphs and meta == {}


def test_a_long_word_97_document_is_read_up_to_the_limit():
    long = word_document([("A paragraph of some forty characters.\r" * 500, True)])
    blocks, _ = DocumentReader(max_pages=5, max_chars=1_000).read(long, DOC_MIME)
    assert 20 <= len(blocks) <= 60


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (word_document(PLAN, encrypted=True), r"the Word document is encrypted \(password protected\)"),
        (word_document(PLAN, n_fib=0x0065), "a Word 6 or Word 95 document"),
        (compound_file({"1Table": b"", "WordDocument": b"\x00" * 64}), "does not begin a Word file"),
        (word_document(PLAN)[:2600], "broken Word document"),
        (compound_file({"WordDocument": word_document(PLAN)[:10]}), "broken Word document"),
        (compound_file({"1Table": b"\x03", "WordDocument": b"\xec\xa5\xc1\x00" + bytes(1020)}), "broken Word"),
    ],
    ids=["encrypted", "word-95", "not-word", "cut-short", "no-table-stream", "no-piece-table"],
)
def test_a_word_97_document_that_cannot_be_read_says_why(document, reason):
    with pytest.raises(BadFile, match=reason):
        DocumentReader(max_pages=5, max_chars=10_000).read(document, DOC_MIME)
