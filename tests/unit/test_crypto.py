"""Crypto-shredding primitives: content sealed per user, ids in clear, tombstones without a key."""

import json

import pytest

from chatmem.adapters.crypto import (
    KeyUnusable,
    load_or_create_kek,
    new_key,
    open_sealed,
    seal,
    unwrap,
    wrap,
)

EVENT = {
    "schema_version": 1,
    "event_id": "tg:1:7",
    "type": "message",
    "thread_id": "tg:1",
    "user_id": "tg:42",
    "occurred_at": "2026-03-01T09:00:00Z",
    "role": "user",
    "platform_message_id": "7",
    "text": "my passport number is X1234567",
    "attachments": [{"url": "file:///tmp/passport.png", "kind": "image", "caption": "passport"}],
    "metadata": {"author_name": "Alice"},
}


def test_sealed_content_is_unreadable_and_opens_back_exactly():
    key = new_key()
    sealed = seal(EVENT, key)
    stored = json.dumps(sealed)
    for secret in ("X1234567", "passport", "Alice"):
        assert secret not in stored
    assert {k: sealed[k] for k in ("event_id", "thread_id", "user_id", "occurred_at", "platform_message_id")} == {
        k: EVENT[k] for k in ("event_id", "thread_id", "user_id", "occurred_at", "platform_message_id")
    }
    assert open_sealed(sealed, key) == EVENT


def test_without_the_key_an_event_opens_as_a_tombstone_and_a_wrong_key_is_refused():
    sealed = seal(EVENT, new_key())
    gone = open_sealed(sealed, None)
    assert gone["text"] == "" and gone["attachments"] == [] and gone["metadata"] == {"erased": True}
    assert gone["event_id"] == EVENT["event_id"] and gone["thread_id"] == EVENT["thread_id"]
    with pytest.raises(KeyUnusable):
        open_sealed(sealed, new_key())


def test_sealed_content_cannot_be_moved_to_another_event():
    key = new_key()
    moved = {**seal(EVENT, key), "event_id": "tg:1:8"}
    with pytest.raises(KeyUnusable):
        open_sealed(moved, key)


def test_data_keys_are_wrapped_for_their_user_and_the_kek_file_is_private(tmp_path):
    kek = load_or_create_kek(tmp_path / "kek")
    assert load_or_create_kek(tmp_path / "kek") == kek  # kept, not regenerated
    assert (tmp_path / "kek").stat().st_mode & 0o777 == 0o600
    data_key = new_key()
    wrapped = wrap(kek, data_key, "tg:42")
    assert unwrap(kek, wrapped, "tg:42") == data_key
    with pytest.raises(KeyUnusable):
        unwrap(kek, wrapped, "tg:43")


def test_an_event_stored_before_encryption_comes_back_as_it_is():
    assert open_sealed(EVENT, None) == EVENT


def test_the_same_event_seals_to_the_same_bytes_so_redeliveries_and_conflicts_still_compare():
    key = new_key()
    assert seal(EVENT, key) == seal(dict(EVENT), key)
    assert seal({**EVENT, "text": "other"}, key) != seal(EVENT, key)
