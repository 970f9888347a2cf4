"""`chatmem import telegram` as a user runs it: the real CLI in a subprocess against the embedded
Postgres and Redis, then ingest, then the same import again (nothing new is published)."""

import json
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from chatmem.workers.ingest import IngestRunner
from tests.conftest import ROOT, logged_events, scalar, settings_env
from tests.unit.test_importers import zipped

pytestmark = pytest.mark.integration

TELEGRAM = ROOT / "tests" / "fixtures" / "exports" / "telegram"


def chatmem(settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chatmem.api.cli", *args],
        env={**settings_env(settings), "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_telegram_import_is_stored_once_and_a_second_run_publishes_nothing(container):
    # The folder is given: result.json is found in it. Message 12 has no unix time: exit 1.
    first = chatmem(container.settings, "import", "telegram", str(TELEGRAM))
    assert first.returncode == 1, first.stdout + first.stderr
    assert "10 new events published" in first.stdout
    assert "message 12 in chat -4242" in first.stdout and "Traceback" not in first.stdout + first.stderr

    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == 10
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0
    rows = [
        (p["platform_message_id"], e["thread_id"], e["user_id"], p.get("reply_to"), e["occurred_at"], p["attachments"])
        for e in logged_events(container)
        for p in [e["payload"]]
    ]
    assert [r[0] for r in rows] == ["2", "3", "4", "5", "6", "9", "10", "11", "13", "14"]
    assert {r[1] for r in rows} == {"telegram:-4242"}
    by_id = {r[0]: r for r in rows}
    assert by_id["3"][2] == "telegram:222" and by_id["3"][3] == "2"
    # the export's local "date" is 13:00 (UTC+2); stored is the unix time, in UTC
    assert by_id["2"][4] == datetime(2024, 3, 1, 11, 0, tzinfo=UTC)
    (photo,) = by_id["4"][5]
    assert photo["url"] == (TELEGRAM / "photos" / "photo_1@01-03-2024_13-05-00.jpg").as_uri()
    assert Path(unquote(urlsplit(photo["url"]).path)).is_file()  # what the attachments worker will read

    again = chatmem(container.settings, "import", "telegram", str(TELEGRAM / "result.json"))
    assert "0 new events published" in again.stdout, again.stdout + again.stderr
    assert "already imported" in again.stdout
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == 10


def test_a_file_that_is_not_an_export_gets_a_message_not_a_traceback(container, tmp_path):
    wrong = tmp_path / "notes.json"
    wrong.write_text('{"notes": []}')
    out = chatmem(container.settings, "import", "telegram", str(wrong))
    assert out.returncode == 2
    assert "not a Telegram export: no 'messages' or 'chats.list' key" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_half_an_emoji_in_an_export_is_imported_as_the_replacement_character(container, tmp_path):
    # A ChatGPT export written ASCII-escaped, one text cut inside "😀" after its first half and
    # one before its second: both halves alone. Before, the second ended the import.
    chatgpt = ROOT / "tests" / "fixtures" / "exports" / "chatgpt" / "conversations.json"
    conversations = json.loads(chatgpt.read_text(encoding="utf-8"))
    parts = conversations[0]["mapping"]["u1"]["message"]["content"]["parts"]
    parts[0] = "\ude00 a grey cat, named for the tea \ud83d"
    (tmp_path / "conversations.json").write_text(json.dumps(conversations, ensure_ascii=True))
    out = chatmem(container.settings, "import", "chatgpt", str(tmp_path))
    assert "Traceback" not in out.stdout + out.stderr and "new events published" in out.stdout, out.stdout
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    texts = [e["payload"]["text"] for e in logged_events(container)]
    assert "\ufffd a grey cat, named for the tea \ufffd" in texts
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0

    # A surrogate written as bytes is not UTF-8 at all: the import stops and says where.
    damaged = tmp_path / "damaged" / "conversations.json"
    damaged.parent.mkdir()
    damaged.write_bytes((tmp_path / "conversations.json").read_bytes().replace(b"\\ude00", b"\xed\xb8\x80"))
    out = chatmem(container.settings, "import", "chatgpt", str(damaged.parent))
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
    assert "not valid JSON near byte" in out.stdout and "not UTF-8" in out.stdout, out.stdout


def test_whatsapp_import_reads_the_phones_times_in_its_zone_and_a_second_run_publishes_nothing(container):
    folder = ROOT / "tests" / "fixtures" / "exports" / "whatsapp_ios" / "WhatsApp Chat - Anna"
    first = chatmem(container.settings, "import", "whatsapp", str(folder), "--timezone", "Europe/Berlin")
    assert first.returncode == 0, first.stdout + first.stderr
    # what was read from the file is said before the import, so a wrong guess can be corrected
    assert "_chat.txt: thread whatsapp:Anna, dates day first (13.03.24), times in Europe/Berlin" in first.stdout
    assert "5 new events published" in first.stdout, first.stdout

    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    rows = [(e["user_id"], e["thread_id"], e["occurred_at"], e["payload"]) for e in logged_events(container)]
    assert [(r[0], r[3]["text"]) for r in rows][:2] == [
        ("whatsapp:Anna", "Hallo Ben! Wie war Lissabon?"),
        ("whatsapp:Ben", ""),
    ]
    assert {r[1] for r in rows} == {"whatsapp:Anna"}
    assert rows[0][2] == datetime(2024, 3, 1, 8, 6, tzinfo=UTC)  # 09:06 in Berlin, winter time
    (photo,) = rows[1][3]["attachments"]
    assert Path(unquote(urlsplit(photo["url"]).path)) == folder / "00000003-PHOTO-2024-03-01-09-07-30.jpg"

    again = chatmem(container.settings, "import", "whatsapp", str(folder), "--timezone", "Europe/Berlin")
    assert "0 new events published" in again.stdout and again.returncode == 0, again.stdout + again.stderr
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == 5

    wrong = chatmem(container.settings, "import", "whatsapp", str(folder), "--timezone", "Berlin")
    assert wrong.returncode == 2 and "unknown time zone 'Berlin'" in wrong.stdout
    assert "Traceback" not in wrong.stdout + wrong.stderr
    bad_order = chatmem(container.settings, "import", "whatsapp", str(folder), "--date-order", "dym")
    assert bad_order.returncode == 2 and "--date-order 'dym': dmy, mdy or ymd" in bad_order.stdout


def test_whatsapp_import_takes_the_zip_the_phone_shares(container, tmp_path):
    android = ROOT / "tests" / "fixtures" / "exports" / "whatsapp_android"
    archive = tmp_path / "WhatsApp Chat with Trip planning.zip"
    out = chatmem(container.settings, "import", "whatsapp", str(zipped(android, archive)), "--timezone", "UTC")
    assert out.returncode == 0, out.stdout + out.stderr
    folder = tmp_path / "WhatsApp Chat with Trip planning"
    assert f"the export's folder is {folder}" in " ".join(out.stdout.split()), out.stdout
    assert "10 new events published" in out.stdout
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    (photo,) = [a for e in logged_events(container) for a in e["payload"]["attachments"]]
    assert Path(unquote(urlsplit(photo["url"]).path)) == folder / "IMG-20240301-WA0001.jpg"


def test_slack_import_keeps_the_workspace_token_out_of_the_log(container):
    export = ROOT / "tests" / "fixtures" / "exports" / "slack"
    assert "xoxe-" in (export / "general" / "2024-03-01.json").read_text(
        encoding="utf-8"
    )  # the export's file links carry one
    first = chatmem(container.settings, "import", "slack", str(export), "--assistant-id", "B01TRIP")
    # two broken items in the fixture: exit 1, the rest published
    assert first.returncode == 1 and "8 new events published" in first.stdout, first.stdout + first.stderr
    assert "Traceback" not in first.stdout + first.stderr
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    assert scalar(container, "SELECT count(*) FROM events") == 8
    logged = logged_events(container)  # the content as stored, unsealed
    assert "xoxe" not in json.dumps(logged, default=str)
    assert scalar(container, "SELECT count(*) FROM dead_letters") == 0
    threads = {e["thread_id"] for e in logged}
    assert threads == {"slack:C01GENERAL", "slack:G01TRIP", "slack:D0ALICE"}
    again = chatmem(container.settings, "import", "slack", str(export))
    assert "0 new events published" in again.stdout, again.stdout + again.stderr


def test_messenger_import_reads_metas_bytes_back_and_a_second_run_publishes_nothing(container, tmp_path):
    messenger = ROOT / "tests" / "fixtures" / "exports" / "messenger"
    archive = tmp_path / "facebook-ana-2024-03-02.zip"
    first = chatmem(container.settings, "import", "messenger", str(zipped(messenger, archive)))
    # two broken items in the fixture: exit 1, the rest published
    assert first.returncode == 1 and "5 new events published" in first.stdout, first.stdout + first.stderr
    IngestRunner(container, "c").run(threading.Event(), until_idle=True)
    texts = [e["payload"]["text"] for e in logged_events(container)]
    assert texts[0] == "Booked the flat in Alfama for March 14–18. Café downstairs ☕"
    (photo,) = [a for e in logged_events(container) for a in e["payload"]["attachments"]]
    assert Path(unquote(urlsplit(photo["url"]).path)).is_file()
    again = chatmem(container.settings, "import", "messenger", str(archive))
    assert "0 new events published" in again.stdout, again.stdout + again.stderr
