"""Gathers the status report from Postgres, Redis and the broker."""

from __future__ import annotations

from chatmem.adapters import pgcheck, pgvector_build, services
from chatmem.adapters.celery_queue import queue_depths
from chatmem.adapters.embedders import ONNX_FILE, PAIR_ONNX_FILE, QUERY_ONNX_FILE
from chatmem.adapters.metrics import SharedState
from chatmem.adapters.model_check import CACHE_FILE, check_models
from chatmem.adapters.sql import one, scalar
from chatmem.bootstrap import Container
from chatmem.producers.spool import Spool
from chatmem.schemas.settings import Settings
from chatmem.schemas.status import Lag, ModelState, PostgresState, ServiceState, StatusReport, StreamState
from chatmem.workers.supervisor import read_state

# Projection tables counted when present; later migrations add to this list's tables.
COUNTED_TABLES = ("events", "threads", "dead_letters", "messages", "episodes", "summaries", "facts", "artifacts")


def table_counts(c: Container) -> dict[str, int]:
    counts: dict[str, int] = {}
    with c.pool.connection() as conn:
        for table in COUNTED_TABLES:
            if scalar(conn, "SELECT to_regclass(%s)", (table,)) is None:
                continue
            # Table names come from the constant above, never from input.
            counts[table] = scalar(conn, f"SELECT count(*) FROM {table}")
        if scalar(conn, "SELECT to_regclass('commands_applied')") is not None:
            for status, n in conn.execute("SELECT status, count(*) FROM commands_applied GROUP BY status"):
                counts[f"commands_{status}"] = n
            counts["paused_threads"] = scalar(conn, "SELECT count(*) FROM threads WHERE NOT memory_on")
        if scalar(conn, "SELECT to_regclass('event_notices')") is not None:
            rows = conn.execute("SELECT kind, count(*) FROM event_notices GROUP BY kind").fetchall()
            kinds: dict[str, int] = {kind: n for kind, n in rows}
            counts["event_conflicts"] = kinds.get("conflict", 0)
            counts["clock_clamped"] = kinds.get("clock", 0)
        if scalar(conn, "SELECT to_regclass('erasures')") is not None:
            erasures, runs, shredded, deleted = one(
                conn,
                """SELECT count(*) FILTER (WHERE scope IN ('user', 'thread')),
                          count(*) FILTER (WHERE scope = 'retention'),
                          coalesce(sum((removed->>'events')::bigint) FILTER (WHERE scope = 'retention'), 0),
                          coalesce(sum((removed->>'events')::bigint) FILTER (WHERE scope = 'messages'), 0)
                   FROM erasures WHERE finished_at IS NOT NULL""",
            )
            counts |= {
                "erasures": erasures,
                "retention_runs": runs,
                "retention_shredded_events": shredded,
                "deleted_shredded_events": deleted,  # messages deleted on the platform, with their edits
            }
    if "artifacts" in counts:
        counts |= {f"attachments_{k}": n for k, n in c.attachment_store.status_counts().items()}
    return counts


# Events logged but not applied yet, per lagging thread.
_LAGS = """
    SELECT count(*) AS lag, e.thread_id
    FROM events e LEFT JOIN threads t USING (thread_id)
    WHERE e.stream_pos > coalesce(t.cursor_pos, 0)
    GROUP BY e.thread_id"""


def largest_lag(c: Container) -> Lag:
    with c.pool.connection() as conn:
        row = conn.execute(_LAGS + " ORDER BY lag DESC, e.thread_id LIMIT 1").fetchone()
    return Lag(max_events=row[0], thread_id=row[1]) if row else Lag(max_events=0, thread_id=None)


# A bounded label for /metrics: the dead letter's reason names the field, never the content.
_DEAD_LETTER_CLASS = """
    CASE WHEN reason LIKE 'malformed JSON%' THEN 'malformed_json'
         WHEN reason LIKE 'refused by Postgres%' THEN 'refused_by_postgres'
         WHEN reason ~ '^[a-z_]+[.:]' THEN 'invalid_' || substring(reason from '^([a-z_]+)')
         ELSE 'other' END"""


