"""`chatmem bench facts`: facts written per second, and fact search latency over 10k facts across
100 users: mem0's search next to the project's own direct pgvector query on the same table, in
the same run. Printed, never asserted. Runs in a scratch database (see bench/ingest.py).

Embeddings are computed once up front, in batches, so the write and search figures measure the
fact path itself (Postgres, mem0, pgvector) rather than the model; the model's own rate is what
`chatmem bench pipeline` reports."""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from chatmem.adapters.mem0_store import COLLECTION
from chatmem.bench.host import machine
from chatmem.bench.ingest import scratch
from chatmem.memory.fact_jobs import store_fact
from chatmem.memory.facts import extract
from chatmem.schemas.settings import Settings

CITIES = "Lisbon Berlin Riga Oslo Porto Graz Kyoto Lima Austin Quebec Tartu Bergen".split()
THINGS = (
    "tea coffee trains window seats aisle seats jazz opera hiking cycling chess sushi ramen tacos "
    "podcasts audiobooks mornings evenings museums beaches mountains"
).split()
FOODS = "peanuts shellfish gluten lactose eggs sesame soy kiwi".split()
COMPANIES = "Acme Globex Initech Umbrella Hooli Vandelay Stark Wayne".split()


def statements(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(f"I live in {rng.choice(CITIES)} district {i}.")
        elif kind == 1:
            out.append(f"I prefer {rng.choice(THINGS)} number {i}.")
        elif kind == 2:
            out.append(f"I'm allergic to {rng.choice(FOODS)} type {i}.")
        elif kind == 3:
            out.append(f"I work at {rng.choice(COMPANIES)} team {i}.")
        else:
            out.append(f"I never {rng.choice(['fly', 'drive', 'cook', 'run'])} on day {i}.")
    return out


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(
    settings: Settings, console: Console, *, n_facts: int = 10_000, n_users: int = 100, n_queries: int = 200
) -> dict:
    rng = random.Random(11)
    per_user = n_facts // n_users
    texts = statements(rng, per_user)
    queries = [
        f"where do I live {rng.choice(CITIES)}" if i % 2 else f"what food am I allergic to {i}"
        for i in range(n_queries)
    ]
    with scratch(settings) as c:
        t0 = time.perf_counter()
        c.embedder.embed(texts + queries)  # once, batched: the write path then finds them cached
        embed_s = time.perf_counter() - t0
        mem, store = c.mem0, c.fact_store

        t0 = time.perf_counter()
        written = 0
        for u in range(n_users):
            user = f"bench-user-{u}"
            for text in texts:
                fact = extract(text)[0]
                store_fact(
                    store,
                    mem,
                    user_id=user,
                    thread_id=f"bench-{u}",
                    generation=1,
                    episode_id=None,
                    fact=fact,
                    event_ids=[],
                    source="extracted",
                )
                written += 1
        write_rate = written / (time.perf_counter() - t0)

        mem0_lat, direct_lat, overlap = [], [], []
        with c.pool.connection() as conn:
            for i, q in enumerate(queries):
                user = f"bench-user-{rng.randrange(n_users)}"
                t = time.perf_counter()
                hits = mem.search(q, user_id=user, limit=5)
                mem0_lat.append(time.perf_counter() - t)
                t = time.perf_counter()
                vector = c.embedder.embed([q])[0]
                with conn.transaction():
                    # pgvector >= 0.8: keep scanning the HNSW graph until k rows pass the filter.
                    conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                    rows = conn.execute(
                        f"""SELECT id::text FROM {COLLECTION} WHERE payload->>'user_id' = %s
                            ORDER BY vector <=> %s LIMIT 5""",
                        (user, vector),
                    ).fetchall()
                direct_lat.append(time.perf_counter() - t)
                if i < 50 and hits:
                    overlap.append(len({h["id"] for h in hits} & {r[0] for r in rows}) / len(hits))

    table = Table(title=f"chatmem bench facts · {machine()} · {datetime.now(UTC):%Y-%m-%d}")
    for col in ("measure", "mem0 search", "direct pgvector query", "ratio"):
        table.add_column(col)
    table.add_row(
        "search p50",
        f"{_pct(mem0_lat, 0.5):.1f} ms",
        f"{_pct(direct_lat, 0.5):.1f} ms",
        f"{_pct(mem0_lat, 0.5) / _pct(direct_lat, 0.5):.1f}×",
    )
    table.add_row(
        "search p95",
        f"{_pct(mem0_lat, 0.95):.1f} ms",
        f"{_pct(direct_lat, 0.95):.1f} ms",
        f"{_pct(mem0_lat, 0.95) / _pct(direct_lat, 0.95):.1f}×",
    )
    table.add_row("same top-5 (share)", "", f"{statistics.fmean(overlap):.0%}" if overlap else "-", "")
    console.print(
        f"{written:,} facts over {n_users} users · facts written {write_rate:,.0f}/s "
        f"(Postgres + mem0, embeddings cached) · embedding them first took {embed_s:.1f}s"
    )
    console.print(table)
    return {"write_rate": write_rate, "mem0_p50_ms": _pct(mem0_lat, 0.5), "direct_p50_ms": _pct(direct_lat, 0.5)}
