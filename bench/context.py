"""`chatmem bench context`: build_context and recall latency (p50/p95) with 1M messages across
10k threads, next to mem0's own search latency on the same Postgres in the same run. Printed,
never asserted. Runs in a scratch database (see bench/ingest.py).

The corpus is synthetic and bulk-loaded with COPY (the pipeline's own rate is `bench pipeline`):
topic-word texts, random unit vectors for stored messages and summaries (embedding a million
texts would take an hour here; search cost does not depend on what the vectors mean), a
final summary per episode, a few facts per user. Queries are embedded by the real model."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

import numpy as np
from rich.console import Console
from rich.table import Table

from chatmem.adapters import migrate
from chatmem.adapters.projections import MESSAGE_COLUMNS, MESSAGE_TYPES
from chatmem.bench.facts import _pct, statements
from chatmem.bench.host import machine
from chatmem.bench.ingest import scratch
from chatmem.bench.pipeline import TOPICS
from chatmem.memory.fact_jobs import store_fact
from chatmem.memory.facts import extract
from chatmem.schemas.read import Scope
from chatmem.schemas.settings import Settings

EPISODE_LEN = 25


def _text(rng: random.Random, topic: str) -> str:
    words = TOPICS[topic].split()
    return " ".join(rng.choice(words) for _ in range(rng.randint(8, 16))).capitalize() + "."


def load(  # noqa: ANN201
    c,
    rng: random.Random,
    n_threads: int,
    per_thread: int,
    n_users: int,
    console: Console,
    with_hnsw: bool,  # noqa: ANN001
):
    dim = c.settings.vector_dim
    topics = list(TOPICS)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    vec_rng = np.random.default_rng(5)
    with c.pool.connection() as conn:
        # Indexes are built after the load, as one would for a bulk import.
        for table in migrate.VECTOR_TABLES:
            conn.execute(f"DROP INDEX IF EXISTS {migrate.vector_index_name(table, dim)}")
        conn.execute("DROP INDEX IF EXISTS messages_tsv")
        conn.commit()
        with conn.cursor() as cur:
            with cur.copy("COPY threads (thread_id, generation, message_count, episode_count) FROM STDIN") as cp:
                for t in range(n_threads):
                    cp.write_row((f"t{t}", 1, per_thread, -(-per_thread // EPISODE_LEN)))
            with cur.copy("COPY thread_members (thread_id, user_id) FROM STDIN") as cp:
                for t in range(n_threads):
                    cp.write_row((f"t{t}", f"u{t % n_users}"))
                    cp.write_row((f"t{t}", "bot"))
            with cur.copy(
                "COPY episodes (episode_id, generation, thread_id, ordinal, start_seq, end_seq, status, opened_by,"
                " started_at, archived) FROM STDIN"
            ) as cp:
                for t in range(n_threads):
                    episodes = -(-per_thread // EPISODE_LEN)
                    for e in range(episodes):
                        cp.write_row(
                            (
                                f"t{t}#{e + 1}",
                                1,
                                f"t{t}",
                                e + 1,
                                e * EPISODE_LEN + 1,
                                (e + 1) * EPISODE_LEN,
                                "closed",
                                "gap",
                                t0,
                                e < episodes - 1,  # archived: every episode but the newest
                            )
                        )
            started = time.perf_counter()
            cols = ", ".join(MESSAGE_COLUMNS)
            with cur.copy(f"COPY messages ({cols}) FROM STDIN WITH (FORMAT BINARY)") as cp:
                cp.set_types(list(MESSAGE_TYPES))
                for t in range(n_threads):
                    vectors = vec_rng.standard_normal((per_thread, dim)).astype(np.float32)
                    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                    topic = rng.choice(topics)
                    for i in range(per_thread):
                        if i % EPISODE_LEN == 0:
                            topic = rng.choice(topics)
                        seq = i + 1
                        cp.write_row(
                            (
                                f"t{t}",
                                1,
                                seq,
                                f"t{t}-{seq}",
                                t * per_thread + seq,
                                f"t{t}#{i // EPISODE_LEN + 1}",
                                f"u{t % n_users}" if i % 2 == 0 else "bot",
                                "user" if i % 2 == 0 else "assistant",
                                _text(rng, topic),
                                f"m{seq}",
                                t0 + timedelta(minutes=seq),
                                vectors[i],
                            )
                        )
                    if t and t % 2000 == 0:
                        console.print(f"  loaded {t * per_thread:,} messages")
            with cur.copy(
                "COPY summaries (summary_key, generation, thread_id, episode_id, kind, level, from_seq, upto_seq, text,"
                " content, model, prompt_version, embedding, is_active) FROM STDIN WITH (FORMAT BINARY)"
            ) as cp:
                cp.set_types(
                    [
                        "text",
                        "int4",
                        "text",
                        "text",
                        "text",
                        "int4",
                        "int4",
                        "int4",
                        "text",
                        "jsonb",
                        "text",
                        "text",
                        "vector",
                        "bool",
                    ]
                )
                for t in range(n_threads):
                    for e in range(-(-per_thread // EPISODE_LEN)):
                        v = vec_rng.standard_normal(dim).astype(np.float32)
                        cp.write_row(
                            (
                                f"t{t}#{e + 1}:final",
                                1,
                                f"t{t}",
                                f"t{t}#{e + 1}",
                                "final",
                                1,
                                e * EPISODE_LEN + 1,
                                (e + 1) * EPISODE_LEN,
                                _text(rng, rng.choice(topics)),
                                "{}",
                                "bench",
                                "bench",
                                v / np.linalg.norm(v),
                                True,
                            )
                        )
        conn.commit()
        console.print(f"  messages and summaries copied in {time.perf_counter() - started:.0f}s; building indexes")
        started = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '2GB'")
        conn.execute("CREATE INDEX messages_tsv ON messages USING gin (tsv)")
        conn.commit()
        gin_s = time.perf_counter() - started
    if with_hnsw:
        started = time.perf_counter()
        with c.pool.connection() as conn:
            conn.execute("SET maintenance_work_mem = '4GB'")
            conn.execute(
                f"CREATE INDEX {migrate.vector_index_name('messages', dim)} ON messages USING hnsw "
                f"((embedding::vector({dim})) vector_cosine_ops) WHERE vector_dims(embedding) = {dim}"
            )
        console.print(f"  GIN index {gin_s:.0f}s, HNSW index {time.perf_counter() - started:.0f}s")
    else:
        console.print(f"  GIN index {gin_s:.0f}s; HNSW index not built (reads scoped to a user's threads never use it)")
    with c.pool.connection() as conn:
        conn.execute("ANALYZE")


def run(
    settings: Settings,
    console: Console,
    *,
    n_messages: int = 1_000_000,
    n_threads: int = 10_000,
    n_users: int = 2_000,
    n_queries: int = 300,
    n_memories: int = 2_000,
    with_hnsw: bool = False,
) -> dict:
    rng = random.Random(3)
    per_thread = n_messages // n_threads
    with scratch(settings) as c:
        started = time.perf_counter()
        load(c, rng, n_threads, per_thread, n_users, console, with_hnsw)
        load_s = time.perf_counter() - started
        # Facts through the project's own path (structured row + mem0), for a slice of the users.
        texts = statements(rng, n_memories)
        for i, text in enumerate(texts):
            fact = extract(text)
            if fact:
                store_fact(
                    c.fact_store,
                    c.mem0,
                    user_id=f"u{i % n_users}",
                    thread_id=f"t{i % n_threads}",
                    generation=1,
                    episode_id=None,
                    fact=fact[0],
                    event_ids=[f"t{i % n_threads}-1"],
                    source="extracted",
                )
        queries = [(f"t{rng.randrange(n_threads)}", _text(rng, rng.choice(list(TOPICS)))) for _ in range(n_queries)]
        # The query's embedding is the model's cost, shown on its own row; the calls below reuse it.
        embed_s = []
        for _, q in queries:
            t0 = time.perf_counter()
            c.recall_query_embedder.embed([q])
            embed_s.append(time.perf_counter() - t0)
        c.build_context(queries[0][0], f"u{int(queries[0][0][1:]) % n_users}", queries[0][1])  # warm up
        timings: dict[str, list[float]] = {
            "build_context": [],
            "recall (thread)": [],
            "recall (user)": [],
            "mem0 search": [],
            "tokens": [],
        }
        for thread, query in queries:
            user = f"u{int(thread[1:]) % n_users}"
            t0 = time.perf_counter()
            bundle = c.build_context(thread, user, query)
            timings["build_context"].append(time.perf_counter() - t0)
            timings["tokens"].append(bundle.tokens / 1000)
            t0 = time.perf_counter()
            c.recall(user, query, scope=Scope.ALL, limit=10, thread_id=thread)
            timings["recall (thread)"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.recall(user, query, scope=Scope.ALL, limit=10)
            timings["recall (user)"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.mem0.search(query, user_id=user, limit=10)
            timings["mem0 search"].append(time.perf_counter() - t0)
        with c.pool.connection() as conn:
            n_msg = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
            n_mem = conn.execute("SELECT count(*) FROM chatmem_memories").fetchone()[0]
            counter = c.token_counter.name

    table = Table(
        title=f"chatmem bench context · {n_msg:,} messages, {n_threads:,} threads, {n_users:,} users, "
        f"{n_mem:,} mem0 memories · {machine()} · {datetime.now(UTC):%Y-%m-%d}"
    )
    for col in ("call", "p50 ms", "p95 ms", "target p95"):
        table.add_column(col)
    timings["query embedding (MiniLM)"] = embed_s
    for name in ("build_context", "recall (thread)", "recall (user)", "mem0 search", "query embedding (MiniLM)"):
        target = {"build_context": "≤ 50 ms", "recall (thread)": "≤ 50 ms", "recall (user)": "≤ 50 ms"}.get(name, "")
        table.add_row(name, f"{_pct(timings[name], 0.5):.1f}", f"{_pct(timings[name], 0.95):.1f}", target)
    console.print(table)
    console.print(
        f"load {load_s:.0f}s · {n_queries} queries · context size p50 {_pct(timings['tokens'], 0.5):.0f} tokens "
        f"({counter}) · the query embedding is computed once per query, on its own row"
    )
    return {k: (_pct(v, 0.5), _pct(v, 0.95)) for k, v in timings.items()}
