"""Which failures a later attempt can fix. Everything else is a bug or bad input: not retried."""

from __future__ import annotations

import traceback
from pathlib import Path

import psycopg
import redis

from chatmem.memory.ports import TransientError

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    psycopg.OperationalError,
    redis.ConnectionError,
    redis.TimeoutError,
)

# The folder that holds the package's parts (memory/, adapters/, ...), installed or not, and
# the parts (pyproject.toml maps them into `chatmem`); tests/ beside them is not one.
_ROOT = Path(__file__).resolve().parents[1]
_PARTS = frozenset({"chatmem", "schemas", "memory", "adapters", "producers", "workers", "api", "bench"})


def where_raised(error: BaseException) -> str:
    """The error's type and the innermost line of chatmem it passed ("KeyError at
    memory/dates.py:186 in _count"). Never its message, which may quote a user's words."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return type(error).__name__
    ours = [(f, _ours(f.filename)) for f in frames]
    frame, shown = next(((f, p) for f, p in reversed(ours) if p is not None), (frames[-1], None))
    return f"{type(error).__name__} at {shown or Path(frame.filename).name}:{frame.lineno} in {frame.name}"


def _ours(filename: str) -> str | None:
    path = Path(filename).resolve()
    if not path.is_relative_to(_ROOT):
        return None
    relative = path.relative_to(_ROOT)
    # Installed, chatmem's own modules (bootstrap.py, ...) sit at the top of _ROOT itself.
    return relative.as_posix() if relative.parts[0] in _PARTS or len(relative.parts) == 1 else None
