"""Sizing the embedded Postgres's shared buffers: an eighth of the memory within bounds (the memory
a cgroup allows when it is less than the machine's: tests/unit/test_cgroups.py), in a conf file
of its own."""

from __future__ import annotations

from chatmem.adapters import pgmemory
from chatmem.adapters.pgmemory import GIB, MIB


def test_an_eighth_of_the_memory_between_the_default_and_the_cap():
    assert pgmemory.shared_buffers(24 * GIB) == 3 * GIB
    assert pgmemory.shared_buffers(8 * GIB) == GIB
    assert pgmemory.shared_buffers(512 * MIB) == 128 * MIB  # never below Postgres's default
    assert pgmemory.shared_buffers(256 * GIB) == 8 * GIB
    assert pgmemory.shared_buffers(3 * GIB + 12345) % MIB == 0


def test_the_conf_is_included_once_and_rewritten(tmp_path):
    (tmp_path / "postgresql.conf").write_text("max_connections = 100\n")
    pgmemory.write(tmp_path, pgmemory.conf_text(GIB))
    pgmemory.write(tmp_path, pgmemory.conf_text(2 * GIB))
    main = (tmp_path / "postgresql.conf").read_text(encoding="utf-8").splitlines()
    assert main.count(pgmemory.INCLUDE) == 1 and main[0] == "max_connections = 100"
    assert "shared_buffers = '2048MB'" in (tmp_path / pgmemory.CONF_FILE).read_text(encoding="utf-8")
    assert pgmemory.clear(tmp_path) is True
    assert "shared_buffers" not in (tmp_path / pgmemory.CONF_FILE).read_text(encoding="utf-8")
    assert pgmemory.clear(tmp_path) is False  # nothing left to take back
