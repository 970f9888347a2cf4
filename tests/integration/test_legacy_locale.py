"""chatmem in a shell set to a legacy locale, ISO-8859-1, as older European servers still are.
Python then reads and writes text files and its own output in that encoding unless told
otherwise: a UTF-8 export's "Café" was imported as "CafÃ©", `chatmem export` failed on the first
emoji, and so did every command that printed one. The locale is built with localedef into the
test's own folder (LOCPATH), so no root is needed."""

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from chatmem.workers.ingest import IngestRunner
from tests.conftest import ROOT, logged_events
from tests.integration.test_episodes import Driver
from tests.integration.test_user_machines import START_BOTH
from tests.locomo_sample import SAMPLE

pytestmark = pytest.mark.integration

LOCALE = "de_DE.ISO-8859-1"
TEXT = "Café crème für Маша 😀"  # Latin-1 holds the first words, not the Cyrillic or the emoji


@pytest.fixture(scope="module")
def latin1(tmp_path_factory) -> dict[str, str]:
    """The variables of a shell set to ISO-8859-1 (UTF-8 mode and stream overrides left out)."""
    if shutil.which("localedef") is None:
        pytest.skip("no localedef here to build an ISO-8859-1 locale")
    folder = tmp_path_factory.mktemp("locales")
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "ISO-8859-1", str(folder / LOCALE)], capture_output=True)
    if not (folder / LOCALE).is_dir():
        pytest.skip(f"localedef could not build {LOCALE}: {made.stderr.decode(errors='replace')[-200:]}")
    return {"LOCPATH": str(folder), "LC_ALL": LOCALE, "LANG": LOCALE}


def chatmem(settings, latin1: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in settings.as_env().items() if k not in ("PYTHONUTF8", "PYTHONIOENCODING")}
    return subprocess.run(
        [sys.executable, "-m", "chatmem.api.cli", *(a.encode("latin-1") for a in args)],  # as its terminal types
        env={**env, **latin1, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        timeout=180,
    )


def test_the_locale_is_the_legacy_one(latin1):
    # Else the test below would pass on UTF-8 alone.
    probe = "import locale, sys; print(locale.getpreferredencoding(), sys.stdout.encoding, sys.flags.utf8_mode)"
    seen = subprocess.run([sys.executable, "-c", probe], env={**latin1, "PATH": ""}, capture_output=True, text=True)
    assert seen.stdout.split() == ["ISO-8859-1", "iso8859-1", "0"]


def test_a_latin1_machine_imports_exports_and_prints_every_character(container, tmp_path, latin1):
    sample = json.loads(json.dumps(SAMPLE))
    sample[0]["conversation"]["session_1"][0]["text"] = TEXT
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps(sample, ensure_ascii=False), encoding="utf-8")  # as most files are written
    run = lambda *args: chatmem(container.settings, latin1, *args)  # noqa: E731

    imported = run("import", "locomo", str(data))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    events = logged_events(container)
    assert {e["payload"]["platform_message_id"]: e["payload"]["text"] for e in events}["D1:1"] == TEXT
    thread, user = events[0]["thread_id"], events[0]["user_id"]

    exported = run("export", "--user", user, "--out", str(tmp_path / "export"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    export = json.loads((tmp_path / "export" / "export.json").read_bytes().decode("utf-8"))
    assert TEXT in [e["payload"]["text"] for e in export["events"]]

    Driver(container).advance(thread, batch_size=100)  # what the segment worker does
    found = run("recall", "crème", "--user", user, "--thread", thread, "--json")
    assert found.returncode == 0, found.stderr
    # JSON's own escapes where the terminal's encoding lacks a character: any JSON reader reads it.
    assert TEXT in [hit["snippet"] for hit in json.loads(found.stdout)["hits"]]
    shown = run("recall", "crème", "--user", user, "--thread", thread)
    assert shown.returncode == 0, shown.stderr
    # A table for people: what ISO-8859-1 holds as itself, the rest escaped.
    assert "Café crème für \\u041c\\u0430\\u0448\\u0430 \\U0001f600".encode("latin-1") in shown.stdout


def test_the_embedded_services_start_from_a_latin1_shell_in_a_folder_named_with_an_accent(tmp_path, latin1):
    # The file system names the folder in bytes; redis.conf must name it in the same bytes, which
    # a file written as UTF-8 from a name read as ISO-8859-1 would not.
    data = tmp_path / "Projekte für Maša" / ".chatmem"
    run = subprocess.run(
        [sys.executable, "-c", START_BOTH, os.fsencode(data)],
        env={**{k: v for k, v in os.environ.items() if k not in ("PYTHONUTF8", "PYTHONIOENCODING")}, **latin1},
        cwd=ROOT,
        capture_output=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
    assert b"postgres 0.2" in run.stdout and b"redis True" in run.stdout
