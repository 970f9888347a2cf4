"""WhatsApp chat exports: the line formats of phones in different regions, what a message is, and
ids that stay the same from one export of a chat to the next. Fixtures in
tests/fixtures/exports/whatsapp_android (an American Android phone, English) and whatsapp_ios (a
German iPhone) carry each quirk of the format."""

import io
import shutil
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatmem.producers.import_whatsapp import (
    DELETED,
    MEDIA_NOT_EXPORTED,
    VIEW_ONCE,
    DateOrder,
    WhatsAppOptions,
    chat_name,
    find_whatsapp_export,
    name_id,
    sniff_layout,
    thread_id_for,
    time_zone,
    whatsapp_items,
)
from chatmem.producers.importers import (
    EMPTY,
    FILE_MISSING,
    SERVICE,
    TOO_MANY,
    AttachmentSkipped,
    ChatImport,
    Failed,
    ImportFormatError,
    Skipped,
)
from chatmem.producers.publisher import serialize
from chatmem.schemas.events import AttachmentKind, MessageEvent, Role, parse_event
from tests.unit.test_importers import EXPORTS, FakePublisher

ANDROID = EXPORTS / "whatsapp_android" / "WhatsApp Chat with Trip planning.txt"
IOS_FOLDER = EXPORTS / "whatsapp_ios" / "WhatsApp Chat - Anna"
BERLIN = ZoneInfo("Europe/Berlin")


def items_of(path: Path, **options) -> list:
    options = {"chat": chat_name(path), "zone": UTC, **options}
    with open(path, "rb") as fh:
        return list(whatsapp_items(fh, path.parent, WhatsAppOptions(**options)))


def items_from(text: str, tmp_path: Path, **options) -> list:
    path = tmp_path / "WhatsApp Chat with Test.txt"
    path.write_text(text, encoding="utf-8")
    return items_of(path, **options)


def events(items: list) -> list[MessageEvent]:
    return [i for i in items if isinstance(i, MessageEvent)]


def by_line(items: list, kind: type) -> dict[str, str]:
    return {i.ref: i.reason for i in items if isinstance(i, kind)}


# --- an Android export ------------------------------------------------------------------------


def test_android_export_becomes_one_thread_of_the_peoples_messages():
    items = items_of(ANDROID, assistant_names=frozenset({"Trip Bot"}))
    got = events(items)
    assert {e.thread_id for e in got} == {"whatsapp:Trip_planning"} == {thread_id_for("Trip planning")}
    assert [(e.user_id, e.text) for e in got[:3]] == [
        ("whatsapp:Leo", "Booked the flat in Alfama for March 14–18.\nThe host is called Rui."),
        ("whatsapp:Maya", "View from the balcony"),  # the photo's caption
        ("whatsapp:351912345678", "Hi, this is Rui, the host. Key box code is 4471."),  # a number, marks dropped
    ]
    assert got[0].metadata == {"author_name": "Leo"}
    # month first, told by "3/13/24"; the times are the phone's, read in the zone given (UTC here)
    assert got[0].occurred_at == datetime(2024, 3, 1, 9, 7, tzinfo=UTC)
    assert got[-1].occurred_at == datetime(2024, 4, 2, 8, 0, tzinfo=UTC)
    (photo,) = got[1].attachments
    assert photo.url == (ANDROID.parent / "IMG-20240301-WA0001.jpg").resolve().as_uri()
    assert (photo.kind, photo.filename) == (AttachmentKind.IMAGE, "IMG-20240301-WA0001.jpg")
    bot = next(e for e in got if e.user_id == "whatsapp:Trip_Bot")
    assert bot.role is Role.ASSISTANT and all(e.role is Role.USER for e in got if e is not bot)
    # a name in another script: folded, plus a hash of it, so two such names stay apart
    masha = next(e for e in got if e.metadata["author_name"] == "Маша")
    assert masha.user_id == f"whatsapp:{name_id('Маша')}" != f"whatsapp:{name_id('Миша')}"


