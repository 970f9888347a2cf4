"""Fixtures of the fault matrix and the table it prints at the end of the session."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.schemas.settings import Settings
from tests.chaos.harness import CHAOS_SETTINGS, ROWS


@pytest.fixture
def chaos_settings(settings_factory: Callable[..., Settings]) -> Settings:
    return settings_factory(**CHAOS_SETTINGS)


@pytest.fixture
def chaos_container(chaos_settings: Settings) -> Iterator[Container]:
    s = chaos_settings
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))  # type: ignore[arg-type]
    yield c
    c.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001, ARG001
    if not ROWS:
        return
    head = ("case", "fault", "events", "lost", "duplicated", "inversions", "dead letters", "refused", "seconds")
    rows = [
        (
            r.case,
            r.fault,
            str(r.events),
            str(r.lost),
            str(r.duplicated),
            str(r.inversions),
            str(r.dead_letters),
            str(r.refused),
            f"{r.seconds:.1f}",
        )
        for r in ROWS
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    terminalreporter.section("fault matrix")
    for line in (head, tuple("-" * w for w in widths), *rows):
        terminalreporter.write_line("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=False)))
