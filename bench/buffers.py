"""`chatmem bench buffers`: what the embedded Postgres's shared buffers do to the messages' HNSW
graph at scale: the cost of adding a vector, and of a nearest-ten search, for each size given.

A throwaway embedded server in a folder of its own (the configured services are not touched)
holds N synthetic message-sized vectors (bench/hnsw.py) and their graph, built with pgvector's
defaults as `chatmem migrate` builds the messages' index. For each size the server is restarted
with it (`ALTER SYSTEM`), a few batches warm it, then batches of inserts are timed, one commit a
batch, as projection writes messages; then graph searches. Rounds alternate the sizes, so a
drift of the machine falls on all of them."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from rich.console import Console
from rich.table import Table

from chatmem.adapters import cgroups, pgmemory
from chatmem.adapters.services import EmbeddedPostgres
from chatmem.adapters.sql import scalar
from chatmem.bench.hnsw import DIM, build, load
from chatmem.bench.host import machine
from chatmem.schemas.settings import Settings

BUILD_MEMORY = "2GB"
WARM_BATCHES = 3


@dataclass
class Figures:
    buffers: str
    reported: str = ""  # what the restarted server says it runs with
    insert_ms: list[float] = field(default_factory=list)  # per vector, one figure a batch
    search_ms: list[float] = field(default_factory=list)


def auto_size() -> str:
    return f"{pgmemory.shared_buffers(cgroups.machine_memory().total) // pgmemory.MIB}MB"


def _restart(pg: EmbeddedPostgres, buffers: str) -> str:
    url = pg.url()
    if url is not None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET shared_buffers = '{buffers}'")
        pg.stop()
    return pg.start()


def _near_existing(conn: psycopg.Connection, count: int, seed: int) -> np.ndarray:
    """New vectors near stored ones, as new messages fall in topics already talked about."""
    rng = np.random.default_rng(seed)
    n = int(scalar(conn, "SELECT count(*) FROM v"))
    ids = rng.choice(n, size=count, replace=count > n).tolist()
    rows = conn.execute("SELECT embedding FROM v WHERE id = ANY(%s)", (ids,)).fetchall()
    base = np.vstack([np.asarray(r[0].to_numpy(), dtype=np.float32) for r in rows])[rng.integers(0, len(rows), count)]
    x = base + rng.standard_normal(base.shape).astype(np.float32) / np.sqrt(DIM)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _insert_batches(conn: psycopg.Connection, batches: int, size: int, seed: int) -> list[float]:
    out = []
    pending = _near_existing(conn, batches * size, seed)
    base = int(scalar(conn, "SELECT max(id) FROM v")) + 1
    for b in range(batches):
        rows = [(base + b * size + i, pending[b * size + i]) for i in range(size)]
        t0 = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany("INSERT INTO v (id, embedding) VALUES (%s, %s)", rows)
        out.append((time.perf_counter() - t0) * 1000 / size)
    return out


def _searches(conn: psycopg.Connection, n: int, seed: int) -> list[float]:
    out = []
    for q in _near_existing(conn, n, seed):
        t0 = time.perf_counter()
        conn.execute("SELECT id FROM v ORDER BY embedding <=> %s LIMIT 10", (q,)).fetchall()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def run(
    settings: Settings,
    console: Console,
    *,
    n: int,
    sizes: list[str],
    rounds: int = 2,
    batches: int = 10,
    batch: int = 300,
    searches: int = 200,
) -> list[Figures]:
    figures = [Figures(s) for s in sizes]
    folder = Path(tempfile.mkdtemp(prefix="bench-buffers-", dir=settings.data_dir))
    pg = EmbeddedPostgres(folder)
    try:
        url = pg.start()
        with psycopg.connect(url, autocommit=True) as conn:
            loaded = load(conn, n, "clustered")
            seconds, size = build(conn, BUILD_MEMORY, 1)
            console.print(
                f"{n:,} vectors loaded in {loaded:.1f} s, graph built in {seconds:.1f} s ({size / 2**20:,.0f} MiB)"
            )
            server = scalar(conn, "SHOW server_version")
            version = scalar(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        seed = 1
        for r in range(rounds):
            for fig in figures:
                url = _restart(pg, fig.buffers)
                with psycopg.connect(url, autocommit=True) as conn:
                    register_vector(conn)
                    shown = fig.reported = scalar(conn, "SHOW shared_buffers")
                    _insert_batches(conn, WARM_BATCHES, batch, seed)
                    fig.insert_ms += _insert_batches(conn, batches, batch, seed + 1)
                    fig.search_ms += _searches(conn, searches, seed + 2)
                seed += 3
                inserted, searched = (
                    statistics.median(fig.insert_ms[-batches:]),
                    statistics.median(fig.search_ms[-searches:]),
                )
                console.print(
                    f"  round {r + 1}, shared_buffers {shown}: insert {inserted:.2f} ms a vector, "
                    f"search p50 {searched:.2f} ms"
                )
    finally:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
    _table(console, figures, n=n, size=size, server=server, version=version, batch=batch)
    return figures


def _table(
    console: Console, figures: list[Figures], *, n: int, size: int, server: str, version: str, batch: int
) -> None:
    table = Table(
        title=f"chatmem bench buffers · {n:,} vectors ({DIM} dims), graph {size / 2**20:,.0f} MiB · Postgres {server}, "
        f"pgvector {version} · {machine()} · "
        f"{cgroups.machine_memory().total / pgmemory.GIB:.1f} GiB · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("shared_buffers", "insert ms/vector p50", "min–max", "× first", "search ms p50", "p95", "× first"):
        table.add_column(col, justify="right")
    first_insert = statistics.median(figures[0].insert_ms)
    first_search = statistics.median(figures[0].search_ms)
    for fig in figures:
        ins, se = statistics.median(fig.insert_ms), statistics.median(fig.search_ms)
        table.add_row(
            fig.buffers,
            f"{ins:.2f}",
            f"{min(fig.insert_ms):.2f}–{max(fig.insert_ms):.2f}",
            f"{ins / first_insert:.2f}",
            f"{se:.2f}",
            f"{float(np.percentile(fig.search_ms, 95)):.2f}",
            f"{se / first_search:.2f}",
        )
    table.caption = (
        f"m = 16, ef_construction = 64, cosine; inserts in batches of {batch}, one commit a batch, after "
        f"{WARM_BATCHES} warming batches per restart; searches: nearest 10 by cosine, ef_search 40"
    )
    console.print(table)