def test_android_notices_placeholders_deletions_and_missing_files_are_counted_not_published():
    items = items_of(ANDROID)
    assert by_line(items, Skipped) == {
        "line 1": SERVICE,  # the encryption notice
        "line 2": SERVICE,  # 'Leo created group "Trip: Lisbon"': a colon, but in quotes
        "line 3": SERVICE,
        "line 8": EMPTY,
        "line 10": DELETED,
        "line 11": SERVICE,
        "line 16": EMPTY,
        "line 18": VIEW_ONCE,
    }
    assert by_line(items, AttachmentSkipped) == {"line 8": MEDIA_NOT_EXPORTED, "line 16": FILE_MISSING}
    texts = [e.text for e in events(items)]
    # a file name in words, with no such file and not WhatsApp's naming, is text
    assert "I'll bring the notes.pdf (see below)" in texts
    assert not [i for i in items if isinstance(i, Failed)]


def test_android_edits_are_marked_and_repeated_messages_are_each_kept():
    oks = [e for e in events(items_of(ANDROID)) if e.text == "Ok"]
    assert [e.metadata.get("edited") for e in oks] == [True, None, None]
    assert len({e.event_id for e in oks}) == 3  # the same minute, author and text: three messages


def test_service_lines_kept_on_request_speak_for_the_chat():
    kept = [e for e in events(items_of(ANDROID, keep_service=True)) if e.role is Role.SYSTEM]
    assert [e.text for e in kept][1:3] == ['Leo created group "Trip: Lisbon"', "Leo added Maya"]
    assert {e.user_id for e in kept} == {"whatsapp:Trip_planning"}


def test_times_are_the_phones_local_times_in_the_zone_given():
    got = events(items_of(ANDROID, zone=BERLIN))
    assert got[0].occurred_at == datetime(2024, 3, 1, 8, 7, tzinfo=UTC)  # CET, UTC+1
    assert got[-1].occurred_at == datetime(2024, 4, 2, 6, 0, tzinfo=UTC)  # CEST after the change
    # the ids do not depend on the zone: importing again with a corrected zone adds nothing
    assert [e.event_id for e in got] == [e.event_id for e in events(items_of(ANDROID))]


def test_in_the_hour_the_clock_goes_back_the_file_order_tells_which_time(tmp_path):
    # Berlin, 27 October 2024: at 3:00 summer time the clock goes back to 2:00.
    text = "".join(f"10/27/24, {t} - Ann: {t}\n" for t in ("2:50 AM", "2:10 AM", "2:50 AM", "3:05 AM"))
    got = events(items_from(text, tmp_path, zone=BERLIN))
    assert [e.occurred_at.strftime("%H:%M") for e in got] == ["00:50", "01:10", "01:50", "02:05"]
    assert len({e.event_id for e in got}) == 4  # the two "2:50 AM" messages are two


# --- an iPhone export -------------------------------------------------------------------------


def test_ios_export_folder_gives_its_chat_and_the_phones_words_for_files():
    path = find_whatsapp_export(IOS_FOLDER)
    assert path.name == "_chat.txt" and chat_name(path) == "Anna"
    items = items_of(path)
    got = events(items)
    assert [(e.user_id, e.text) for e in got] == [
        ("whatsapp:Anna", "Hallo Ben! Wie war Lissabon?"),
        ("whatsapp:Ben", ""),
        ("whatsapp:Anna", "Zeile eins\nZeile zwei"),
        ("whatsapp:Ben", "Notizen.pdf • 2 Seiten"),
        ("whatsapp:Anna", "Bis Freitag, 19 Uhr im Café Lua."),
    ]
    # day first, told by "13.03.24"; seconds kept
    assert got[-1].occurred_at == datetime(2024, 3, 13, 18, 0, tzinfo=UTC)
    assert got[0].occurred_at == datetime(2024, 3, 1, 9, 6, tzinfo=UTC)
    assert [a.filename for e in got for a in e.attachments] == [
        "00000003-PHOTO-2024-03-01-09-07-30.jpg",  # "<Anhang: …>": the German "<attached: …>"
        "00000005-Notizen.pdf",
    ]
    assert [a.kind for e in got for a in e.attachments] == [AttachmentKind.IMAGE, AttachmentKind.DOCUMENT]
    # iOS marks its notices with U+200E: the encryption notice and "Bild weggelassen" (image
    # omitted) in German are service lines; the English placeholder and deletion are known words
    assert by_line(items, Skipped) == {"line 1": SERVICE, "line 4": SERVICE, "line 8": EMPTY, "line 9": DELETED}
    assert by_line(items, AttachmentSkipped) == {"line 8": MEDIA_NOT_EXPORTED}


