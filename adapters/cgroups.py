"""What the control groups of this process allow it: a memory limit and a CPU quota (cgroup v2, and
v1's memory and cpu controllers).

The host-wide figures that libraries report ignore both. psutil gives the host's memory and the
CPU affinity gives the host's cores, so inside a container limited to less, sizing from them
overcommits. The kernel kills a server whose buffers outgrow `memory.max`. A CPU quota lets the
process's threads together run for `quota` microseconds each `period`, and then stops them all
until the next period begins, so more compute threads than the quota's CPUs wait in every period."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def memory_limit(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The lowest memory limit in bytes on this process's cgroup and its parents, or None where
    none is set or none can be read (macOS, Windows)."""
    files = _v2_files(root, proc_cgroup, "memory.max")
    files += _v1_files(root, proc_cgroup, "memory", ("memory",), "memory.limit_in_bytes")
    return min((n for n in map(_bytes, files) if n is not None), default=None)


@dataclass(frozen=True)
class Memory:
    total: int  # bytes this process may use: the machine's, or its container's limit when lower
    limited: bool  # a cgroup limit is below the machine's memory


def machine_memory(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> Memory:
    """The memory this process may use. psutil reports the host's memory; inside a container
    limited to less, whatever is sized from it (buffers, worker processes) is killed by the kernel
    once it grows into it."""
    total = psutil.virtual_memory().total
    limit = memory_limit(root, proc_cgroup)
    return Memory(min(total, limit), True) if limit is not None and limit < total else Memory(total, False)


def cpu_limit(root: Path = ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The lowest CPU quota, in CPUs, on this process's cgroup and its parents (`docker --cpus`,
    a Kubernetes CPU limit, systemd's `CPUQuota=`), or None where none is set or none can be read."""
    quotas = [_v2_quota(f) for f in _v2_files(root, proc_cgroup, "cpu.max")]
    # v1 mounts the cpu controller alone or joined with cpuacct, under either name.
    v1 = _v1_files(root, proc_cgroup, "cpu", ("cpu", "cpu,cpuacct", "cpuacct,cpu"), "cpu.cfs_quota_us")
    quotas += [_v1_quota(f) for f in v1]
    return min((q for q in quotas if q is not None), default=None)


def _paths(proc_cgroup: Path) -> list[tuple[list[str], str]]:
    """Each line of /proc/self/cgroup as (its controllers, its path); v2's line has none."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        out.append(([c for c in controllers.split(",") if c], path))
    return out


def _v2_files(root: Path, proc_cgroup: Path, name: str) -> list[Path]:
    files = [f for controllers, path in _paths(proc_cgroup) if not controllers for f in _up(root, path, name)]
    # In a container the cgroup namespace shows the container's own cgroup at the root.
    return files + [root / name]


def _v1_files(root: Path, proc_cgroup: Path, controller: str, folders: tuple[str, ...], name: str) -> list[Path]:
    files = [
        f
        for controllers, path in _paths(proc_cgroup)
        if controller in controllers
        for folder in folders
        for f in _up(root / folder, path, name)
    ]
    return files + [root / folder / name for folder in folders]


def _up(root: Path, path: str, name: str) -> list[Path]:
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [root.joinpath(*parts[:i], name) for i in range(len(parts), 0, -1)]


def _read(file: Path) -> str | None:
    try:
        return file.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _bytes(file: Path) -> int | None:
    text = _read(file)
    if text is None or not text.isdigit():
        return None  # "max": no limit
    value = int(text)
    return value if value < 1 << 60 else None  # v1 writes a huge number for no limit


def _v2_quota(file: Path) -> float | None:
    fields = (_read(file) or "").split()
    if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit() or int(fields[1]) == 0:
        return None  # "max 100000": no quota
    return int(fields[0]) / int(fields[1])


def _v1_quota(file: Path) -> float | None:
    quota, period = _read(file), _read(file.with_name("cpu.cfs_period_us"))
    if quota is None or period is None or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None  # -1: no quota
    return int(quota) / int(period)
