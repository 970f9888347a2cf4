"""Importers: the LoCoMo mapping, and the chat exports (Telegram, Discord, ChatGPT) parsed from
small hand-written fixtures that carry each quirk of the real formats (tests/fixtures/exports)."""

import io
import json
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chatmem.producers.import_chatgpt import ChatGPTOptions, chatgpt_items, current_branch, find_chatgpt_export
from chatmem.producers.import_discord import DiscordOptions, discord_items, find_discord_exports
from chatmem.producers.import_telegram import TelegramOptions, find_telegram_export, telegram_items
from chatmem.producers.importers import (
    DUPLICATE,
    EMPTY,
    FILE_MISSING,
    FILE_OUTSIDE,
    HTTP_URL,
    SERVICE,
    AttachmentSkipped,
    ChatImport,
    Failed,
    ImportFormatError,
    Skipped,
    locomo_events,
    safe_id,
    split_text,
)
from chatmem.schemas.events import AttachmentKind, MessageEvent, Role
from tests.locomo_sample import write_sample

EXPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "exports"
TELEGRAM = EXPORTS / "telegram" / "result.json"
TELEGRAM_ACCOUNT = EXPORTS / "telegram_account" / "result.json"
DISCORD = EXPORTS / "discord" / "general.json"
CHATGPT = EXPORTS / "chatgpt" / "conversations.json"
NOT_INCLUDED = "file not in the export: File not included"


def test_locomo_turns_become_message_events(tmp_path):
    events = list(locomo_events(write_sample(tmp_path)))
    assert [e.platform_message_id for e in events] == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3"]
    assert {e.thread_id for e in events} == {"conv-test"} and {e.role for e in events} == {"user"}
    assert [e.user_id for e in events[:2]] == ["Maya", "Leo"]
    start = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert [e.occurred_at for e in events[:4]] == [start + timedelta(seconds=i) for i in range(4)]
    assert events[4].occurred_at == datetime(2023, 6, 20, 10, 15, tzinfo=UTC)
    image = events[3]
    assert image.attachments[0].caption == "a photo of a red road bicycle leaning on a wall"
    assert image.attachments[0].url.startswith("https://") and image.metadata["img_url"] == "http://x/b.jpg"
    assert events[0].metadata["author_name"] == "Maya"
    assert len({e.event_id for e in events}) == 7  # derived from the turn: a re-import dedupes