# --- the line formats of phones in other regions ----------------------------------------------


def test_whatsapps_notices_under_a_name_are_service_lines(tmp_path):
    items = items_from(
        "5/9/22, 11:09 PM - Lln: You turned off disappearing messages. Tap to change.\n"
        "[4/28/22, 20:17:30] Elon: Your security code with Elon changed. Tap to learn more.\n"
        "5/9/22, 11:10 PM - Lln: I turned off the lights\n",
        tmp_path,
    )
    assert by_line(items, Skipped) == {"line 1": SERVICE, "line 2": SERVICE}
    assert [e.text for e in events(items)] == ["I turned off the lights"]


@pytest.mark.parametrize(
    "line",
    [
        "12/31/23, 11:59 PM - Ann: hi",  # Android, United States
        "12/31/23, 11:59\u202fPM - Ann: hi",  # newer Android: a narrow no-break space
        "31/12/2023, 23:59 - Ann: hi",  # United Kingdom, India
        "31.12.23, 23:59 - Ann: hi",  # Germany
        "31-12-2023 23:59 - Ann: hi",  # the Netherlands, no comma
        "2023-12-31, 23:59 - Ann: hi",  # Sweden
        "31/12/2023, 11:59 p. m. - Ann: hi",  # Spanish
        "2023. 12. 31. 오후 11:59 - Ann: hi",  # Korean: the afternoon before the time
        "[31/12/2023, 23:59:00] Ann: hi",  # iPhone
        "\u200e[12/31/23, 11:59:00 PM] Ann: hi",  # iPhone, United States, a marked line
        "[2023/12/31 23:59:00] Ann: hi",  # iPhone, Japan
        "[31.12.23, 23:59:00] Ann: hi",  # iPhone, Germany
        "[٣١/١٢/٢٠٢٣، ١١:٥٩:٠٠ م] Ann: hi",  # iPhone, Arabic: Arabic-Indic digits, its comma, "م" is PM
        "[12/31/2566 BE, 23:59:00] Ann: hi",  # iPhone on the Thai solar calendar
    ],
)
def test_the_date_and_time_as_phones_in_each_region_write_them(line, tmp_path):
    (event,) = events(items_from(line + "\n", tmp_path))
    assert (event.occurred_at, event.user_id, event.text) == (
        datetime(2023, 12, 31, 23, 59, tzinfo=UTC),
        "whatsapp:Ann",
        "hi",
    )


def test_placeholders_after_a_caption_and_spelled_with_spaces(tmp_path):
    block = (
        "[20.07.26, 12:02:00] Ralph: Sommerurlaub\n\u200eBild weggelassen\n"  # marked by iOS: any language
        "20.07.26, 12:03 - Ralph: \u200e< Media omitted >\u200f\n"
        "20.07.26, 12:04 - Ralph: <Medien ausgeschlossen>\n"  # three times in the file: a placeholder
    )
    items = items_from(block * 3, tmp_path)
    assert [e.text for e in events(items)] == ["Sommerurlaub"] * 3
    assert list(by_line(items, AttachmentSkipped).values()) == [MEDIA_NOT_EXPORTED] * 9
    # a bracketed text said once is words
    (event,) = events(items_from("20.07.26, 12:04 - Ralph: <big grin>\n", tmp_path))
    assert event.text == "<big grin>"


def test_twelve_oclock_is_noon_or_midnight(tmp_path):
    got = events(items_from("1/2/24, 12:05 AM - Ann: night\n1/2/24, 12:05 PM - Ann: noon\n", tmp_path))
    assert [e.occurred_at.hour for e in got] == [0, 12]


def test_an_ambiguous_date_order_is_told_by_which_number_changes_more_often(tmp_path):
    # No number above 12: the day changes from message to message, the month seldom.
    days = "".join(f"{m}/{d}/24, 10:00 - Ann: day {m}/{d}\n" for m in (1, 2) for d in range(1, 12, 2))
    path = tmp_path / "chat.txt"
    path.write_text(days)
    with open(path, "rb") as fh:
        layout = sniff_layout(fh)
    assert layout.date_order is DateOrder.MDY and "guessed" in layout.decided_by
    assert events(items_of(path))[1].occurred_at == datetime(2024, 1, 3, 10, 0, tzinfo=UTC)
    # the order given wins
    assert events(items_of(path, date_order=DateOrder.DMY))[1].occurred_at == datetime(2024, 3, 1, 10, 0, tzinfo=UTC)


