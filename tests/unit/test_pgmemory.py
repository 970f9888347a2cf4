"""Sizing the embedded Postgres's shared buffers: an eighth of the memory within bounds, and the
memory a cgroup (a container, a systemd slice) allows when it is less than the machine's."""

from __future__ import annotations

from pathlib import Path

import psutil

from chatmem.adapters import pgmemory
from chatmem.adapters.pgmemory import GIB, MIB


def test_an_eighth_of_the_memory_between_the_default_and_the_cap():
    assert pgmemory.shared_buffers(24 * GIB) == 3 * GIB
    assert pgmemory.shared_buffers(8 * GIB) == GIB
    assert pgmemory.shared_buffers(512 * MIB) == 128 * MIB  # never below Postgres's default
    assert pgmemory.shared_buffers(256 * GIB) == 8 * GIB
    assert pgmemory.shared_buffers(3 * GIB + 12345) % MIB == 0


def _tree(tmp_path: Path, files: dict[str, str], cgroup: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(cgroup)
    return root, proc


def test_the_lowest_limit_on_the_path_of_a_v2_cgroup(tmp_path):
    root, proc = _tree(
        tmp_path,
        {"user.slice/memory.max": f"{2 * GIB}\n", "user.slice/app/memory.max": "max\n"},
        "0::/user.slice/app\n",
    )
    assert pgmemory.cgroup_limit(root, proc) == 2 * GIB


def test_a_container_sees_its_own_limit_at_the_root(tmp_path):
    root, proc = _tree(tmp_path, {"memory.max": f"{GIB}\n"}, "0::/\n")
    assert pgmemory.cgroup_limit(root, proc) == GIB


def test_v1_without_a_limit_and_no_cgroups_at_all(tmp_path):
    root, proc = _tree(
        tmp_path, {"memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n"}, "4:memory:/docker/abc\n"
    )
    assert pgmemory.cgroup_limit(root, proc) is None
    assert pgmemory.cgroup_limit(tmp_path / "none", tmp_path / "none") is None  # macOS, Windows


def test_v1_limit_of_the_memory_controller(tmp_path):
    root, proc = _tree(
        tmp_path,
        {"memory/docker/abc/memory.limit_in_bytes": f"{3 * GIB}\n"},
        "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
    )
    assert pgmemory.cgroup_limit(root, proc) == 3 * GIB


def test_the_machine_or_the_limit_whichever_is_lower(tmp_path):
    total = psutil.virtual_memory().total
    root, proc = _tree(tmp_path, {"memory.max": f"{GIB}\n"}, "0::/\n")
    assert pgmemory.machine_memory(root, proc) == pgmemory.Memory(GIB, True)
    root, proc = _tree(tmp_path / "big", {"memory.max": f"{total * 2}\n"}, "0::/\n")
    assert pgmemory.machine_memory(root, proc) == pgmemory.Memory(total, False)


def test_the_conf_is_included_once_and_rewritten(tmp_path):
    (tmp_path / "postgresql.conf").write_text("max_connections = 100\n")
    pgmemory.write(tmp_path, pgmemory.conf_text(GIB))
    pgmemory.write(tmp_path, pgmemory.conf_text(2 * GIB))
    main = (tmp_path / "postgresql.conf").read_text().splitlines()
    assert main.count(pgmemory.INCLUDE) == 1 and main[0] == "max_connections = 100"
    assert "shared_buffers = '2048MB'" in (tmp_path / pgmemory.CONF_FILE).read_text()
    assert pgmemory.clear(tmp_path) is True
    assert "shared_buffers" not in (tmp_path / pgmemory.CONF_FILE).read_text()
    assert pgmemory.clear(tmp_path) is False  # nothing left to take back