def test_a_locomo_session_time_spelled_otherwise_or_missing_keeps_the_conversation(tmp_path, caplog):
    path = write_sample(tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    conv = data[0]["conversation"]
    conv["session_1_date_time"] = "1:56 pm on 8 May 2023"  # no comma
    del conv["session_2_date_time"]
    conv["session_2"][0].pop("text")
    path.write_text(json.dumps(data))
    events = list(locomo_events(path))
    assert [e.platform_message_id for e in events] == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3"]
    assert events[0].occurred_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    # Placed an hour after the session before, in order; the warning names the session.
    assert events[4].occurred_at == events[3].occurred_at + timedelta(seconds=1, hours=1)
    assert events[4].text == "" and events[5].occurred_at > events[4].occurred_at
    assert "conv-test session_2" in caplog.text


def test_only_selected_samples(tmp_path):
    assert list(locomo_events(write_sample(tmp_path), {"other"})) == []


# --- helpers ---------------------------------------------------------------------------------


def parse(items_fn, path: Path, options=None) -> list:
    with open(path, "rb") as fh:
        return list(items_fn(fh, path.parent, options))


def events_of(items: list) -> dict[str, MessageEvent]:
    return {i.platform_message_id: i for i in items if isinstance(i, MessageEvent)}


def reasons(items: list, kind: type) -> list[tuple[str, str]]:
    return [(i.ref, i.reason) for i in items if isinstance(i, kind)]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --- Telegram --------------------------------------------------------------------------------


def test_telegram_chat_export_becomes_one_thread():
    items = parse(telegram_items, TELEGRAM)
    events = events_of(items)
    assert list(events) == ["2", "3", "4", "5", "6", "9", "10", "11", "13", "14"]  # file order
    assert {e.thread_id for e in events.values()} == {"telegram:-4242"}
    assert {e.platform for e in events.values()} == {"telegram"}
    assert events["2"].event_id == "telegram:-4242:2"
    assert events["2"].user_id == "telegram:111" and events["3"].user_id == "telegram:222"
    assert events["2"].metadata["author_name"] == "Maya" and events["3"].metadata["author_name"] == "Leo"
    assert {e.role for e in events.values()} == {Role.USER}


def test_telegram_time_is_date_unixtime_in_utc_not_the_local_date():
    events = events_of(parse(telegram_items, TELEGRAM))
    # "date": "2024-03-01T13:00:00" is the exporter's local time (UTC+2); the unix time rules.
    assert events["2"].occurred_at == at("2024-03-01T11:00:00")
    assert events["2"].occurred_at.utcoffset() == timedelta(0)
    assert events["3"].metadata["edited_at"] == "2024-03-01T11:03:00+00:00"  # final text, edit time noted


def test_telegram_message_without_unix_time_fails_with_a_reason():
    failed = reasons(parse(telegram_items, TELEGRAM), Failed)
    assert failed == [("message 12 in chat -4242", failed[0][1])]
    assert "date_unixtime" in failed[0][1]


def test_telegram_text_entities_replies_and_forwards():
    events = events_of(parse(telegram_items, TELEGRAM))
    assert events["3"].text == "Let's book the hotel near Rua Augusta!"
    assert events["3"].reply_to == "2" and events["13"].reply_to == "6"
    assert events["6"].metadata["forwarded_from"] == "Lisbon Guide"
    assert events["11"].text == "👍"  # a sticker stands for its emoji


def test_telegram_attachments_are_absolute_file_urls_and_placeholders_are_noted():
    items = parse(telegram_items, TELEGRAM)
    events = events_of(items)
    (photo,) = events["4"].attachments
    assert photo.kind is AttachmentKind.IMAGE and photo.size_bytes == 633
    assert photo.url == (TELEGRAM.parent / "photos" / "photo_1@01-03-2024_13-05-00.jpg").resolve().as_uri()
    (notes,) = events["9"].attachments
    assert notes.kind is AttachmentKind.DOCUMENT and notes.filename == "notes.txt" and notes.mime_type == "text/plain"
    assert events["9"].text == ""  # a file alone is a message
    assert events["5"].attachments == []
    assert events["5"].metadata["attachments_not_included"] == [
        {"file_name": "boarding-pass.pdf", "kind": "document", "reason": NOT_INCLUDED}
    ]
    assert events["10"].attachments == []  # "../../outside.jpg" is not followed
    assert sorted(reasons(items, AttachmentSkipped)) == [
        ("message 10 in chat -4242", FILE_OUTSIDE),
        ("message 11 in chat -4242", NOT_INCLUDED),
        ("message 14 in chat -4242", "file not in the export: File exceeds maximum size"),
        ("message 5 in chat -4242", NOT_INCLUDED),
        ("message 8 in chat -4242", NOT_INCLUDED),
    ]


def test_telegram_service_and_empty_messages_are_skipped_by_default():
    items = parse(telegram_items, TELEGRAM)
    assert reasons(items, Skipped) == [
        ("message 1 in chat -4242", SERVICE),
        ("message 7 in chat -4242", SERVICE),
        ("message 8 in chat -4242", EMPTY),  # a voice message whose file was not exported
    ]


def test_telegram_service_messages_kept_as_system_lines_on_request():
    options = TelegramOptions(keep_service=True)
    events = events_of(parse(telegram_items, TELEGRAM, options))
    call, pin = events["1"], events["7"]
    assert call.role is Role.SYSTEM and call.text == "Maya called (65 s)" and call.user_id == "telegram:111"
    assert pin.text == "Leo pinned a message" and pin.reply_to == "4"
    assert pin.metadata["service_action"] == "pin_message"


def test_telegram_assistant_id_marks_the_bots_messages():
    for given in ("user999", "999", "telegram-user999"):
        options = TelegramOptions(assistant_ids=TelegramOptions.assistant([given]))
        events = events_of(parse(telegram_items, TELEGRAM, options))
        assert events["13"].role is Role.ASSISTANT and events["2"].role is Role.USER


def test_telegram_account_export_reads_every_chat_including_left_ones():
    events = [i for i in parse(telegram_items, TELEGRAM_ACCOUNT) if isinstance(i, MessageEvent)]
    assert [(e.thread_id, e.platform_message_id) for e in events] == [
        ("telegram:222", "50"),
        ("telegram:222", "51"),
        ("telegram:111", "7"),
        ("telegram:-100333", "900"),
    ]
    assert events[1].text == "sure, 8 pm" and events[1].reply_to == "50"
    assert events[3].occurred_at == at("2023-11-05T17:00:00")


def test_telegram_export_folder_finds_result_json(tmp_path):
    assert find_telegram_export(TELEGRAM.parent) == TELEGRAM
    nested = tmp_path / "Telegram Desktop" / "ChatExport_2024-03-02"
    nested.mkdir(parents=True)
    (nested / "result.json").write_text("{}")
    assert find_telegram_export(tmp_path) == nested / "result.json"
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ImportFormatError, match="no result.json"):
        find_telegram_export(tmp_path / "nothing")
    (tmp_path / "result2").mkdir()
    (tmp_path / "result2" / "result.json").write_text("{}")
    with pytest.raises(ImportFormatError, match="2 result.json files"):
        find_telegram_export(tmp_path)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"foo": 1}, "not a Telegram export: no 'messages' or 'chats.list' key"),
        ([1, 2], "not a Telegram export: the top level is not a JSON object"),
        ({"messages": [], "name": "x"}, "has no 'id'"),
        ({"id": 1, "messages": {"a": 1}}, "'messages' is not a list"),
    ],
)
def test_telegram_wrong_file_says_what_is_wrong(document, message):
    fh = io.BytesIO(json.dumps(document).encode())
    with pytest.raises(ImportFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        list(telegram_items(fh, Path(".")))


def test_telegram_chat_id_after_its_messages_is_still_found():
    # Also an older export's numeric from_id, which names a user.
    document = {"messages": [{"id": 1, "type": "message", "date_unixtime": "0", "text": "hi", "from_id": 5}]}
    document["id"] = 77
    (event,) = telegram_items(io.BytesIO(json.dumps(document).encode()), Path("."))
    assert isinstance(event, MessageEvent) and event.thread_id == "telegram:77"
    assert event.user_id == "telegram:5"


# --- Discord ---------------------------------------------------------------------------------


def test_discord_export_becomes_one_thread_per_channel():
    items = parse(discord_items, DISCORD)
    events = events_of(items)
    assert list(events) == ["1001", "1002", "1003", "1005", "1006", "1008", "1010"]
    assert {e.thread_id for e in events.values()} == {"discord:555"}
    assert events["1001"].event_id == "discord:1001" and events["1001"].user_id == "discord:100"
    assert events["1001"].metadata["author_name"] == "Ali"  # the nickname
    # "2024-03-01T12:00:00.123+01:00" in UTC
    assert events["1001"].occurred_at == at("2024-03-01T11:00:00.123000")
    assert reasons(items, Skipped) == [
        ("message 1004 in channel 555", SERVICE),
        ("message 1007 in channel 555", EMPTY),
        ("message 1009 in channel 555", SERVICE),
    ]
    assert reasons(items, Failed) == [
        ("message 1011 in channel 555", "timestamp: timestamp '2024-03-01T12:10:00' has no time zone offset")
    ]


def test_discord_reference_is_the_reply_and_edits_are_noted():
    events = events_of(parse(discord_items, DISCORD))
    assert events["1002"].reply_to == "1001"
    assert events["1002"].metadata["edited_at"] == "2024-03-01T11:05:00+00:00"
    assert events["1003"].metadata["pinned"] is True
    other = events["1010"]  # an answer to a message of another channel: not a reply in this thread
    assert other.reply_to is None
    assert other.metadata["reply_to_channel"] == "556" and other.metadata["reply_to_message"] == "9001"


def test_discord_local_and_url_attachments():
    items = parse(discord_items, DISCORD)
    events = events_of(items)
    local, remote = events["1003"].attachments
    assert local.url == (DISCORD.parent / "general.json_Files" / "diagram-1A2B3.png").resolve().as_uri()
    assert local.kind is AttachmentKind.IMAGE and local.filename == "diagram.png" and local.size_bytes == 77
    assert remote.url == "https://cdn.discordapp.com/attachments/555/1003/itinerary.pdf"
    assert remote.kind is AttachmentKind.DOCUMENT
    assert events["1008"].attachments == []
    assert reasons(items, AttachmentSkipped) == [
        ("message 1003 in channel 555", HTTP_URL),
        ("message 1008 in channel 555", FILE_MISSING),
    ]


def test_discord_bots_are_users_unless_named_as_the_assistant():
    events = events_of(parse(discord_items, DISCORD))
    assert events["1005"].role is Role.USER and events["1005"].metadata["is_bot"] is True
    assert events["1006"].text == "Flight reminder\nBook by Friday"  # an embed-only bot post
    events = events_of(parse(discord_items, DISCORD, DiscordOptions(assistant_ids=frozenset({"900"}))))
    assert events["1005"].role is Role.ASSISTANT and events["1001"].role is Role.USER


def test_discord_service_messages_on_request():
    events = events_of(parse(discord_items, DISCORD, DiscordOptions(keep_service=True)))
    assert events["1004"].role is Role.SYSTEM and events["1004"].text == "bob pinned a message"
    assert events["1009"].text == "Ali started a thread: hotel options"


def test_discord_wrong_file(tmp_path):
    for document, message in [
        ({"channel": {"id": "1"}}, "no 'messages' key"),
        ({"messages": []}, "no 'channel.id'"),
    ]:
        with pytest.raises(ImportFormatError, match=message):
            list(discord_items(io.BytesIO(json.dumps(document).encode()), tmp_path))
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "a.json").write_text("{}")
    assert find_discord_exports(tmp_path) == [tmp_path / "a.json", tmp_path / "b.json"]


