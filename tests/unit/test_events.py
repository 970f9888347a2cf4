import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chatmem.schemas.events import InvalidEvent, MessageEvent, parse_event, validate_identifier
from chatmem.schemas.export import write_schemas


def wire(**fields):
    base = {"type": "message", "event_id": "e1", "thread_id": "t1", "user_id": "u1", "text": "hello"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def reason(raw, **limits):
    with pytest.raises(InvalidEvent) as info:
        parse_event(raw, **limits)
    return info.value.reason


def test_valid_message_round_trips():
    event = parse_event(wire(occurred_at="2024-05-08T13:56:00Z", attachments=[{"url": "https://x.test/a.png"}]))
    assert isinstance(event, MessageEvent)
    assert parse_event(event.model_dump_json()) == event


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "event: "),
        (wire(type="sticker"), "type: unknown event type 'sticker'"),
        (wire(type=...), "type: field required"),
        (wire(user_id=...), "user_id: field required"),
        (wire(text=5), "text: Input should be a valid string"),
        (wire(schema_version=9), "schema_version: unsupported schema_version 9 (supported: 1)"),
        (wire(event_id=...), "event_id: field required"),
        (wire(thread_id="*"), "thread_id: may contain only"),
        (wire(user_id="' OR 1=1 --"), "user_id: may contain only"),
        (wire(user_id="%"), "user_id: may contain only"),
        (wire(text="a\x00b"), "text: must not contain NUL"),
        (wire(occurred_at="2024-05-08T13:56:00"), "occurred_at: must carry a timezone"),
        (wire(attachments=[{"url": "ftp://x"}]), "attachments.0.url: must be a file://, https:// or data: URI"),
        (wire(surprise=1), "surprise: Extra inputs are not permitted"),
        (
            json.dumps({"type": "command", "event_id": "c", "thread_id": "t", "user_id": "u", "command": "explode"}),
            "command: Input should be",
        ),
    ],
)
def test_bad_events_name_field_and_problem(raw, expected):
    assert expected in reason(raw)


def test_text_limit_is_configurable():
    assert reason(wire(text="x" * 11), max_text_chars=10) == "text: is 11 characters, above the limit of 10"
    assert parse_event(wire(text="x" * 10), max_text_chars=10).text == "x" * 10


def test_data_uri_limit():
    big = "data:text/plain;base64," + "A" * 200
    assert "above the limit of 100" in reason(wire(attachments=[{"url": big}]), max_data_uri_bytes=100)


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("metadata", {"score": float("inf")}, "metadata: /score is inf"),
        ("metadata", {"a": [1, {"b": float("nan")}]}, "metadata: /a/1/b is nan"),
        ("metadata", {"a/b~": -float("inf")}, "metadata: /a~1b~0 is -inf"),
    ],
)
def test_nan_and_infinity_are_refused_where_they_are(field, value, where):
    # Python's json writes them (Infinity, NaN) and reads them back; the model's JSON would log null.
    assert where in reason(wire(**{field: value}))
    with pytest.raises(ValidationError, match="JSON has no NaN or Infinity"):
        MessageEvent(thread_id="t1", user_id="u1", **{field: value})


def test_a_number_beyond_a_double_is_refused_and_large_finite_ones_kept():
    raw = '{"type": "command", "event_id": "c1", "thread_id": "t1", "user_id": "u1", "command": "configure", '
    assert "args: /time_gap_hours is inf" in reason(raw + '"args": {"time_gap_hours": 1e400}}')
    event = parse_event(wire(metadata={"big": 1e308, "huge_int": 10**30}))
    assert parse_event(event.model_dump_json()) == event


@pytest.mark.parametrize(
    ("args", "where"),
    [
        ({"text": "I like\x00 tea"}, "args: /text contains a NUL character"),
        ({"markers": ["a", "new\x00topic"]}, "args: /markers/1 contains a NUL character"),
        ({"k\x00": 1}, "args: /k\\u0000 contains a NUL character"),  # escaped: reasons are stored as text
    ],
)
def test_nul_in_a_commands_arguments_is_refused_and_in_metadata_kept(args, where):
    # Arguments reach Postgres text and jsonb; metadata is only logged, sealed.
    command = {"type": "command", "event_id": "c1", "thread_id": "t1", "user_id": "u1", "command": "remember"}
    got = reason(json.dumps({**command, "args": args}))
    assert got == where and "\x00" not in got
    assert parse_event(wire(metadata={"note": "a\x00b"})).metadata == {"note": "a\x00b"}


def test_identifier_validation_refuses_wildcards_and_quotes():
    assert validate_identifier("telegram:123") == "telegram:123"
    for bad in ["*", "%", "' OR 1=1 --", "", "a b", "x" * 129]:
        with pytest.raises(InvalidEvent):
            validate_identifier(bad)


def test_committed_json_schemas_are_current():
    stale = write_schemas(check=True)
    assert stale == [], f"run `chatmem export-schemas`: stale {stale}"


# Any JSON value in any of the wire's fields: ingest dead-letters what it cannot accept by catching
# InvalidEvent, so every other exception a validator might raise would stall the stream instead.
_FIELDS = [
    "type",
    "event_id",
    "thread_id",
    "user_id",
    "text",
    "role",
    "occurred_at",
    "attachments",
    "schema_version",
    "platform",
    "platform_message_id",
    "platform_message_ids",
    "reply_to",
    "metadata",
    "command",
    "args",
]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=5),
    st.lists(st.sampled_from(_FIELDS), max_size=2),
    st.sampled_from(["message", "message_edited", "message_deleted", "command"]),
)
def test_any_field_value_parses_or_is_refused_with_a_reason(changes, dropped, kind):
    event = {"type": kind, "event_id": "e1", "thread_id": "t1", "user_id": "u1"} | {
        "message": {"text": "hi"},
        "message_edited": {"text": "hi", "platform_message_id": "m1"},
        "message_deleted": {"platform_message_ids": ["m1"]},
        "command": {"command": "remember", "args": {"text": "x"}},
    }[kind]
    event.update(changes)
    for name in dropped:
        event.pop(name, None)
    raw = json.dumps(event)
    try:
        parsed = parse_event(raw)
    except InvalidEvent as error:
        assert ":" in error.reason, error.reason
    else:
        assert parse_event(parsed.model_dump_json()) == parsed


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120))
def test_any_bytes_parse_or_are_refused_with_a_reason(raw):
    try:
        parse_event(raw)
    except InvalidEvent as error:
        assert error.reason


def test_a_deletion_names_one_to_a_thousand_messages():
    deleted = wire(type="message_deleted", text=..., platform_message_ids=["41", "42"])
    assert parse_event(deleted).platform_message_ids == ["41", "42"]
    assert reason(wire(type="message_deleted", text=..., platform_message_ids=[])).startswith(
        "platform_message_ids: List should have at least 1 item"
    )
    many = [str(i) for i in range(1001)]
    assert "at most 1000 items" in reason(wire(type="message_deleted", text=..., platform_message_ids=many))
    assert reason(wire(type="message_deleted", text=..., platform_message_ids=[""])).startswith(
        "platform_message_ids.0: String should have at least 1 character"
    )
    assert "NUL" in reason(wire(type="message_deleted", text=..., platform_message_ids=["4\u00002"]))
    assert "message_deleted" in reason(wire(type="message_removed"))
