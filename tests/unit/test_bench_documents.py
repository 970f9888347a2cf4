"""`chatmem bench documents` compares formats on the same content: each format of a kind must read
to the same blocks, or the figures would compare different work. It also shows that an
OpenDocument file reads as its Office kin does."""

from __future__ import annotations

import io

from rich.console import Console

from chatmem.bench.documents import run


def test_every_format_of_a_kind_reads_to_the_same_blocks():
    printed = io.StringIO()
    out = run(Console(file=printed, width=200), sections=3, rows=12, slides=3, rounds=1)
    for first, *others in [
        ("Word .docx", "OpenDocument .odt"),
        ("Excel .xlsx", "Excel 97-2003 .xls", "OpenDocument .ods"),
        ("PowerPoint .pptx", "OpenDocument .odp"),
    ]:
        assert len(out[first]["blocks"]) > 10
        for other in others:
            assert out[other]["blocks"] == out[first]["blocks"], (first, other)
    assert "Desk 11 | 11 | 110.25 | 2027-01-12" in out["OpenDocument .ods"]["blocks"]
    assert "OpenDocument .odp" in printed.getvalue() and "cores" in printed.getvalue()
