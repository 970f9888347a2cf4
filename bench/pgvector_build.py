"""`chatmem bench pgvector-build`: what the pgvector compiled here (for CPUs the package's build
does not run on, adapters/pgvector_build.py) costs against the package's, on this machine.

Two embedded servers, one loading each library, get the same vectors; then, alternating between
them round by round, exact top-10 scans over every row (the distance functions themselves) and
HNSW top-10 probes, and one HNSW build each. The package's build is compiled for x86-64-v3 (SVE
on Linux ARM) and the one compiled here for the baseline, with AVX-512 and F16C picked at run
time in both, so the gap shown is what a CPU that needs the build gives up to its vector code
alone; on such a CPU only the build runs at all."""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from rich.console import Console
from rich.table import Table

from chatmem.adapters.services import EmbeddedPostgres
from chatmem.adapters.sql import scalar
from chatmem.bench.hnsw import DIM, load, vectors
from chatmem.bench.host import machine

LIBRARIES = ("package", "build")


def _queries(n: int, count: int) -> list[np.ndarray]:
    return list(next(vectors(count, "clustered", seed=n + 1)))


def _timed(conn: psycopg.Connection, sql: str, query: np.ndarray) -> float:
    t0 = time.perf_counter()
    # Unprepared: a statement psycopg prepares keeps the plan it was made with (the index) after
    # enable_indexscan changes.
    conn.execute(sql, (query,), prepare=False).fetchall()
    return (time.perf_counter() - t0) * 1000


def run(console: Console, *, n: int, queries: int, rounds: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {name: {} for name in LIBRARIES}
    times: dict[str, dict[str, list[float]]] = {name: {"scan": [], "hnsw": []} for name in LIBRARIES}
    probes = _queries(n, queries)
    with tempfile.TemporaryDirectory(prefix="chatmem-bench-pgvector-") as folder:
        servers = {name: EmbeddedPostgres(Path(folder) / name, pgvector=name) for name in LIBRARIES}
        conns: dict[str, psycopg.Connection] = {}
        try:
            for name, pg in servers.items():
                t0 = time.perf_counter()
                conns[name] = psycopg.connect(pg.start(), autocommit=True)
                console.print(f"{name}: started in {time.perf_counter() - t0:.1f} s (a first build compiles pgvector)")
                load(conns[name], n, "clustered")
                register_vector(conns[name])
                conns[name].execute("SET max_parallel_workers_per_gather = 0")
            for name, conn in conns.items():
                t0 = time.perf_counter()
                conn.execute(
                    "CREATE INDEX v_hnsw ON v USING hnsw (embedding vector_cosine_ops) "
                    "WITH (m = 16, ef_construction = 64)"
                )
                figures[name]["build_s"] = time.perf_counter() - t0
            scan = "SELECT id FROM v ORDER BY embedding <=> %s LIMIT 10"
            for _ in range(rounds):
                for name, conn in conns.items():
                    conn.execute("SET enable_indexscan = off")
                    times[name]["scan"] += [_timed(conn, scan, q) for q in probes[:3]]
                    conn.execute("RESET enable_indexscan")
                    times[name]["hnsw"] += [_timed(conn, scan, q) for q in probes]
            version = scalar(conns["build"], "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            server = scalar(conns["build"], "SHOW server_version")
        finally:
            for conn in conns.values():
                conn.close()
            for pg in servers.values():
                pg.stop()
    for name in LIBRARIES:
        figures[name]["scan_ms"] = statistics.median(times[name]["scan"])
        figures[name]["hnsw_ms"] = statistics.median(times[name]["hnsw"])
        figures[name]["hnsw_p95_ms"] = float(np.percentile(times[name]["hnsw"], 95))
    table = Table(
        title=f"chatmem bench pgvector-build · {n:,} clustered vectors ({DIM} dims) · Postgres {server}, "
        f"pgvector {version} · {machine()} · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("", "package's build", "compiled here", "here / package"):
        table.add_column(col, justify="right")
    rows = (
        ("exact top-10 scan, median ms", "scan_ms"),
        ("HNSW top-10, median ms", "hnsw_ms"),
        ("HNSW top-10, p95 ms", "hnsw_p95_ms"),
        ("HNSW build s (m 16, ef 64)", "build_s"),
    )
    for label, key in rows:
        a, b = figures["package"][key], figures["build"][key]
        table.add_row(label, f"{a:,.2f}", f"{b:,.2f}", f"{b / a:.2f}")
    table.caption = (
        f"{rounds} alternating rounds; scans: 3 queries a round, one process, no parallel workers; "
        f"HNSW: {queries} queries a round, ef_search 40"
    )
    console.print(table)
    return figures
