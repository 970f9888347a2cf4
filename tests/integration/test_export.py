"""`chatmem export --user U`: everything held about one user, and nothing about anyone else."""

import json

import pytest

from chatmem.schemas.events import Attachment, CommandEvent
from tests.conftest import spawn
from tests.integration.test_attachments import TICKET, message, put, text_image
from tests.integration.test_episodes import Driver

pytestmark = pytest.mark.integration


def test_export_holds_the_users_events_messages_threads_facts_and_files(container, tmp_path):
    d = Driver(container)
    url = put(tmp_path, "ticket.png", text_image(TICKET))
    published = [
        message("trip", "alice", 1, "here is my ticket", [Attachment(url=url, kind="image", caption="my ticket")]),
        message("trip", "bob", 2, "I am coming too, my passport number is X123"),
        message("trip", "alice", 3, "great, see you at the gate"),
        message("other", "bob", 1, "bob's private thread"),
        CommandEvent(
            event_id="rem-1",
            thread_id="trip",
            user_id="alice",
            command="remember",
            args={"text": "I am vegetarian"},
        ),
    ]
    d.publish(published)
    d.advance("trip")
    d.advance("other")
    assert d.run_attachments() == ["done"]
    d.run_jobs(with_facts=True)
    out = tmp_path / "alice-export"
    cli = spawn(container.settings, "export", "--user", "alice", "--out", str(out))
    printed, _ = cli.communicate(timeout=120)
    assert cli.returncode == 0, printed[-2000:]
    data = json.loads((out / "export.json").read_text(encoding="utf-8"))
    assert data["user_id"] == "alice" and data["threads"] == ["trip"]
    assert [e["event_id"] for e in data["events"]] == ["trip-1", "trip-3", "rem-1"]
    assert [m["seq"] for m in data["messages"]] == [1, 3] and all("passport" not in m["text"] for m in data["messages"])
    assert {e["thread_id"] for e in data["episodes"]} == {"trip"}  # the thread they are in, not bob's own
    assert any("vegetarian" in f["value"] for f in data["facts"])
    (file,) = data["attachments"]
    assert file["file"].startswith("files/") and (out / file["file"]).read_bytes() == text_image(TICKET)
    assert any(t["kind"] == "ocr" and "B17" in t["text"] for t in file["texts"])
    assert "bob's private thread" not in (out / "export.json").read_text(encoding="utf-8")
    # Round trip: the export says what the log and the reads say.
    as_published = {e.event_id: json.loads(e.model_dump_json()) for e in published}
    assert all(e["payload"] == as_published[e["event_id"]] for e in data["events"])  # opened, as sent
    known = container.what_do_you_know("alice")
    exported_facts = {(f["category"], f["key"], f["value"]) for f in data["facts"] if f["is_active"]}
    assert exported_facts == {(f.category, f.key, f.value) for f in known.facts}
    read = {m["seq"]: m["text"] for m in container.browser.episode(data["messages"][0]["episode_id"])["messages"]}
    assert all(
        read[m["seq"]] == m["text"] for m in data["messages"] if m["episode_id"] == data["messages"][0]["episode_id"]
    )
