"""A worker started without --concurrency inside a container with little memory runs one process,
two where there is room: a real cgroup memory limit (v1 or v2) around a real Celery worker.
Skipped where this user may not make a cgroup (not root, or the hierarchy is read-only)."""

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest

from chatmem.adapters import cgroups
from tests.conftest import ROOT, settings_env, stop, wait_for

pytestmark = pytest.mark.e2e

GIB = 1 << 30


def _our_memory_cgroup() -> tuple[Path, str] | None:
    """This process's memory cgroup folder and the name of its limit file (v1, else v2)."""
    for line in cgroups.PROC_CGROUP.read_text(encoding="utf-8").splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return cgroups.ROOT / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
    for line in cgroups.PROC_CGROUP.read_text(encoding="utf-8").splitlines():
        if line.startswith("0::"):
            return cgroups.ROOT / line[3:].lstrip("/"), "memory.max"
    return None


@contextmanager
def memory_cgroup(name: str, limit: int) -> Iterator[Path]:
    found = _our_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup for this process")
    parent, limit_file = found
    folder = parent / name
    try:
        folder.mkdir()
        (folder / limit_file).write_text(str(limit))
    except OSError as error:
        with suppress(OSError):
            folder.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {error}")
    try:
        yield folder
    finally:
        with suppress(OSError):
            folder.rmdir()  # empty once its processes have exited


def worker_in(folder: Path, settings, log: Path) -> subprocess.Popen:
    procs = folder / "cgroup.procs"
    with log.open("w", encoding="utf-8") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "chatmem.api.cli", "worker", "--queues", "maintenance"],
            env=settings_env(settings),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Joined before Python starts, so the worker reads the limit it runs under.
            preexec_fn=lambda: procs.write_text(str(os.getpid())),  # noqa: PLW1509 - no threads touch it
        )


@pytest.mark.parametrize(("limit", "processes"), [(2 * GIB, 1), (4 * GIB, 2)], ids=["2GiB", "4GiB"])
def test_a_worker_without_concurrency_fits_its_processes_to_the_memory_limit(container, tmp_path, limit, processes):
    if psutil.virtual_memory().total < 4 * GIB:
        pytest.skip("the machine has less memory than the larger limit")
    log = tmp_path / "worker.log"
    with memory_cgroup(f"chatmem-test-{os.getpid()}-{limit // GIB}g", limit) as folder:
        worker = worker_in(folder, container.settings, log)
        try:
            assert wait_for(lambda: "ready" in log.read_text(encoding="utf-8") or worker.poll() is not None, timeout=90)
            assert worker.poll() is None, log.read_text(encoding="utf-8")[-3000:]
            pool = psutil.Process(worker.pid).children()
            assert len(pool) == processes, log.read_text(encoding="utf-8")[-3000:]
            said = "one worker process: 2.0 GiB of memory in this container" in log.read_text(encoding="utf-8")
            assert said == (processes == 1)
        finally:
            stop(worker)
