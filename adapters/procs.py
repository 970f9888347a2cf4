"""Process helpers shared by the embedded services and the publish spool."""

from __future__ import annotations

import os
import socket


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
