"""The locale a new embedded Postgres data folder is created with.

initdb takes the database's character classes and collation from LANG / LC_* and refuses to run
when they name a locale the C library does not have. That is common: an image that sets
`LANG=en_US.UTF-8` without generating it, or an SSH session from macOS, which forwards
`LC_CTYPE=UTF-8`. And where they say `C` (a service manager's bare environment, `LC_ALL=C`), the
database's `lower()` and the text-search parser know only ASCII letters, so "Привет" and
"привет" never match. So initdb always gets the first locale of CANDIDATES the machine has,
whatever the shell says: C.UTF-8 classifies every Unicode letter and sorts by code point, the
same on every machine, so a data folder also moves between machines. A folder that exists keeps
the locale it was made with; one made elsewhere with a locale this machine lacks is named before
the server is started (`missing`), since Postgres will not start on it."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CANDIDATES = ("C.UTF-8", "C.utf8", "en_US.UTF-8")  # glibc and musl know the first; every macOS the last
FALLBACK = "C"  # always there; ASCII letters only
_PROBE = "import locale, sys; locale.setlocale(locale.LC_ALL, sys.argv[1])"


def available(name: str) -> bool:
    """Whether the C library loads `name`. Asked in a child process: setlocale changes the whole
    process, and other threads may be reading it."""
    try:
        probe = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, name], capture_output=True, check=False)
    except OSError:  # no interpreter to ask (an embedding host leaves sys.executable empty)
        return False
    return probe.returncode == 0


def choose(has: Callable[[str], bool] = available) -> str:
    for name in CANDIDATES:
        if has(name):
            return name
    log.warning(
        "none of %s is installed: the embedded Postgres is created with locale C, where only ASCII letters "
        "are letters to lower() and text search",
        ", ".join(CANDIDATES),
    )
    return FALLBACK


@contextmanager
def for_initdb(name: str) -> Iterator[None]:
    """LC_ALL=`name` in this process's environment while initdb runs: the server package starts it
    with the environment it inherits and takes no other. LC_ALL outranks LANG and every LC_*."""
    before = os.environ.get("LC_ALL")
    os.environ["LC_ALL"] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LC_ALL", None)
        else:
            os.environ["LC_ALL"] = before


def missing(pgdata: Path, has: Callable[[str], bool] = available) -> str | None:
    """The locale an existing folder was made with, when this machine does not have it. initdb
    writes it into postgresql.conf as lc_messages, lc_monetary, lc_numeric and lc_time, and the
    server refuses to start on a value the C library cannot load."""
    conf = pgdata / "postgresql.conf"
    if not conf.exists():
        return None
    named = re.findall(
        r"^\s*lc_(?:messages|monetary|numeric|time)\s*=\s*'([^']*)'", conf.read_text(encoding="utf-8"), re.M
    )
    for name in dict.fromkeys(named):
        if name not in ("", "C", "POSIX") and not has(name):
            return name
    return None
