"""Messenger and Instagram chats from Meta's "Download your information" JSON: the text Meta
writes byte by byte read back, conversations in time order across their files, ids made from
what a message is (the export has none), and media found in either layout of the export.
Fixtures: tests/fixtures/exports/messenger (the older layout, messages/ at the top) and
instagram (the newer one, under your_instagram_activity/)."""

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chatmem.producers.import_meta import MetaOptions, find_meta_exports, fixed_text, meta_items
from chatmem.producers.importers import (
    DELETED,
    EMPTY,
    FILE_MISSING,
    SERVICE,
    AttachmentSkipped,
    ChatImport,
    Failed,
    ImportFormatError,
    Skipped,
    name_id,
)
from chatmem.schemas.events import AttachmentKind, MessageEvent, Role
from tests.unit.test_importers import EXPORTS, FakePublisher, zipped

MESSENGER = EXPORTS / "messenger"
INSTAGRAM = EXPORTS / "instagram"


def run(path: Path, **options) -> tuple[list, ChatImport]:
    opts = MetaOptions(**options)
    items: list = []

    def parse(fh, folder):
        for item in meta_items(fh, folder, opts):
            items.append(item)
            yield item

    chat_import = ChatImport(FakePublisher(), lambda ids: set())
    chat_import.run(find_meta_exports(path, opts.platform), parse)
    return items, chat_import


def events(items: list) -> list[MessageEvent]:
    return [i for i in items if isinstance(i, MessageEvent)]


def test_meta_writes_each_byte_of_a_text_and_it_reads_back():
    assert fixed_text("Caf\u00c3\u00a9 \u00e2\u0098\u0095") == "Café ☕"
    assert fixed_text("café") == "café"  # a text already right: not UTF-8 bytes
    assert fixed_text("Маша") == "Маша"


def test_a_messenger_conversation_reads_forward_across_its_files():
    got = events(run(MESSENGER)[0])
    # message_2.json holds the older messages; each file lists the newest first
    assert [e.text for e in got] == [
        "Booked the flat in Alfama for March 14–18. Café downstairs ☕",
        "",  # the photo
        "Key box code is 4471, the host is Rui",
        "ok",
        "ok",
    ]
    first = got[0]
    assert first.thread_id == "messenger:leojoao_1234567890"
    assert first.user_id == f"messenger:{name_id('Leo João')}" and first.metadata["author_name"] == "Leo João"
    assert first.metadata["conversation_title"] == "Leo João"
    assert first.occurred_at == datetime(2024, 3, 1, 9, 1, tzinfo=UTC)
    (photo,) = got[1].attachments
    assert photo.kind is AttachmentKind.IMAGE
    assert (
        photo.url == (MESSENGER / "messages/inbox/leojoao_1234567890/photos/balcony_1709283700.jpg").resolve().as_uri()
    )
    assert len({e.event_id for e in got}) == 5  # the two "ok" at the same millisecond are two


def test_unsent_calls_missing_media_and_broken_items():
    items, chat_import = run(MESSENGER)
    assert sorted(i.reason for i in items if isinstance(i, Skipped)) == [DELETED, EMPTY, SERVICE]
    assert [i.reason for i in items if isinstance(i, AttachmentSkipped)] == [FILE_MISSING]
    assert sorted(i.reason for i in items if isinstance(i, Failed)) == ["no timestamp_ms", "not a JSON object"]
    assert chat_import.report.failed == 2
    kept = events(run(MESSENGER, keep_service=True)[0])
    (call,) = [e for e in kept if e.role is Role.SYSTEM]
    assert (call.text, call.metadata["service_type"]) == ("Ana Lima started a call.", "Call")


def test_instagram_in_the_newer_layout_with_a_share_and_the_assistant():
    got = events(run(INSTAGRAM, platform="instagram", assistant_names=frozenset({"Ben"}))[0])
    assert [(e.thread_id, e.user_id, e.role, e.text) for e in got] == [
        ("instagram:anatravels_987654321", "instagram:anatravels", Role.USER, "Você viu o pôr do sol?"),
        ("instagram:anatravels_987654321", "instagram:Ben", Role.ASSISTANT, "Sunset over Lisbon 🌅"),
    ]


def test_a_later_export_gives_the_same_ids(tmp_path):
    # A later export holds the same messages and a new one, newest first, in one file.
    folder = tmp_path / "messages" / "inbox" / "leojoao_1234567890"
    folder.mkdir(parents=True)
    old = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(MESSENGER.rglob("message_*.json"))]
    newest = {"sender_name": "Ana Lima", "timestamp_ms": 1709400000000, "content": "Back home!"}
    doc = {**old[0], "messages": [newest] + old[0]["messages"] + old[1]["messages"]}
    (folder / "message_1.json").write_text(json.dumps(doc))
    before = {e.event_id for e in events(run(MESSENGER)[0])}
    after = events(run(tmp_path)[0])
    assert [e.text for e in after if e.event_id not in before] == ["Back home!"]


def test_the_zip_is_unpacked_and_what_is_not_an_export_says_so(tmp_path):
    archive = tmp_path / "facebook-ana-2024.zip"
    files = find_meta_exports(zipped(MESSENGER, archive), "messenger")
    assert [f.name for f in files] == ["message_2.json", "message_1.json"]
    assert files[0].is_relative_to(tmp_path / "facebook-ana-2024")
    with pytest.raises(ImportFormatError, match="not a Facebook Messenger export: no messages/…/message_1.json"):
        find_meta_exports(
            tmp_path / "facebook-ana-2024" / "messages" / "inbox" / "leojoao_1234567890" / "photos", "messenger"
        )
    wrong = tmp_path / "messages" / "inbox" / "x_1" / "message_1.json"
    wrong.parent.mkdir(parents=True)
    wrong.write_text('{"conversations": []}')
    with pytest.raises(ImportFormatError, match="not an Instagram export: no 'messages' list"):
        run(wrong, platform="instagram")


def test_a_file_nested_past_any_export_is_a_format_error(tmp_path):
    deep = tmp_path / "messages" / "inbox" / "x_1" / "message_1.json"
    deep.parent.mkdir(parents=True)
    deep.write_text('{"messages": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    with pytest.raises(ImportFormatError, match="nested too deeply"):
        run(deep)


def test_messengers_end_to_end_encrypted_chats_export_is_read_too():
    # Exported apart since end-to-end encryption: a <thread>.json a conversation, camelCase
    # fields, media beside it, a "placeholder" type for Messenger's own lines.
    folder = EXPORTS / "messenger_e2ee"
    assert [f.name for f in find_meta_exports(folder, "messenger")] == ["LeoJoao_12.json"]
    items, _ = run(folder)
    got = events(items)
    assert [(e.thread_id, e.metadata["author_name"], e.text) for e in got] == [
        ("messenger:LeoJoao_12", "Ana Lima", "Which café? The one on Rua Augusta?"),
        ("messenger:LeoJoao_12", "Ana Lima", ""),
        ("messenger:LeoJoao_12", "Leo João", "Até amanhã no café da esquina"),
    ]
    assert got[0].occurred_at == datetime(2025, 5, 1, 4, 29, 51, 906000, tzinfo=UTC)  # 1746073791906 ms
    (photo,) = got[1].attachments
    assert photo.kind is AttachmentKind.IMAGE and photo.url.endswith("/media/3f1c2a9e-7b1d-4c55-9a51-2f0d8c1e6b10.jpeg")
    assert sorted(i.reason for i in items if isinstance(i, Skipped)) == [DELETED, SERVICE]
