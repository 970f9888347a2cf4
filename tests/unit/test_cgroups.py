"""The limits a cgroup (a container, a Kubernetes pod, a systemd slice) sets on this process:
memory, and the CPU quota, for cgroup v2 and v1, read from the process's cgroup and its parents."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from chatmem.adapters import cgroups, embedders
from chatmem.adapters.pgmemory import GIB


def tree(tmp_path: Path, files: dict[str, str], cgroup: str) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(cgroup)
    return root, proc


def test_the_lowest_limit_on_the_path_of_a_v2_cgroup(tmp_path):
    root, proc = tree(
        tmp_path,
        {"user.slice/memory.max": f"{2 * GIB}\n", "user.slice/app/memory.max": "max\n"},
        "0::/user.slice/app\n",
    )
    assert cgroups.memory_limit(root, proc) == 2 * GIB


def test_a_container_sees_its_own_limit_at_the_root(tmp_path):
    root, proc = tree(tmp_path, {"memory.max": f"{GIB}\n"}, "0::/\n")
    assert cgroups.memory_limit(root, proc) == GIB


def test_v1_without_a_limit_and_no_cgroups_at_all(tmp_path):
    root, proc = tree(
        tmp_path, {"memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n"}, "4:memory:/docker/abc\n"
    )
    assert cgroups.memory_limit(root, proc) is None
    assert cgroups.memory_limit(tmp_path / "none", tmp_path / "none") is None  # macOS, Windows


def test_v1_limit_of_the_memory_controller(tmp_path):
    root, proc = tree(
        tmp_path,
        {"memory/docker/abc/memory.limit_in_bytes": f"{3 * GIB}\n"},
        "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
    )
    assert cgroups.memory_limit(root, proc) == 3 * GIB


def test_a_v2_cpu_quota_in_cpus_the_lowest_on_the_path(tmp_path):
    root, proc = tree(
        tmp_path,
        {"kubepods/cpu.max": "400000 100000\n", "kubepods/pod1/cpu.max": "150000 100000\n", "cpu.max": "max 100000\n"},
        "0::/kubepods/pod1\n",
    )
    assert cgroups.cpu_limit(root, proc) == 1.5


def test_no_cpu_quota(tmp_path):
    root, proc = tree(tmp_path, {"cpu.max": "max 100000\n"}, "0::/\n")
    assert cgroups.cpu_limit(root, proc) is None
    assert cgroups.cpu_limit(tmp_path / "none", tmp_path / "none") is None  # macOS, Windows


@pytest.mark.parametrize("folder", ["cpu", "cpu,cpuacct"])
def test_a_v1_cpu_quota(tmp_path, folder):
    root, proc = tree(
        tmp_path,
        {f"{folder}/docker/abc/cpu.cfs_quota_us": "50000\n", f"{folder}/docker/abc/cpu.cfs_period_us": "100000\n"},
        "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
    )
    assert cgroups.cpu_limit(root, proc) == 0.5
    root, proc = tree(
        tmp_path / "none",
        {f"{folder}/cpu.cfs_quota_us": "-1\n", f"{folder}/cpu.cfs_period_us": "100000\n"},
        "5:cpu,cpuacct:/\n",
    )
    assert cgroups.cpu_limit(root, proc) is None


def test_compute_threads_stay_within_the_quota(monkeypatch):
    monkeypatch.setattr(embedders.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    for quota, threads in [(None, 16), (32.0, 16), (4.0, 4), (2.5, 2), (0.5, 1)]:
        monkeypatch.setattr(embedders.cgroups, "cpu_limit", lambda quota=quota: quota)
        assert embedders.available_cores() == threads


def test_the_machine_or_the_limit_whichever_is_lower(tmp_path):
    total = psutil.virtual_memory().total
    root, proc = tree(tmp_path, {"memory.max": f"{GIB}\n"}, "0::/\n")
    assert cgroups.machine_memory(root, proc) == cgroups.Memory(GIB, True)
    root, proc = tree(tmp_path / "big", {"memory.max": f"{total * 2}\n"}, "0::/\n")
    assert cgroups.machine_memory(root, proc) == cgroups.Memory(total, False)
