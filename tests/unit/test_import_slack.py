"""Slack workspace exports: conversations found from the export's lists, Slack's markup read as
people read it, threads as replies, and file links, which carry a workspace token, never copied.
Fixture: tests/fixtures/exports/slack."""

import json
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chatmem.producers.import_slack import (
    DELETED,
    FILE_NOT_FETCHED,
    SlackOptions,
    find_slack_export,
    find_slack_exports,
    read_workspace,
    render_markup,
    slack_items,
)
from chatmem.producers.importers import (
    EMPTY,
    SERVICE,
    ChatImport,
    Failed,
    ImportFormatError,
    Skipped,
)
from chatmem.schemas.events import MessageEvent, Role
from tests.unit.test_importers import EXPORTS, FakePublisher, zipped

SLACK = EXPORTS / "slack"


def run(root: Path = SLACK, **options) -> tuple[list, FakePublisher, ChatImport]:
    workspace = read_workspace(root)
    items: list = []
    opts = SlackOptions(**options)

    def parse(fh, folder):
        for item in slack_items(fh, folder, workspace, opts):
            items.append(item)
            yield item

    pub = FakePublisher()
    chat_import = ChatImport(pub, lambda ids: set())
    chat_import.run(find_slack_exports(root), parse)
    return items, pub, chat_import


def by_ts(items: list) -> dict[str, MessageEvent]:
    return {i.platform_message_id: i for i in items if isinstance(i, MessageEvent)}


def test_every_conversation_is_a_thread_named_by_its_id():
    items, pub, _ = run()
    threads = {e.thread_id for e in pub.published}
    assert threads == {"slack:C01GENERAL", "slack:G01TRIP", "slack:D0ALICE"}
    first = by_ts(items)["1709283660.000200"]
    assert first.event_id == "slack:C01GENERAL:1709283660.000200"
    assert (first.user_id, first.metadata["author_name"]) == ("slack:U01ANA", "Ana")
    assert first.occurred_at == datetime(2024, 3, 1, 9, 1, 0, 200, tzinfo=UTC)  # ts: seconds since the epoch


def test_markup_is_read_as_people_read_it():
    text = by_ts(run()[0])["1709283660.000200"].text
    assert text == "Booked the flat in Alfama for March 14–18 <3 — Ana & Leo, see the listing, @Leo Martins"
    workspace = read_workspace(SLACK)
    assert render_markup("<@U9|zed> <#C9> <!channel> <!subteam^S1|@ops> <mailto:a@b.c> <https://x.y>", workspace) == (
        "@zed #C9 @channel @ops a@b.c https://x.y"
    )


def test_thread_replies_answer_their_parent_and_edits_are_noted():
    got = by_ts(run()[0])
    reply = got["1709283780.000400"]
    assert reply.reply_to == "1709283660.000200" and got["1709283660.000200"].reply_to is None
    assert reply.metadata["edited_at"] == "2024-03-01T09:03:20+00:00"


def test_file_links_carry_a_token_and_are_never_copied():
    items, pub, chat_import = run()
    assert "xoxe" not in json.dumps([e.model_dump(mode="json") for e in pub.published])
    shared = by_ts(items)["1709283900.000600"]
    assert shared.text == "Map attached, cc @here and #general" and shared.attachments == []
    assert shared.metadata["attachments_not_included"] == [
        {"name": "map.png", "mimetype": "image/png", "reason": FILE_NOT_FETCHED}
    ]
    assert chat_import.report.attachments_skipped == {FILE_NOT_FETCHED: 2}


