"""Older x86-64 CPUs, emulated, for the checks this machine's own CPU cannot make.

The machines that run the suite may have AVX-512; many users' CPUs do not, and the embedded
Postgres once crashed there (`SIGILL`). pgvector, FFmpeg, ONNX Runtime and libde265 pick their
AVX-512 and AVX2 code with cpuid at run time, so only a CPU without them shows that the choice
is right. qemu's user mode runs one program, and the processes it forks, as a chosen CPU model:
cpuid answers for that model, and its translator has no AVX-512 at all, so an AVX-512
instruction outside a run-time switch dies with `SIGILL` as it did on users' machines.

`make test` runs this module first: it fetches Debian's qemu-user 10 with `apt-get download` (no
root, nothing installed: the one binary is unpacked into .chatmem/tools). Where
neither that nor a qemu on PATH is found, the emulated tests skip, or fail when
CHATMEM_TEST_EMULATION=required (CI), so the check cannot vanish from CI unseen."""

from __future__ import annotations

import getpass
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".chatmem" / "tools"
KEPT = TOOLS / "qemu-x86_64"
# qemu 7.2 (Debian 12's own) emulates AVX2 wrongly: an AVIF photo decoded under its Haswell came
# out with blocks of grey, and right under 10.0. Debian 12's backports carry 10.0, statically
# linked (one file, no libraries beside it), signed like the rest of Debian.
MIN_VERSION = (10, 0)
SOURCE = "deb http://deb.debian.org/debian bookworm-backports main\n"
PACKAGE = "qemu-user/bookworm-backports"
MEMBER = "./usr/bin/qemu-x86_64"

# The CPU models the checks run on: AMD Zen 1 (AVX2, no AVX-512, where the old pgvector crashed),
# Intel Haswell (AVX2, no AVX-512) and Nehalem (SSE4.2: neither).
ZEN1, HASWELL, NEHALEM = "EPYC", "Haswell", "Nehalem"


def on_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def version(qemu: Path) -> tuple[int, ...]:
    try:
        shown = subprocess.run([str(qemu), "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return ()
    found = re.search(r"version (\d+)\.(\d+)", shown)
    return tuple(map(int, found.groups())) if found else ()


def find() -> Path | None:
    """A qemu-x86_64 recent enough: the one fetched here, or one on PATH."""
    for candidate in (KEPT, *(Path(p) for name in ("qemu-x86_64", "qemu-x86_64-static") if (p := shutil.which(name)))):
        if os.access(candidate, os.X_OK) and version(candidate) >= MIN_VERSION:
            return candidate
    return None


def fetch() -> str:
    """Unpack Debian's qemu-x86_64 into .chatmem/tools unless one is found; says what it did. apt
    reads the backports index into a folder of its own, checks its signature with the machine's
    keys, and fetches the one package; nothing is installed, and no root is needed."""
    if not on_x86():
        return f"not an x86-64 machine ({platform.machine()}): the emulated-CPU tests skip"
    if (found := find()) is not None:
        return f"using {found}, qemu {'.'.join(map(str, version(found)))}"
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return "no apt-get or dpkg-deb here (not Debian or Ubuntu): the emulated-CPU tests skip"
    with tempfile.TemporaryDirectory() as folder:
        apt = Path(folder)
        (apt / "sources.list").write_text(SOURCE)
        for part in ("lists/partial", "cache/archives/partial", "download"):
            (apt / part).mkdir(parents=True)
        options = [
            f"-oDir::Etc::sourcelist={apt / 'sources.list'}",
            "-oDir::Etc::sourceparts=-",
            f"-oDir::State::Lists={apt / 'lists'}",
            f"-oDir::Cache={apt / 'cache'}",
            f"-oAPT::Sandbox::User={getpass.getuser()}",  # apt's own download user may not enter here
        ]
        for command in (["update"], ["download", PACKAGE]):
            got = subprocess.run(
                ["apt-get", "-q", *options, *command], cwd=apt / "download", capture_output=True, text=True, timeout=600
            )
            if got.returncode != 0:
                return f"could not fetch {PACKAGE} ({got.stderr.strip()[-300:]}): the emulated-CPU tests skip"
        deb = next((apt / "download").glob("*.deb"))
        TOOLS.mkdir(parents=True, exist_ok=True)
        part = KEPT.with_suffix(".part")
        unpack = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
        try:
            with tarfile.open(fileobj=unpack.stdout, mode="r|") as archive:
                for member in archive:
                    if member.name == MEMBER and member.isfile():
                        with archive.extractfile(member) as source, part.open("wb") as target:  # type: ignore[union-attr]
                            shutil.copyfileobj(source, target)
                        break
        finally:
            unpack.kill()
            unpack.wait()
        if not part.exists():
            return f"{deb.name} holds no {MEMBER}: the emulated-CPU tests skip"
        part.chmod(0o755)
        part.rename(KEPT)
        return f"fetched {deb.name} into {KEPT}"


def qemu() -> Path:
    """The emulator, or the test skips (fails where CI requires it)."""
    found = find() if on_x86() else None
    if found is None:
        reason = "needs qemu-x86_64 10 or newer on an x86-64 machine: `make test` fetches Debian's"
        if os.environ.get("CHATMEM_TEST_EMULATION") == "required":
            pytest.fail(reason + " (CHATMEM_TEST_EMULATION=required)")
        pytest.skip(reason)
    return found


def emulated(cpu: str, command: list[str]) -> list[str]:
    """`command` run as the CPU model `cpu`."""
    return [str(qemu()), "-cpu", cpu, *command]


if __name__ == "__main__":
    print("emulated CPUs:", fetch(), flush=True)