# --- ChatGPT ---------------------------------------------------------------------------------


def test_chatgpt_current_branch_only():
    items = parse(chatgpt_items, CHATGPT)
    events = [i for i in items if isinstance(i, MessageEvent)]
    first = [e for e in events if e.thread_id == "chatgpt:c0ffee00-0000-4000-8000-000000000001"]
    # u1 was answered twice (a1, then the regenerated a1b); current_node runs through a1b.
    assert [e.text for e in first] == [
        "What's a good name for a grey cat?",
        "How about Earl Grey?",
        "Here is my cat, Earl Grey.",
        "What a handsome cat!",
    ]
    assert [e.role for e in first] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]
    assert {e.user_id for e in events} == {"me"} and {e.platform for e in events} == {"chatgpt"}
    assert first[0].event_id == "chatgpt:c0ffee00-0000-4000-8000-000000000001:u1"
    assert first[0].occurred_at == at("2024-03-01T11:00:01")
    assert first[1].metadata == {"conversation_title": "Cat names", "model": "gpt-4o"}
    assert first[2].metadata["parts_not_imported"] == 1  # the image pointer: strings only
    skipped = [r for _, r in reasons(items, Skipped)]
    assert skipped.count("not on the conversation's current branch") == 1
    assert {"system message", "tool message", "tool call"} <= set(skipped)


