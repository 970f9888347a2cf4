"""The embedded services on machines unlike this one: started by a normal user, by root from a
folder only root may enter, from a folder whose path has a space in it, from shells whose locale
the machine lacks or that knows only ASCII, and on a folder made with a locale this machine lacks.

Most people run chatmem as themselves, not as root, often where there is no per-user runtime
folder (a container, `su`, cron, CI) and after another account, root or a colleague, already
ran it on the machine. This suite runs as root here, so that case is run as `nobody`; where the
suite itself runs unprivileged, every embedded test is already that check. Project folders
with spaces are common on laptops (`~/My Projects/bot`)."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
import redis

from chatmem.adapters import pglocale
from chatmem.adapters.services import EmbeddedPostgres, EmbeddedRedis, ServiceUnavailable
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

START_BOTH = """
import sys
from pathlib import Path
from tests.integration.test_user_machines import start_both
start_both(Path(sys.argv[1]))
"""


def start_both(data: Path) -> None:
    """Start the embedded Postgres and Redis under `data`, use each, stop both."""
    pg, rd = EmbeddedPostgres(data), EmbeddedRedis(data)
    try:
        url = pg.start()
        assert pg.check is not None  # the vector self-check ran on the new server
        with psycopg.connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            print("postgres", round(conn.execute("SELECT '[1,2]'::vector <=> '[2,1]'::vector").fetchone()[0], 6))
        r = redis.Redis.from_url(rd.start())
        print("redis", r.ping(), r.info("server")["redis_version"])
        r.close()
    finally:
        rd.stop()
        pg.stop()


def as_nobody(python: str = sys.executable) -> list[str] | None:
    """A command prefix that runs as `nobody` with one extra right: to read and enter any
    folder (CAP_DAC_READ_SEARCH), so it can use this venv and checkout, which may sit in a folder
    only root enters (here, /root). Writing stays as restricted as for any normal user."""
    setpriv = shutil.which("setpriv")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return None
    if setpriv is None:
        return None
    prefix = [
        setpriv,
        "--reuid=nobody",
        "--regid=" + grp.getgrgid(nobody.pw_gid).gr_name,
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
    ]
    probe = subprocess.run([*prefix, python, "-c", "import os; print(os.geteuid())"], capture_output=True)
    return prefix if probe.returncode == 0 and probe.stdout.decode().strip() != "0" else None


@pytest.mark.skipif(os.geteuid() != 0, reason="the suite runs unprivileged: every embedded test is this check")
def test_a_normal_user_starts_the_embedded_services_after_root_ran_them():
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("cannot run a process as nobody here (no such user, no setpriv, or no capabilities to hand on)")
    user = pwd.getpwnam("nobody")
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8"}
    # What a root run leaves where no runtime folder exists: the embedded server's start lock in
    # the shared temp folder, root's and not writable by others (it made `make run` fail for a
    # normal user with `PermissionError: /tmp/.lockfile`).
    shared_lock = Path(tempfile.gettempdir()) / ".lockfile"
    if not shared_lock.exists():
        shared_lock.touch(mode=0o644)
    folder = Path(tempfile.mkdtemp(prefix="chatmem-unprivileged-"))
    try:
        os.chmod(folder, 0o755)
        os.chown(folder, user.pw_uid, user.pw_gid)
        run = subprocess.run(
            [*prefix, sys.executable, "-c", START_BOTH, str(folder / "data")],
            env=env,
            capture_output=True,
            timeout=180,
        )
        out = run.stdout.decode()
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        assert "postgres 0.2" in out  # vectors work
        assert "redis True" in out
        lock_dir = Path(tempfile.gettempdir()) / f"chatmem-pgserver-{user.pw_uid}"
        assert lock_dir.is_dir() and lock_dir.stat().st_uid == user.pw_uid
        assert lock_dir.stat().st_mode & 0o077 == 0
        assert (folder / "data" / "postgres").stat().st_uid == user.pw_uid  # the server ran as that user
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's server runs as another user")
def test_root_starts_postgres_in_a_private_folder_without_opening_it_to_anyone(tmp_path, capsys):
    """root's home is 0700, and a bot cloned there keeps its `.env` in it. The server runs as the
    system user `pgserver`, which must pass through; nobody else may."""
    home = tmp_path / "root-home"
    home.mkdir()
    home.chmod(0o700)
    (home / ".env").write_text("TELEGRAM_BOT_TOKEN=123:abc\n")
    (home / ".env").chmod(0o644)  # as an editor leaves it
    start_both(home / "bot" / ".chatmem")
    assert "postgres 0.2" in capsys.readouterr().out
    assert home.stat().st_mode & 0o007 == 0  # others gained nothing
    for user, may in (("pgserver", True), ("nobody", False)):
        passes = subprocess.run(["test", "-x", str(home)], user=user, cwd="/").returncode == 0
        reads = subprocess.run(["cat", str(home / ".env")], user=user, cwd="/", capture_output=True).returncode == 0
        assert (passes, reads) == (may, may), user
    lists = subprocess.run(["ls", str(home)], user="pgserver", cwd="/", capture_output=True)
    assert lists.returncode != 0  # passage only: the folder's names stay private


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's server runs as another user")
def test_as_root_the_server_runs_with_its_own_group_not_roots(tmp_path):
    pg = EmbeddedPostgres(tmp_path / "data")
    try:
        pg.start()
        pid = int((pg.pgdata / "postmaster.pid").read_text(encoding="utf-8").split()[0])
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines()
        )
        gid = pwd.getpwnam("pgserver").pw_gid
        assert status["Uid"].split()[0] == str(pwd.getpwnam("pgserver").pw_uid)
        assert set(status["Gid"].split()) == {str(gid)} and status["Groups"].split() in ([], [str(gid)])
    finally:
        pg.stop()


def test_a_data_folder_with_a_space_in_its_path(tmp_path, capsys):
    """Postgres is started with `-k SOCKET_DIR` unquoted and redis.conf splits on spaces: both
    failed to start from `.../with space/.chatmem`."""
    start_both(tmp_path / "with space" / ".chatmem")
    out = capsys.readouterr().out
    assert "postgres 0.2" in out
    assert "redis True" in out


@pytest.mark.parametrize(
    "shell",
    [
        {"LANG": "xx_NOWHERE.UTF-8"},  # an image that names a locale it never generated
        {"LANG": "C.UTF-8", "LC_CTYPE": "UTF-8"},  # what an SSH session from macOS forwards
        {"LC_ALL": "C"},  # a bare environment: initdb runs, but only ASCII letters are letters
    ],
)
def test_a_shell_locale_the_machine_lacks_or_that_knows_only_ascii(tmp_path, monkeypatch, shell):
    """initdb refused to run with the first two (`invalid locale settings`), and the third made a
    database where Cyrillic text did not fold to lower case, so text search missed it."""
    for name in ("LC_ALL", "LC_CTYPE", "LC_COLLATE", "LANG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in shell.items():
        monkeypatch.setenv(name, value)
    pg = EmbeddedPostgres(tmp_path)
    try:
        with psycopg.connect(pg.start()) as conn:
            ctype, folded, matched = conn.execute(
                "SELECT datctype, lower('ПРИВЕТ Ёлка'), "
                "to_tsvector('simple', 'Привет, мир') @@ plainto_tsquery('simple', 'привет') "
                "FROM pg_database WHERE datname = current_database()"
            ).fetchone()
        assert ctype in pglocale.CANDIDATES
        assert (folded, matched) == ("привет ёлка", True)
        assert os.environ.get("LC_ALL") == shell.get("LC_ALL")  # the process's environment is as it was
    finally:
        pg.stop()


def test_a_folder_made_where_a_locale_exists_that_this_machine_lacks(tmp_path):
    """A folder copied from a machine with a locale this one does not have: the server refused
    to start (`invalid value for parameter "lc_messages"`) behind a pg_ctl traceback."""
    pg = EmbeddedPostgres(tmp_path)
    pg.start()
    pg.stop()
    conf = pg.pgdata / "postgresql.conf"
    conf.write_text(
        re.sub(
            r"^lc_messages = '[^']*'", "lc_messages = 'xx_NOWHERE.UTF-8'", conf.read_text(encoding="utf-8"), flags=re.M
        )
    )
    before = conf.read_text(encoding="utf-8")
    with pytest.raises(ServiceUnavailable) as raised:
        pg.start()
    assert "xx_NOWHERE.UTF-8" in str(raised.value) and "chatmem services restore" in str(raised.value)
    assert conf.read_text(encoding="utf-8") == before and pg.url() is None
