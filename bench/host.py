"""The machine a benchmark ran on, as every bench prints it beside its figures. The same code ran
2–2.5× faster on one 2-core machine than on another of the same name (docs/benchmarks.md), so a
figure needs the CPU's level and vector width as well as the core count.
`platform.processor()` is empty on Linux, so the brand comes from /proc/cpuinfo where there is one."""

from __future__ import annotations

import os
from pathlib import Path

from chatmem.adapters import cgroups
from chatmem.adapters.pgcheck import cpu_report


def brand(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name as the kernel reports it (a virtual machine may shorten it)."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass  # not Linux: the CPU's name and architecture still say what ran
    return None


def machine() -> str:
    """E.g. "AMD EPYC · zen3 (x86_64) · 2 cores": the kernel's model name, the CPU as the start-up
    check reads it (`pgcheck.cpu_report`), AVX-512 when it has it, and the cores, with the CPU
    quota of a container that has fewer CPUs than cores."""
    head = f"{name} · " if (name := brand()) else ""
    cpu = cpu_report()
    wide = ", AVX-512" if cpu.avx512 else ""
    cores = os.cpu_count() or 1
    quota = cgroups.cpu_limit()
    limited = f", a CPU quota of {quota:g}" if quota is not None and quota < cores else ""
    return f"{head}{cpu.name} ({cpu.arch}{wide}) · {cores} cores{limited}"
