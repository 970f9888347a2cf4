"""CPU seconds by stage: what each process tree (a worker kind, the ingest consumer, Postgres,
Redis) spent between two points of a benchmark. Wall-clock rates on a shared 2-core machine move
with whatever else runs; CPU per message does not, and it is what a capacity model multiplies."""

from __future__ import annotations

from urllib.parse import urlsplit

import psutil


def _tree_cpu(pid: int) -> float:
    """User + system seconds of a process, its live descendants, and the children it reaped."""
    try:
        root = psutil.Process(pid)
        t = root.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in root.children(recursive=True):
            try:
                ct = child.cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                pass  # exited meanwhile: its time moves to the parent's children_* once reaped
        return total
    except psutil.Error:
        return 0.0


def listening_pid(url: str) -> int | None:
    """The local process that listens on a service URL's port (None when it is not local or
    this user may not see it)."""
    port = urlsplit(url).port
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return conn.pid
    except psutil.Error:
        return None
    return None


def postmaster_of(backend_pid: int) -> int | None:
    """A local Postgres server's main process, from one of its backends (`pg_backend_pid()`):
    its backends are its children, whatever socket the URL names."""
    try:
        return psutil.Process(backend_pid).ppid()
    except psutil.Error:
        return None


class CpuMeter:
    """`roles` maps a stage's name to the root pids of its processes; `start()` then `stop()`
    give the CPU seconds each stage spent in between."""

    def __init__(self, roles: dict[str, list[int]]):
        self.roles = {name: [p for p in pids if p] for name, pids in roles.items()}
        self._start: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        return {name: sum(_tree_cpu(p) for p in pids) for name, pids in self.roles.items()}

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        end = self._sample()
        return {name: max(0.0, end[name] - self._start.get(name, 0.0)) for name in self.roles}
