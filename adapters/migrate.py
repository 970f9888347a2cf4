"""SQL migrations from `migrations/`, applied and recorded by yoyo (idempotent, locked)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# `migrations/` sits beside the other top-level packages, in a checkout and when installed.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _yoyo_uri(database_url: str) -> str:
    scheme, rest = database_url.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        scheme = "postgresql+psycopg"
    return f"{scheme}://{rest}"


@contextmanager
def _backend(database_url: str) -> Iterator[object]:
    from yoyo import get_backend

    backend = get_backend(_yoyo_uri(database_url))
    try:
        yield backend
    finally:
        backend.connection.close()  # a lingering session would block CREATE DATABASE ... TEMPLATE


def migrate(database_url: str) -> list[str]:
    """Apply what is not applied yet; return the ids applied now."""
    from yoyo import read_migrations

    with _backend(database_url) as backend, backend.lock():
        todo = backend.to_apply(read_migrations(str(MIGRATIONS_DIR)))
        backend.apply_migrations(todo)
        return [m.id for m in todo]


def pending(database_url: str) -> list[str]:
    from yoyo import read_migrations

    with _backend(database_url) as backend:
        return [m.id for m in backend.to_apply(read_migrations(str(MIGRATIONS_DIR)))]
