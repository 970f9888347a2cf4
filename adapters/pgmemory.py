"""The embedded Postgres's buffer cache, sized to the machine it runs on.

Postgres starts with `shared_buffers = 128MB`. The messages' HNSW graph takes about 2 KiB a
message, so past some 60,000 messages each insert and each graph search copies the graph's pages
back in from the operating system's cache: at 1M messages a message's graph insert cost 6.3 ms
against 3.2 ms with the graph in shared buffers (docs/benchmarks.md, "The embedded Postgres's
buffer cache"). So the embedded server gets an eighth of the machine's memory, within the
container's limit where there is one, between 128 MB and 8 GB. An eighth, not the quarter that
dedicated database hosts use: the workers and their models share the machine.

The setting lives in `chatmem.conf` in the data folder, rewritten at each start and included from
`postgresql.conf`. `ALTER SYSTEM SET shared_buffers` overrides it (`postgresql.auto.conf` is
read last)."""

from __future__ import annotations

import os
from pathlib import Path

MIB = 1 << 20
GIB = 1 << 30
FLOOR = 128 * MIB  # Postgres's own default: never less
CAP = 8 * GIB
SHARE = 8
CONF_FILE = "chatmem.conf"
INCLUDE = f"include_if_exists = '{CONF_FILE}'"
_HEADER = "# Written by chatmem at each start of the embedded server (adapters/pgmemory.py); edits are lost.\n"


def shared_buffers(memory: int) -> int:
    """Bytes of shared buffers for a machine with `memory` bytes, a whole number of MiB."""
    return max(FLOOR, min(CAP, memory // SHARE)) // MIB * MIB


def conf_text(buffers: int) -> str:
    return _HEADER + f"shared_buffers = '{buffers // MIB}MB'\n"


def write(pgdata: Path, text: str) -> None:
    """Write chatmem.conf and include it from postgresql.conf once. Both stay owned by the data
    folder's owner (the `pgserver` user when root starts the server)."""
    conf = pgdata / CONF_FILE
    if not conf.exists() or conf.read_text(encoding="utf-8") != text:
        conf.write_text(text, encoding="utf-8")
        _owned_like(conf, pgdata)
    main = pgdata / "postgresql.conf"
    lines = main.read_text(encoding="utf-8").splitlines()
    if INCLUDE not in lines:
        with main.open("a", encoding="utf-8") as f:
            f.write(f"\n{INCLUDE}\n")


def clear(pgdata: Path, keep: str = "") -> bool:
    """Take the buffer size out of chatmem.conf (`keep`: its other lines), so the server starts on
    Postgres's default; False when it set none."""
    conf, text = pgdata / CONF_FILE, _HEADER + keep
    if not conf.exists() or conf.read_text(encoding="utf-8") == text:
        return False
    conf.write_text(text, encoding="utf-8")
    return True


def _owned_like(file: Path, folder: Path) -> None:
    st = folder.stat()
    if (
        hasattr(os, "geteuid")
        and os.geteuid() == 0
        and (file.stat().st_uid, file.stat().st_gid) != (st.st_uid, st.st_gid)
    ):
        os.chown(file, st.st_uid, st.st_gid)