def test_chatgpt_branch_walk_falls_back_to_the_latest_child():
    mapping = {
        "r": {"parent": None, "children": ["a"], "message": None},
        "a": {"parent": "r", "children": ["b1", "b2"], "message": {}},
        "b1": {"parent": "a", "children": [], "message": {}},
        "b2": {"parent": "a", "children": [], "message": {}},
    }
    assert current_branch(mapping, "b1") == ["r", "a", "b1"]
    assert current_branch(mapping, None) == ["r", "a", "b2"]
    assert current_branch(mapping, "gone") == ["r", "a", "b2"]


def test_chatgpt_conversation_id_time_fallback_user_option_and_broken_items():
    items = parse(chatgpt_items, CHATGPT, ChatGPTOptions(user_id="maya"))
    second = [i for i in items if isinstance(i, MessageEvent) and i.thread_id == "chatgpt:conv-b"]
    assert [e.text for e in second][1:] == ["Noted."]
    assert second[0].occurred_at == at("2024-03-02T11:00:00")  # no create_time: the conversation's
    assert {e.user_id for e in second} == {"maya"}
    assert reasons(items, Failed) == [("conversation #3", "no 'mapping' (not a ChatGPT conversation)")]


def test_chatgpt_long_text_is_split_not_lost():
    items = parse(chatgpt_items, CHATGPT, ChatGPTOptions(max_text_chars=50))
    parts = [i for i in items if isinstance(i, MessageEvent) and i.platform_message_id == "b1"]
    assert len(parts) == 4 and all(len(p.text) <= 50 for p in parts)
    assert parts[0].text == "Please remember this note.\n\n"  # cut after the paragraph
    assert "".join(p.text for p in parts).endswith("The alarm code is written inside the kitchen cupboard.")
    assert [p.event_id for p in parts] == ["chatgpt:conv-b:b1"] + [f"chatgpt:conv-b:b1:{n}" for n in (2, 3, 4)]
    assert [(p.metadata["part"], p.metadata["parts"]) for p in parts] == [(n, 4) for n in (1, 2, 3, 4)]


def test_chatgpt_wrong_file(tmp_path):
    with pytest.raises(ImportFormatError, match="holds a list of conversations"):
        list(chatgpt_items(io.BytesIO(b'{"title": "x"}'), tmp_path))
    with pytest.raises(ImportFormatError, match="no conversations.json"):
        find_chatgpt_export(tmp_path)


