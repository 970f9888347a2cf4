"""Process helpers shared by the embedded services and the publish spool."""

from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

# Thread pools kept per process: threads do not survive a fork, so a forked child makes its own.
# Their own lock, never one that model loads hold for seconds, so a read never waits on a load.
_pools: dict[tuple[int, str], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _after_fork() -> None:
    global _pools_lock
    _pools_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def process_threads(name: str, workers: int) -> ThreadPoolExecutor:
    """This process's pool of `workers` threads named `name`."""
    with _pools_lock:
        key = (os.getpid(), name)
        if key not in _pools:
            _pools[key] = ThreadPoolExecutor(workers, thread_name_prefix=name)
        return _pools[key]


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    return True


def process_name(role: str) -> str:
    """`role@host:pid`: names a consumer, a lease owner or a worker in logs and in Postgres."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}"