def test_a_date_that_does_not_exist_fails_that_message_only(tmp_path):
    text = "2/28/24, 10:00 - Ann: fine\n2/30/24, 10:00 - Ann: no such day\n3/1/24, 9:00 - Ann: on\n"
    items = items_from(text, tmp_path)
    assert [e.text for e in events(items)] == ["fine", "on"]
    ((ref, reason),) = by_line(items, Failed).items()
    assert ref == "line 2" and "2/30/24" in reason and "does not exist" in reason


def test_bytes_that_are_not_utf8_become_the_replacement_character(tmp_path):
    path = tmp_path / "chat.txt"
    path.write_bytes("\ufeff1/2/24, 10:00 - Ann: caf".encode() + b"\xe9 ok\n")  # Latin-1 bytes, a BOM
    (event,) = events(items_of(path))
    assert event.text == "caf\ufffd ok"


def test_text_before_the_first_dated_line_is_reported(tmp_path):
    items = items_from("exported by a tool\n1/2/24, 10:00 - Ann: hi\n", tmp_path)
    assert by_line(items, Skipped) == {"line 1": "text before the first dated line"}


def test_a_file_that_is_not_a_whatsapp_export_says_so(tmp_path):
    with pytest.raises(ImportFormatError, match="not a WhatsApp chat export: no line starts with a date"):
        items_from("just some notes\nand more\n", tmp_path)
    (tmp_path / "chat.zip").write_bytes(b"PK")
    with pytest.raises(ImportFormatError, match="chat.zip is not a zip that can be read"):
        find_whatsapp_export(tmp_path / "chat.zip")
    assert not (tmp_path / "chat").exists()
    # a .txt shared in the chat lies beside the chat's file: the dated one is the chat
    (tmp_path / "WhatsApp Chat with Test.txt").write_text("\ufeff1/2/24, 10:00 - Ann: hi\n")
    (tmp_path / "shopping list.txt").write_text("eggs\nmilk\n")
    assert find_whatsapp_export(tmp_path) == tmp_path / "WhatsApp Chat with Test.txt"
    (tmp_path / "WhatsApp Chat with Other.txt").write_text("1/2/24, 10:00 - Ann: hi\n")
    with pytest.raises(ImportFormatError, match="2 chat files; name one"):
        find_whatsapp_export(tmp_path)


