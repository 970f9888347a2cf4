"""The machine a benchmark ran on, as every bench prints it beside its figures. The same code ran
2–2.5× faster on one 2-core machine than on another of the same name (docs/benchmarks.md), so a
figure needs the CPU's level and vector width as well as the core count.
`platform.processor()` is empty on Linux, so the brand comes from /proc/cpuinfo where there is one."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def brand(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name as the kernel reports it (a virtual machine may shorten it)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass  # not Linux: the architecture and archspec's name still say what ran
    return None


def machine() -> str:
    """E.g. "AMD EPYC · zen3 (x86_64) · 2 cores"; archspec's name for the CPU, and AVX-512 when
    it has it; the architecture alone where archspec cannot read the CPU."""
    arch = platform.machine() or "unknown"
    head = f"{name} · " if (name := brand()) else ""
    try:
        import archspec.cpu

        host = archspec.cpu.host()
    except Exception:  # noqa: BLE001 - a CPU archspec cannot read still gets its figures printed
        return f"{head}{arch} · {os.cpu_count()} cores"
    wide = ", AVX-512" if "avx512f" in host.features else ""
    return f"{head}{host.name} ({arch}{wide}) · {os.cpu_count()} cores"
