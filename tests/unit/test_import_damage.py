"""Chat exports damaged the ways real ones are: the escape of half an emoji, bytes that are not
UTF-8, and fields of another JSON type than the format's. An import reports what it cannot take
and goes on; nothing escapes but a format error, and every event it makes survives the wire."""

import copy
import functools
import io
import json
import random
from pathlib import Path

import ijson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatmem.producers.import_chatgpt import chatgpt_items, current_branch
from chatmem.producers.import_discord import discord_items
from chatmem.producers.import_meta import MetaOptions, meta_items
from chatmem.producers.import_slack import read_workspace, slack_items
from chatmem.producers.import_telegram import TelegramOptions, telegram_items
from chatmem.producers.importers import (
    FILE_UNNAMEABLE,
    AttachmentSkipped,
    ChatImport,
    Failed,
    ImportFormatError,
    LoneSurrogatesReplaced,
    Skipped,
    replace_lone_surrogates,
)
from chatmem.producers.publisher import serialize
from chatmem.schemas.events import MessageEvent, parse_event
from tests.unit.test_import_slack import SLACK
from tests.unit.test_importers import CHATGPT, DISCORD, EXPORTS, TELEGRAM, TELEGRAM_ACCOUNT, FakePublisher

FORMATS = {
    "telegram": (TELEGRAM, telegram_items),
    "telegram account": (TELEGRAM_ACCOUNT, telegram_items),
    "discord": (DISCORD, discord_items),
    "chatgpt": (CHATGPT, chatgpt_items),
    "messenger": (
        EXPORTS / "messenger" / "messages" / "inbox" / "leojoao_1234567890" / "message_1.json",
        functools.partial(meta_items, options=MetaOptions()),
    ),
    "messenger, end-to-end encrypted chats": (
        EXPORTS / "messenger_e2ee" / "LeoJoao_12.json",
        functools.partial(meta_items, options=MetaOptions()),
    ),
    "slack": (SLACK / "general" / "2024-03-01.json", functools.partial(slack_items, workspace=read_workspace(SLACK))),
}


def import_bytes(tmp_path: Path, raw: bytes, parser) -> tuple[ChatImport, FakePublisher]:
    path = tmp_path / "export.json"
    path.write_bytes(raw)
    pub = FakePublisher()
    run = ChatImport(pub, lambda ids: set(), batch_size=2)
    run.run([path], parser)
    return run, pub


# --- half an emoji --------------------------------------------------------------------------


def test_an_unpaired_surrogate_escape_becomes_the_replacement_character(tmp_path):
    # A text cut inside "😀" (\ud83d\ude00) by an exporter counting UTF-16: either half alone.
    doc = json.loads(TELEGRAM.read_text(encoding="utf-8"))
    whole, _ = import_bytes(tmp_path, json.dumps(doc, ensure_ascii=True).encode(), telegram_items)
    doc["messages"][1]["text"] = "cut at the end \ud83d"
    doc["messages"][2]["text"] = "\ude00 cut at the start, whole: \U0001f600"
    run, pub = import_bytes(tmp_path, json.dumps(doc, ensure_ascii=True).encode(), telegram_items)
    texts = {e.platform_message_id: e.text for e in pub.published}
    assert texts["2"] == "cut at the end \ufffd"
    assert texts["3"] == "\ufffd cut at the start, whole: \U0001f600"
    counts = ("published", "failed", "failures", "skipped", "attachments", "attachments_skipped")
    assert [getattr(run.report, c) for c in counts] == [getattr(whole.report, c) for c in counts]
    for event in pub.published:
        assert parse_event(serialize(event)) == event


def test_bytes_that_are_not_utf8_end_the_import_with_where_after_publishing_what_came_before(tmp_path):
    raw = TELEGRAM.read_bytes()
    at = raw.index(b"Rua Augusta")
    raw = raw[:at] + b"\xed\xa0\x80" + raw[at:]  # a surrogate written as bytes (CESU-8)
    pub = FakePublisher()
    path = tmp_path / "result.json"
    path.write_bytes(raw)
    run = ChatImport(pub, lambda ids: set(), batch_size=1)
    where = r"result.json: not valid JSON near byte [\d,]+ \(text that is not UTF-8"
    with pytest.raises(ImportFormatError, match=where):
        run.run([path], telegram_items)
    assert run.report.published == len(pub.published) > 0


