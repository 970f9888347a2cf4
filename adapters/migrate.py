"""SQL migrations from `migrations/`, applied and recorded by yoyo (idempotent, locked)."""

from __future__ import annotations

from pathlib import Path

# `migrations/` sits beside the other top-level packages, in a checkout and when installed.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _yoyo_uri(database_url: str) -> str:
    scheme, rest = database_url.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        scheme = "postgresql+psycopg"
    return f"{scheme}://{rest}"


def migrate(database_url: str) -> list[str]:
    """Apply what is not applied yet; return the ids applied now."""
    from yoyo import get_backend, read_migrations

    backend = get_backend(_yoyo_uri(database_url))
    pending_all = read_migrations(str(MIGRATIONS_DIR))
    with backend.lock():
        todo = backend.to_apply(pending_all)
        backend.apply_migrations(todo)
    return [m.id for m in todo]


def pending(database_url: str) -> list[str]:
    from yoyo import get_backend, read_migrations

    backend = get_backend(_yoyo_uri(database_url))
    return [m.id for m in backend.to_apply(read_migrations(str(MIGRATIONS_DIR)))]