def test_the_zip_whatsapp_shares_is_unpacked_beside_it_once(tmp_path):
    archive = tmp_path / "WhatsApp Chat - Anna.zip"
    with zipfile.ZipFile(archive, "w") as package:
        for file in IOS_FOLDER.iterdir():
            package.write(file, file.name)
        package.writestr("../outside.txt", "a name that climbs out")
    chat = find_whatsapp_export(archive)
    folder = tmp_path / "WhatsApp Chat - Anna"
    assert chat == folder / "_chat.txt" and chat_name(chat) == "Anna"
    assert (folder / "00000003-PHOTO-2024-03-01-09-07-30.jpg").read_bytes() == (
        IOS_FOLDER / "00000003-PHOTO-2024-03-01-09-07-30.jpg"
    ).read_bytes()
    assert (folder / "outside.txt").is_file() and not (tmp_path.parent / "outside.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["WhatsApp Chat - Anna", "WhatsApp Chat - Anna.zip"]
    # the events are the folder's: the attachments point into it
    photo = next(a for e in events(items_of(chat)) for a in e.attachments if a.kind is AttachmentKind.IMAGE)
    assert photo.url == (folder / "00000003-PHOTO-2024-03-01-09-07-30.jpg").resolve().as_uri()

    (folder / "_chat.txt").write_text("[01.03.24, 09:06:00] Anna: kept\n")  # a second run: used as it is
    assert find_whatsapp_export(archive).read_text(encoding="utf-8") == "[01.03.24, 09:06:00] Anna: kept\n"


def test_a_zip_that_cannot_be_unpacked_leaves_nothing_behind(tmp_path, monkeypatch):
    archive = tmp_path / "WhatsApp Chat - Ben.zip"
    with zipfile.ZipFile(archive, "w") as package:
        package.writestr("notes.pdf", "x")
    with pytest.raises(ImportFormatError, match="holds no chat .txt"):
        find_whatsapp_export(archive)
    with zipfile.ZipFile(archive, "w") as package:
        package.writestr("_chat.txt", "[01.03.24, 09:06:00] Ben: hi\n" * 1000)
    free = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: free._replace(free=1000))
    with pytest.raises(ImportFormatError, match="unpacks to 0 MiB and 0 MiB are free"):
        find_whatsapp_export(archive)
    monkeypatch.undo()
    (tmp_path / "WhatsApp Chat - Ben").mkdir()  # someone else's folder of that name
    with pytest.raises(ImportFormatError, match="is in the way"):
        find_whatsapp_export(archive)
    (tmp_path / "WhatsApp Chat - Ben").rmdir()

    def broken(self, path):  # the disk fills, or the process is stopped, halfway
        (Path(path) / "_chat.txt").write_text("[01.03.24, 09:06:00] Ben: hi\n")
        raise OSError("No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "extractall", broken)
    with pytest.raises(ImportFormatError, match="cannot unpack WhatsApp Chat - Ben.zip beside it: No space left"):
        find_whatsapp_export(archive)
    assert [p.name for p in tmp_path.iterdir()] == ["WhatsApp Chat - Ben.zip"]  # no half folder to reuse


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("WhatsApp Chat with Anna.txt", "Anna"),
        ("WhatsApp-Chat mit Anna Maria.txt", "Anna Maria"),
        ("Chat de WhatsApp con Anna.txt", "Anna"),
        ("Conversa do WhatsApp com Anna.txt", "Anna"),
        ("Чат WhatsApp с контактом Dmitry S.txt", "Dmitry S"),
        ("WhatsApp Chat - Anna/_chat.txt", "Anna"),
        ("WhatsApp Chat with Trip planning (1).txt", "Trip planning"),  # the same chat exported again
        ("WhatsApp Chat with WhatsApp fans.txt", "WhatsApp fans"),
        ("export/_chat.txt", "export"),
    ],
)
def test_the_chats_name_from_the_file_name_in_the_phones_language(file, name):
    assert chat_name(Path(file)) == name


def test_time_zone_names(monkeypatch):
    assert time_zone("Europe/Berlin")[0] == BERLIN
    monkeypatch.setenv("TZ", "Europe/Lisbon")
    assert time_zone(None) == (ZoneInfo("Europe/Lisbon"), "Europe/Lisbon (this computer's; --timezone to change)")
    monkeypatch.setenv("TZ", "UTC+3")  # POSIX, not a zone's name: not guessed at
    with pytest.raises(ValueError, match="this computer's time zone cannot be read .* --timezone"):
        time_zone(None)
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        time_zone("Mars/Olympus")


# --- ids, and imports of a newer export --------------------------------------------------------


def test_a_newer_export_of_the_chat_gives_the_same_ids_to_the_same_messages(tmp_path):
    # WhatsApp exports the latest messages only: a newer export starts later and ends later.
    lines = ANDROID.read_text(encoding="utf-8").splitlines(keepends=True)
    newer = "".join(lines[3:]) + "4/3/24, 9:00\u202fAM - Leo: Next trip: Porto in May.\n"
    old = events(items_of(ANDROID))
    new = events(items_from(newer, tmp_path, chat="Trip planning"))
    assert [e.text for e in new if e.event_id not in {o.event_id for o in old}] == ["Next trip: Porto in May."]
    assert [(e.event_id, e.text) for e in new[:-1]] == [(o.event_id, o.text) for o in old]

    pub = FakePublisher()
    options = WhatsAppOptions(chat="Trip planning", zone=UTC)
    for path in (ANDROID, tmp_path / "WhatsApp Chat with Test.txt"):
        stored = {e.event_id for e in pub.published}
        run = ChatImport(pub, stored.intersection, json_files=False)
        run.run([path], lambda fh, folder: whatsapp_items(fh, folder, options))
    assert run.report.published == 1 and run.report.already_imported == 10