# --- shared plumbing -------------------------------------------------------------------------


def test_split_text_keeps_everything_and_cuts_at_boundaries():
    text = "alpha beta gamma\n\ndelta epsilon\nzeta eta theta iota kappa " * 20
    pieces = split_text(text, 40)
    assert "".join(pieces) == text and all(0 < len(p) <= 40 for p in pieces)
    assert split_text("x" * 95, 40) == ["x" * 40, "x" * 40, "x" * 15]


def test_safe_id_is_stable_valid_and_bounded():
    assert safe_id("telegram-user 1/2") == "telegram-user_1_2"
    long = safe_id("chatgpt:" + "x" * 300)
    assert len(long) == 128 and long == safe_id("chatgpt:" + "x" * 300) != safe_id("chatgpt:" + "x" * 301)


def zipped(folder: Path, archive: Path) -> Path:
    """`folder` as the zip an export is shared as: its files at the zip's top."""
    with zipfile.ZipFile(archive, "w") as package:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                package.write(file, file.relative_to(folder).as_posix())
    return archive


class FakePublisher:
    def __init__(self):
        self.published: list[MessageEvent] = []

    def publish_many(self, events):
        events = list(events)
        self.published += events
        return [f"{len(self.published)}-{i}" for i, _ in enumerate(events)]


def test_second_import_publishes_nothing_new():
    pub = FakePublisher()
    stored: set[str] = set()

    def known(ids: list[str]) -> set[str]:
        return stored & set(ids)

    first = ChatImport(pub, known, batch_size=3).run([TELEGRAM], telegram_items)
    assert first.published == 10 and first.failed == 1 and first.attachments == 2
    assert first.skipped == {SERVICE: 2, EMPTY: 1}
    assert first.attachments_skipped[NOT_INCLUDED] == 3
    assert first.bytes_read == first.bytes_total == TELEGRAM.stat().st_size
    stored.update(e.event_id for e in pub.published)  # what ingest would have committed

    again = ChatImport(pub, known, batch_size=3).run([TELEGRAM], telegram_items)
    assert again.published == 0 and again.already_imported == 10 and len(pub.published) == 10


def test_the_same_id_twice_in_a_batch_is_published_once():
    pub = FakePublisher()

    def twice(fh, folder):
        for item in telegram_items(fh, folder):
            yield item
            if isinstance(item, MessageEvent) and item.platform_message_id == "2":
                yield item

    report = ChatImport(pub, lambda ids: set()).run([TELEGRAM], twice)
    assert report.published == 10 and report.skipped[DUPLICATE] == 1


def test_an_interrupted_import_resumes_where_the_stored_events_end():
    pub = FakePublisher()
    stored: set[str] = set()

    def interrupted(fh, folder):
        for n, item in enumerate(telegram_items(fh, folder)):
            if n == 9:
                raise KeyboardInterrupt
            yield item

    run = ChatImport(pub, lambda ids: stored & set(ids), batch_size=2)
    with pytest.raises(KeyboardInterrupt):
        run.run([TELEGRAM], interrupted)
    assert 0 < run.report.published < 10  # whole batches went out before the Ctrl-C
    stored.update(e.event_id for e in pub.published)

    rest = ChatImport(pub, lambda ids: stored & set(ids), batch_size=2).run([TELEGRAM], telegram_items)
    assert rest.already_imported == run.report.published and rest.published == 10 - run.report.published
    assert sorted(e.event_id for e in pub.published) == sorted({e.event_id for e in pub.published})


def test_malformed_json_is_a_format_error_after_publishing_what_was_read(tmp_path):
    broken = tmp_path / "result.json"
    broken.write_bytes(TELEGRAM.read_bytes()[:2500])
    pub = FakePublisher()
    run = ChatImport(pub, lambda ids: set())
    with pytest.raises(ImportFormatError, match="result.json: not valid JSON near byte"):
        run.run([broken], telegram_items)
    assert run.report.published == len(pub.published) > 0


def test_telegram_export_ids_become_the_bot_apis_so_imports_and_the_live_bot_share_threads():
    from chatmem.producers.import_telegram import bot_api_chat_id

    assert bot_api_chat_id(1234567890, "private_supergroup") == "-1001234567890"
    assert bot_api_chat_id(1234567890, "public_channel") == "-1001234567890"
    assert bot_api_chat_id(4242, "private_group") == "-4242"
    assert bot_api_chat_id(77, "personal_chat") == "77"
    assert bot_api_chat_id("-1001", "private_supergroup") == "-1001"  # already a Bot API id