def _oracle(text: str) -> str:
    """Surrogate pairs joined, each lone half the replacement character."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# Halves, pairs, and text that looks like an escape after a backslash that is escaped itself.
_PIECES = st.sampled_from(
    ["a", "\\", "u", "d83d", "dc00", '"', "\ud83d", "\ude00", "\udbff", "\udc00", "é", "😀", "\\ud800", "\n"]
)


@settings(max_examples=500, deadline=None)
@given(
    texts=st.lists(st.lists(_PIECES, max_size=14).map("".join), min_size=1, max_size=4),
    ascii_only=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_reader_replaces_exactly_the_unpaired_halves_whatever_the_chunks(texts, ascii_only, seed):
    raw = json.dumps(texts, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if not ascii_only and any("\ud800" <= c <= "\udfff" for t in texts for c in t):
        return  # a surrogate written as raw bytes is not an escape: the test above
    rng = random.Random(seed)
    reader = LoneSurrogatesReplaced(_Trickle(raw, rng))
    pieces = []
    while piece := reader.read(rng.randint(1, 24)):
        pieces.append(piece)
    out = b"".join(pieces)
    assert len(out) == len(raw) and reader.tell() == len(raw)
    assert json.loads(out) == [_oracle(t) for t in texts]


class _Trickle(io.BytesIO):
    """A file that gives fewer bytes than asked, as a pipe or a network file system may."""

    def __init__(self, raw: bytes, rng: random.Random):
        super().__init__(raw)
        self.rng = rng

    def read(self, size: int | None = -1) -> bytes:
        return super().read(min(size, self.rng.randint(1, 16)) if size and size > 0 else size)


def test_a_decision_waits_for_the_other_half_at_a_chunk_end():
    assert replace_lone_surrogates(b'"x\\ud83d', final=False) == (b'"x', b"\\ud83d")
    assert replace_lone_surrogates(b'"x\\ud83d\\ude00"', final=False) == (b'"x\\ud83d\\ude00', b'"')
    assert replace_lone_surrogates(b'"x\\ud83d"', final=True) == (b'"x\\ufffd"', b"")
    assert replace_lone_surrogates(b'"\\\\ud83d"', final=True) == (b'"\\\\ud83d"', b"")  # a backslash, then text


# --- fields of another type -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("telegram", {("type",): []}),  # the chat's type, looked up in a set
        ("telegram", {("messages", 3, "text"): "", ("messages", 3, "poll"): {"question": "q", "answers": True}}),
        ("telegram, service kept", {("messages", 0, "members"): 3}),
        ("discord", {("messages", 1, "attachments"): True}),
        ("discord", {("messages", 1, "content"): "", ("messages", 1, "embeds"): 5}),
        ("chatgpt", {(0, "mapping", "u1", "message", "content", "content_type"): []}),
        # no current node: the walk from the root, whose parent and children are of other types
        ("chatgpt", {(0, "current_node"): None, (0, "mapping", "root", "parent"): ["x"]}),
        ("chatgpt", {(0, "current_node"): None, (0, "mapping", "sys", "children"): 7}),
    ],
)
def test_a_field_of_another_type_is_reported_not_raised(name, changes):
    path, parser = FORMATS[name.split(",")[0]]
    if name.endswith("service kept"):
        parser = functools.partial(parser, options=TelegramOptions(keep_service=True))
    doc = json.loads(path.read_text(encoding="utf-8"))
    for where, value in changes.items():
        _set(doc, where, value)
    for item in parser(io.BytesIO(json.dumps(doc).encode()), path.parent):
        assert isinstance(item, MessageEvent | Skipped | Failed | AttachmentSkipped)


def test_the_branch_walk_takes_only_string_node_ids():
    mapping = {"r": {"parent": ["x"], "children": [["a"], "a"]}, "a": {"parent": "r", "children": True}}
    assert current_branch(mapping, {"not": "an id"}) == ["r", "a"]


def _paths(value, prefix=()):
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _paths(inner, (*prefix, key))


def _set(doc, path, value) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


_TEXT = st.text(max_size=10) | st.sampled_from(["", "\x00", "\ud800", "\udc00", "nan", "-1", "../../x", "a" * 300])
_NUMBER = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
_LEAF = st.none() | st.booleans() | _NUMBER | _TEXT
_VALUE = st.recursive(
    _LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6
)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_any_field_of_an_export_replaced_by_any_json_gives_reports_or_events_that_survive_the_wire(name):
    path, parser = FORMATS[name]
    base = json.loads(path.read_text(encoding="utf-8"))
    places = [p for p in _paths(base) if p]

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(places), _VALUE), min_size=1, max_size=3))
    def check(changes):
        doc = copy.deepcopy(base)
        for where, value in changes:
            try:
                _set(doc, where, value)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier change removed the place
        raw = json.dumps(doc).encode()
        try:
            items = list(parser(LoneSurrogatesReplaced(io.BytesIO(raw)), path.parent))
        except (ImportFormatError, ijson.JSONError):
            return  # ChatImport.run reports either as a format error (yajl takes integers to 2**63)
        for item in items:
            assert isinstance(item, MessageEvent | Skipped | Failed | AttachmentSkipped)
            if isinstance(item, MessageEvent):
                assert parse_event(serialize(item)) == item

    check()


@pytest.mark.parametrize("reference", ["\x00", "a" * 300, "photos/\x00.jpg", "photos/" + "b" * 300 + ".jpg"])
def test_a_file_path_this_system_cannot_hold_skips_the_file_not_the_import(reference):
    path, parser = FORMATS["telegram"]
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["messages"][3]["photo"] = reference  # a photo the export holds, its path damaged
    items = list(parser(LoneSurrogatesReplaced(io.BytesIO(json.dumps(doc).encode())), path.parent))
    assert FILE_UNNAMEABLE in [i.reason for i in items if isinstance(i, AttachmentSkipped)]
    message_id = f"{doc['messages'][3]['id']}"
    assert any(isinstance(i, MessageEvent) and i.platform_message_id == message_id for i in items)


# --- a byte order mark ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_an_export_saved_with_a_byte_order_mark_imports_as_without(tmp_path, name):
    path, parser = FORMATS[name]
    raw = path.read_bytes()
    plain, plain_pub = import_bytes(tmp_path, raw, parser)
    marked, marked_pub = import_bytes(tmp_path, b"\xef\xbb\xbf" + raw, parser)
    assert marked_pub.published == plain_pub.published and plain.report.published > 0
    assert marked.report.bytes_read == plain.report.bytes_read + 3


def test_a_jsonl_file_saved_with_a_byte_order_mark_keeps_its_first_event(tmp_path):
    from chatmem.producers.importers import publish_jsonl
    from chatmem.schemas.settings import Settings

    lines = [MessageEvent(event_id=f"e{i}", thread_id="t", user_id="u", text=f"line {i}") for i in range(3)]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(serialize(e) for e in lines))
    pub = FakePublisher()
    result = publish_jsonl(pub, path, Settings())
    assert result.rejected == [] and [e.event_id for e in pub.published] == ["e0", "e1", "e2"]