def spools(c: Container) -> list[Spool]:
    """This host's publish spools: the bots' and the importers' (bulk)."""
    folder = c.settings.resolved_spool_dir
    return [Spool(folder), Spool(folder / "bulk")]


def shared_state(c: Container) -> SharedState:
    """What /metrics reads on every scrape: the same queries as the report below (events,
    dead letters, stream pending, queue depths, lag), so the two agree by construction."""
    pending = c.stream.pending_count()
    depths = queue_depths(c.celery)
    spooled = sum(sp.pending_count() for sp in spools(c))
    refused = sum(sp.refused_count() for sp in spools(c))
    with c.pool.connection() as conn:
        if scalar(conn, "SELECT to_regclass('events')") is None:
            return SharedState(0, {}, pending, depths, spooled=spooled, spool_refused=refused)
        events = scalar(conn, "SELECT count(*) FROM events")
        dead = conn.execute(f"SELECT {_DEAD_LETTER_CLASS}, count(*) FROM dead_letters GROUP BY 1").fetchall()
        threads = scalar(conn, "SELECT count(*) FROM threads")
        lags = [n for n, _ in conn.execute(_LAGS)]
    return SharedState(
        events, {r: int(n) for r, n in dead}, pending, depths, lags, threads, spooled=spooled, spool_refused=refused
    )


# The buffer cache against the graph it should hold: a graph larger than the cache is reread
# from the operating system's cache by every insert and graph search (docs/platforms.md).
_BUFFERS = """
    SELECT pg_size_bytes(current_setting('shared_buffers')),
           (SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0)
            FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid JOIN pg_am a ON a.oid = x.relam
            WHERE i.indrelid = to_regclass('messages') AND a.amname = 'hnsw')"""


def postgres_state(c: Container) -> PostgresState:
    """The vector self-check against the server in use (embedded or configured), and its buffer
    cache next to the messages' graph."""
    pg, _ = services.embedded(c.settings)
    cpu = pgcheck.cpu_report().describe()
    try:
        check = pgcheck.self_check(c.urls.database_url, server_log=pg.log if pg else None)
    except pgcheck.VectorSupportError as error:
        return PostgresState(server_version=None, vector_version=None, self_check=str(error), cpu=cpu)
    with c.pool.connection() as conn:
        buffers, graph = one(conn, _BUFFERS)
        library = pgvector_build.loaded_from(scalar(conn, "SHOW dynamic_library_path")) if pg else None
    return PostgresState(
        server_version=check.server_version,
        vector_version=check.vector_version,
        self_check="ok",
        cpu=cpu,
        shared_buffers=int(buffers),
        vector_graph=int(graph),
        vector_library=library,
    )


def report(c: Container) -> StatusReport:
    s = c.settings
    counts = table_counts(c)
    migrated = "events" in counts  # before `chatmem migrate` there is nothing to count or lag
    return StatusReport(
        services=[ServiceState(**vars(st)) for st in services.status(s)],
        postgres=postgres_state(c),
        counts=counts,
        queues=queue_depths(c.celery),
        stream=StreamState(
            key=s.stream_key,
            length=c.stream.length(),
            pending=c.stream.pending_count(),
            watermark=c.store.watermark(s.stream_key) if migrated else 0,
            spooled=sum(sp.pending_count() for sp in spools(c)),
            spool_refused=sum(sp.refused_count() for sp in spools(c)),
        ),
        lag=largest_lag(c) if migrated else Lag(max_events=0, thread_id=None),
        migrated=migrated,
        processes=read_state(s.supervisor_state_file),
        models=[ModelState(**vars(m)) for m in check_models(models_in_use(s), cache=CACHE_FILE)],
    )


def models_in_use(s: Settings) -> list[str]:
    """The shipped ONNX files this configuration runs: the embedder's and the query encoder's
    while all-MiniLM-L6-v2 embeds on ONNX Runtime, the pair model while it is on."""
    minilm = s.embedding_provider == "minilm"
    return [
        *([ONNX_FILE.name] if minilm and s.embedding_backend == "onnx" else []),
        *([QUERY_ONNX_FILE.name] if minilm and s.recall_query_encoder else []),
        *([PAIR_ONNX_FILE.name] if s.segment_pair_model else []),
    ]