def test_notices_deletions_bots_and_broken_items():
    items, _, chat_import = run(assistant_ids=frozenset({"B01TRIP"}))
    skipped = {i.ref.split()[1]: i.reason for i in items if isinstance(i, Skipped)}
    assert skipped == {
        "1709283600.000100": SERVICE,  # a join
        "1709283840.000500": EMPTY,  # a file alone: its file is not fetched
        "1709283960.000700": DELETED,
        "1709370060.000200": SERVICE,  # a topic
        "1709370120.000300": EMPTY,
    }
    assert sorted(i.reason for i in items if isinstance(i, Failed)) == [
        "no ts (the message's id and time)",
        "not a JSON object",
    ]
    got = by_ts(items)
    bot = got["1709370000.000100"]  # a bot's post with legacy attachments only
    assert bot.text == "Reminder\nFlight TP1234 leaves at 07:05, check in"
    assert (bot.role, bot.user_id, bot.metadata["is_bot"]) == (Role.ASSISTANT, "slack:B01TRIP", True)
    assert got["1709300005.000200"].role is Role.ASSISTANT  # the bot in a DM, by its bot id
    assert chat_import.report.failed == 2


def test_notices_are_kept_on_request_as_system_lines():
    got = by_ts(run(keep_service=True)[0])
    join = got["1709283600.000100"]
    assert (join.role, join.text, join.metadata["service_type"]) == (
        Role.SYSTEM,
        "@Leo Martins has joined the channel",
        "channel_join",
    )


def test_a_second_import_publishes_nothing_new():
    _, pub, _ = run()
    stored = {e.event_id for e in pub.published}
    workspace = read_workspace(SLACK)
    again = ChatImport(FakePublisher(), stored.intersection)
    report = again.run(find_slack_exports(SLACK), lambda fh, folder: slack_items(fh, folder, workspace))
    assert report.published == 0 and report.already_imported == len(stored) == 8


def test_the_exports_zip_is_unpacked_beside_it(tmp_path):
    archive = tmp_path / "Acme Slack export Mar 1 2024 - Mar 2 2024.zip"
    root = find_slack_export(zipped(SLACK, archive))
    assert root == tmp_path / "Acme Slack export Mar 1 2024 - Mar 2 2024" and find_slack_export(archive) == root
    assert sorted(e.event_id for e in run(root)[1].published) == sorted(e.event_id for e in run()[1].published)


def test_what_is_not_a_slack_export_says_so(tmp_path):
    with pytest.raises(ImportFormatError, match="no channels.json or users.json"):
        read_workspace(tmp_path)
    with zipfile.ZipFile(tmp_path / "export.zip", "w") as package:
        package.writestr("general/2024-03-01.json", "[]")
    with pytest.raises(ImportFormatError, match="export.zip holds no channels.json or users.json at its top"):
        find_slack_export(tmp_path / "export.zip")
    (tmp_path / "users.json").write_text("[]")
    with pytest.raises(ImportFormatError, match="no conversation folder of day files"):
        find_slack_exports(tmp_path)
    (tmp_path / "general").mkdir()
    (tmp_path / "general" / "2024-03-01.json").write_text('{"messages": []}')
    with pytest.raises(ImportFormatError, match="a day file holds a list of messages"):
        run(tmp_path)


def test_a_folder_no_list_names_is_read_with_its_name_as_its_id(tmp_path):
    (tmp_path / "users.json").write_text('[{"id": "U1", "name": "ann"}]')
    (tmp_path / "old-channel").mkdir()
    (tmp_path / "old-channel" / "2020-01-01.json").write_text(
        '[{"ts": "1577880000.000100", "user": "U1", "text": "hi"}]'
    )
    (tmp_path / "old-channel" / "notes.json").write_text("not a day file, not read")
    _, pub, _ = run(tmp_path)
    assert [(e.thread_id, e.metadata["author_name"], e.text) for e in pub.published] == [
        ("slack:old-channel", "ann", "hi")
    ]


def test_a_list_file_that_is_not_json_says_which(tmp_path):
    (tmp_path / "users.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ImportFormatError, match="users.json: not valid JSON .nested too deeply."):
        read_workspace(tmp_path)
    (tmp_path / "users.json").write_bytes(b'[{"id": "U1", "name": "\xff"}]')
    with pytest.raises(ImportFormatError, match="users.json: not valid JSON"):
        read_workspace(tmp_path)