def test_a_json_escape_typed_in_a_message_is_kept_as_typed(tmp_path):
    path = tmp_path / "chat.txt"
    path.write_text("1/2/24, 10:00 - Ann: in JSON it is \\ud83d\\ude00 or \\ud83d alone\n")
    pub = FakePublisher()
    run = ChatImport(pub, lambda ids: set(), json_files=False)
    options = WhatsAppOptions(chat="t", zone=UTC)
    run.run([path], lambda fh, folder: whatsapp_items(fh, folder, options))
    assert [e.text for e in pub.published] == ["in JSON it is \\ud83d\\ude00 or \\ud83d alone"]


# --- damaged files ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_export_gives_events_that_survive_the_wire_or_reasons(data, tmp_path):
    # Lines of the fixture cut, doubled, swapped or replaced by arbitrary text: the import yields
    # only events, skips and failures, and every event passes the wire's own validation.
    lines = ANDROID.read_text(encoding="utf-8").splitlines()
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["cut", "double", "replace", "drop"]))
        if action == "cut":
            lines[at] = lines[at][: data.draw(st.integers(0, len(lines[at])))]
        elif action == "double":
            lines.insert(at, lines[at])
        elif action == "replace":
            lines[at] = data.draw(st.text(max_size=80))
        elif len(lines) > 1:
            del lines[at]
    path = tmp_path / "WhatsApp Chat with Test.txt"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    try:
        items = items_of(path)
    except ImportFormatError as error:
        assert "no line starts with a date" in str(error)
        return
    for item in items:
        assert isinstance(item, MessageEvent | Skipped | Failed | AttachmentSkipped)
        if isinstance(item, MessageEvent):
            assert parse_event(serialize(item)) == item


def test_the_file_is_read_in_chunks_and_lines_split_across_them_stay_whole(tmp_path):
    text = "1/2/24, 10:00 - Ann: " + "x" * 70_000 + "\n1/2/24, 10:01 - Ann: after é\n"
    asked: list[int] = []

    class Recorded(io.BytesIO):
        def read(self, size=-1, /):
            asked.append(size)
            return super().read(size)

    options = WhatsAppOptions(chat="t", zone=UTC)
    got = events(whatsapp_items(Recorded(text.encode()), tmp_path, options))
    assert "".join(e.text for e in got[:-1]) == "x" * 70_000  # split in parts at the text limit
    assert got[-1].text == "after é"
    assert asked and all(0 < size <= 1 << 16 for size in asked)  # never the whole file at once


def test_zones_are_read_on_a_machine_without_a_zone_database(tmp_path):
    # Windows and slim containers have no /usr/share/zoneinfo: zoneinfo then reads the tzdata
    # package, which the project pins. An empty search path stands for such a machine.
    import subprocess
    import sys

    script = (
        "import datetime, zoneinfo; from chatmem.producers.import_whatsapp import time_zone; "
        "print(zoneinfo.TZPATH, time_zone('America/Sao_Paulo')[0].utcoffset(datetime.datetime(2024, 1, 1)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONTZPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"('{tmp_path}',) -1 day, 21:00:00"


def test_a_layout_already_read_is_used_not_read_again(tmp_path):
    path = tmp_path / "chat.txt"
    path.write_text("13/1/24, 10:00 - Ann: hi\n")
    with open(path, "rb") as fh:
        layout = sniff_layout(fh)
    reads: list[int] = []

    class Counted(io.BytesIO):
        def seek(self, *args):
            reads.append(1)  # sniff_layout rewinds once it has read the file
            return super().seek(*args)

    options = WhatsAppOptions(chat="t", zone=UTC, layout=layout)
    (event,) = events(whatsapp_items(Counted(path.read_bytes()), tmp_path, options))
    assert event.occurred_at == datetime(2024, 1, 13, 10, 0, tzinfo=UTC) and reads == []


def test_more_files_than_an_event_holds_are_counted(tmp_path):
    (tmp_path / "IMG-20240102-WA0001.jpg").write_bytes(b"\xff\xd8")
    lines = "\n".join(["IMG-20240102-WA0001.jpg (file attached)"] * 33)
    items = items_from(f"1/2/24, 10:00 - Ann: {lines}\n", tmp_path)
    (event,) = events(items)
    assert len(event.attachments) == 32
    assert [i.reason for i in items if isinstance(i, AttachmentSkipped)] == [TOO_MANY]
