"""SQL migrations from `migrations/`, applied and recorded by yoyo (idempotent, locked)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chatmem.adapters.sql import scalar

# `migrations/` sits beside the other top-level packages, in a checkout and when installed.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _yoyo_uri(database_url: str) -> str:
    scheme, rest = database_url.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        scheme = "postgresql+psycopg"
    return f"{scheme}://{rest}"


@contextmanager
def _backend(database_url: str) -> Iterator[Any]:  # yoyo's backends are untyped
    from yoyo import get_backend

    backend = get_backend(_yoyo_uri(database_url))
    try:
        yield backend
    finally:
        backend.connection.close()  # a lingering session would block CREATE DATABASE ... TEMPLATE


def migrate(database_url: str, vector_dim: int = 384, *, check: bool = True) -> list[str]:
    """Check that the server can hold vectors (any server: embedded or configured), apply what is
    not applied yet, then make sure the vector indexes for the configured embedding size exist;
    return the migration ids applied now."""
    from yoyo import read_migrations

    from chatmem.adapters import pgcheck

    if check:
        pgcheck.self_check(database_url)
    with _backend(database_url) as backend, backend.lock():
        todo = backend.to_apply(read_migrations(str(MIGRATIONS_DIR)))
        backend.apply_migrations(todo)
    update_vector_extension(database_url)
    ensure_vector_indexes(database_url, vector_dim)
    return [m.id for m in todo]


def update_vector_extension(database_url: str) -> str | None:
    """A database made by an older pgvector keeps that version's SQL objects after the library is
    upgraded (an earlier embedded server had 0.8.2): bring them up to the library's version.
    Returns the version moved to, or None when nothing changed."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT installed_version, default_version FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
        if row is None or row[0] is None or row[0] == row[1]:
            return None
        conn.execute("ALTER EXTENSION vector UPDATE")
        return scalar(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")


# Messages only: summaries are searched within a user's threads, through the thread index.
VECTOR_TABLES = ("messages",)


def vector_index_name(table: str, dim: int) -> str:
    return f"{table}_embedding_hnsw_{dim}"


def ensure_vector_indexes(database_url: str, dim: int) -> None:
    """HNSW needs a fixed size, while the columns take any: one partial expression index per
    table for the configured size (queries repeat the same expression and predicate). A switch
    of embedding model adds indexes; it never drops another model's."""
    import psycopg

    dim = int(dim)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in VECTOR_TABLES:
            conn.execute(
                f"""CREATE INDEX IF NOT EXISTS {vector_index_name(table, dim)} ON {table}
                    USING hnsw ((embedding::vector({dim})) vector_cosine_ops)
                    WHERE vector_dims(embedding) = {dim}"""
            )


def pending(database_url: str) -> list[str]:
    from yoyo import read_migrations

    with _backend(database_url) as backend:
        return [m.id for m in backend.to_apply(read_migrations(str(MIGRATIONS_DIR)))]
