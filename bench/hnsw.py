"""`chatmem bench hnsw`: how long pgvector takes to build an HNSW index on N message-sized
vectors, by `maintenance_work_mem` and parallel maintenance workers, with the index's size.

The vectors are synthetic, 384 dimensions like all-MiniLM-L6-v2's. `clustered` (the default)
scatters them around a few thousand topic centres, the way chat embeddings bunch by subject;
`random` spreads them uniformly over the sphere, the hardest case for a graph index. Both are
unit length and searched by cosine, as the messages' index is."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from rich.console import Console
from rich.table import Table

from chatmem.adapters import services
from chatmem.adapters.sql import scalar
from chatmem.bench.host import machine
from chatmem.bench.ingest import _with_db
from chatmem.schemas.settings import Settings

DIM = 384
CHUNK = 50_000


def vectors(n: int, kind: str, seed: int = 0) -> Iterator[np.ndarray]:
    """`n` unit vectors in chunks. A clustered vector is its centre plus noise of about the same
    length, so neighbours within a topic sit at cosine 0.5-0.7 and across topics near 0."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 500), DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        noise = rng.standard_normal((m, DIM)).astype(np.float32)
        if kind == "clustered":
            noise = centres[rng.integers(0, len(centres), m)] + noise / np.sqrt(DIM)
        yield noise / np.linalg.norm(noise, axis=1, keepdims=True)


@contextmanager
def bench_database(settings: Settings) -> Iterator[str]:
    with services.running(settings) as urls:
        name = f"chatmem_bench_hnsw_{os.getpid()}"
        with psycopg.connect(urls.database_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        try:
            yield _with_db(urls.database_url, name)
        finally:
            with psycopg.connect(urls.database_url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def load(conn: psycopg.Connection, n: int, kind: str) -> float:
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    conn.execute(f"CREATE TABLE v (id bigint, embedding vector({DIM}))")
    t0 = time.perf_counter()
    i = 0
    with conn.cursor() as cur, cur.copy("COPY v (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "vector"])
        for chunk in vectors(n, kind):
            for row in chunk:
                copy.write_row((i, row))
                i += 1
    conn.commit()
    conn.execute("VACUUM ANALYZE v")
    return time.perf_counter() - t0


def build(conn: psycopg.Connection, memory: str, workers: int) -> tuple[float, int]:
    conn.execute("DROP INDEX IF EXISTS v_hnsw")
    conn.execute(f"SET maintenance_work_mem = '{memory}'")
    conn.execute(f"SET max_parallel_maintenance_workers = {int(workers)}")
    t0 = time.perf_counter()
    conn.execute(
        "CREATE INDEX v_hnsw ON v USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
    )
    seconds = time.perf_counter() - t0
    return seconds, int(scalar(conn, "SELECT pg_relation_size('v_hnsw')"))


def run(
    settings: Settings, console: Console, *, n: int, kind: str, configs: list[tuple[str, int]]
) -> list[tuple[str, int, float, int]]:
    rows = []
    with bench_database(settings) as url, psycopg.connect(url, autocommit=True) as conn:
        loaded = load(conn, n, kind)
        console.print(f"{n:,} {kind} vectors loaded in {loaded:.1f} s")
        for memory, workers in configs:
            seconds, size = build(conn, memory, workers)
            rows.append((memory, workers, seconds, size))
            console.print(f"  maintenance_work_mem {memory}, {workers} parallel workers: {seconds:.1f} s")
        version = scalar(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        server = scalar(conn, "SHOW server_version")
    table = Table(
        title=f"chatmem bench hnsw · {n:,} {kind} vectors ({DIM} dims) · Postgres {server}, pgvector {version} · "
        f"{machine()} · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("maintenance_work_mem", "parallel workers", "build s", "vectors/s", "index MiB"):
        table.add_column(col, justify="right")
    for memory, workers, seconds, size in rows:
        table.add_row(memory, str(workers), f"{seconds:,.1f}", f"{n / seconds:,.0f}", f"{size / 2**20:,.0f}")
    table.caption = "m = 16, ef_construction = 64, cosine; a build's workers come on top of the leader process"
    console.print(table)
    return rows
