"""Shared fixtures. Integration and e2e tests run against the embedded Postgres and Redis,
started here once per session in a temporary folder; each test gets a fresh database (cloned
from a migrated template) and an empty Redis."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis

for key in [k for k in os.environ if k.upper().startswith("CHATMEM_")]:
    del os.environ[key]  # a developer's own settings must not leak into the tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MEM0_TELEMETRY", "False")

from chatmem.adapters import migrate  # noqa: E402
from chatmem.adapters.services import EmbeddedPostgres, EmbeddedRedis, ServiceUrls  # noqa: E402
from chatmem.bootstrap import Container  # noqa: E402
from chatmem.schemas.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "chatmem_template"
_db_counter = itertools.count()


def _with_db(url: str, name: str) -> str:
    head, _, query = url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> Iterator[dict]:
    data = tmp_path_factory.mktemp("services")
    pg, rd = EmbeddedPostgres(data), EmbeddedRedis(data)
    pg_url, redis_url = pg.start(), rd.start()
    admin = _with_db(pg_url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    migrate.migrate(_with_db(pg_url, TEMPLATE))
    yield {"pg": pg, "redis": rd, "admin": admin, "pg_url": pg_url, "redis_url": redis_url}
    rd.stop()
    pg.stop()


@pytest.fixture
def fresh_db(embedded) -> str:
    name = f"t_{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(embedded["admin"], autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    return _with_db(embedded["pg_url"], name)


@pytest.fixture
def settings_factory(embedded, fresh_db, tmp_path) -> Callable[..., Settings]:
    redis.Redis.from_url(embedded["redis_url"]).flushall()

    def make(**overrides) -> Settings:
        values = {
            "database_url": fresh_db,
            "redis_url": embedded["redis_url"],
            "data_dir": tmp_path / "data",
            "ingest_block_ms": 50,
            "ingest_claim_idle_ms": 1000,
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def settings(settings_factory) -> Settings:
    return settings_factory()


@pytest.fixture
def container(settings) -> Iterator[Container]:
    c = Container(settings, ServiceUrls(settings.database_url, settings.redis_url, False, False))
    yield c
    c.close()


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a chatmem subprocess needs to use the same settings."""
    return settings.as_env()


def status_json(settings: Settings) -> dict:
    """`chatmem status --json`, run as an operator would."""
    out = subprocess.run(
        [sys.executable, "-m", "chatmem.api.cli", "status", "--json"],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def spawn(settings: Settings, *args: str, **overrides: str) -> subprocess.Popen:
    env = settings_env(settings)
    env.update({f"CHATMEM_{k.upper()}": str(v) for k, v in overrides.items()})
    return subprocess.Popen(
        [sys.executable, "-m", "chatmem.api.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def scalar(c: Container, sql: str, *params) -> object:
    with c.pool.connection() as conn:
        return conn.execute(sql, params).fetchone()[0]


def logged_events(c: Container, thread_id: str | None = None) -> list[dict]:
    """The event log in publish order, content opened (it is sealed at rest)."""
    from chatmem.adapters.keys_pg import wrapped_key_sql

    with c.pool.connection() as conn:
        rows = conn.execute(
            f"""SELECT event_id, thread_id, user_id, occurred_at, stream_pos, payload, {wrapped_key_sql("events")}
                FROM events WHERE %(t)s::text IS NULL OR thread_id = %(t)s ORDER BY stream_pos""",
            {"t": thread_id},
        ).fetchall()
    return [
        {"event_id": e, "thread_id": t, "user_id": u, "occurred_at": at, "stream_pos": pos,
         "payload": c.event_keys.open(payload, wrapped)}
        for e, t, u, at, pos, payload, wrapped in rows
    ]  # fmt: skip


def stop(proc: subprocess.Popen, timeout: float = 20) -> str:
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""
