"""Crypto-shredding for the event log: the content of each event is encrypted at rest with a data
key of its user (AES-256-GCM); data keys are stored wrapped by a key-encryption key (KEK) from
settings. Destroying a user's data key makes every event of theirs unreadable for good, in the
log and in every backup of it: such an event opens as a tombstone. Ids, types and times stay in
clear, so ordering, deduplication and per-thread processing work without any key.

The sealed form keeps the event's clear fields and replaces its content fields with
`sealed: base64(nonce || ciphertext)`. The event id is the associated data, so a sealed
content cannot be moved onto another event. Event content is sealed with AES-GCM-SIV (the
nonce-misuse-resistant member of the AES-GCM family) and a nonce derived from the event id: the
same event sealed twice gives the same bytes, so a redelivery still compares equal to the
logged version and a reused event id with other content still shows as a conflict. Equal
ciphertexts reveal only that one event id carried the same content twice."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV

from chatmem.schemas.events import ERASED

log = logging.getLogger(__name__)

# What a user said or sent, per event type; everything else (ids, type, times, role, the platform
# message ids) stays in clear.
CONTENT_FIELDS: dict[str, tuple[str, ...]] = {
    "message": ("text", "attachments", "metadata"),
    "message_edited": ("text", "metadata"),
    "message_deleted": ("metadata",),
    "command": ("args", "metadata"),
}
SEALED = "sealed"
_NONCE = 12


class KeyUnusable(Exception):
    """A key that cannot be used: the wrong KEK, or a damaged wrapped key."""


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def _encrypt(key: bytes, plain: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE)
    return nonce + AESGCM(key).encrypt(nonce, plain, aad)


def _decrypt(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(sealed[:_NONCE], sealed[_NONCE:], aad)
    except Exception as error:  # InvalidTag, or a truncated value
        raise KeyUnusable("cannot decrypt: wrong key or damaged data") from error


def wrap(kek: bytes, data_key: bytes, user_id: str) -> bytes:
    """A data key as stored: encrypted by the KEK and bound to its user."""
    return _encrypt(kek, data_key, user_id.encode())


def unwrap(kek: bytes, wrapped: bytes, user_id: str) -> bytes:
    return _decrypt(kek, wrapped, user_id.encode())


@functools.lru_cache(maxsize=4096)
def _siv(data_key: bytes) -> AESGCMSIV:
    # Building the cipher expands the key: once per data key, not once per event.
    return AESGCMSIV(data_key)


def seal(payload: dict[str, Any], data_key: bytes) -> dict[str, Any]:
    """The event with its content fields encrypted (see CONTENT_FIELDS)."""
    fields = CONTENT_FIELDS.get(str(payload.get("type")), ())
    content = {k: payload[k] for k in fields if k in payload}
    clear = {k: v for k, v in payload.items() if k not in fields}
    plain = json.dumps(content, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
    aad = str(payload["event_id"]).encode()
    nonce = hashlib.sha256(aad).digest()[:_NONCE]
    sealed = nonce + _siv(data_key).encrypt(nonce, plain, aad)
    return {**clear, SEALED: base64.b64encode(sealed).decode()}


def open_sealed(payload: dict[str, Any], data_key: bytes | None) -> dict[str, Any]:
    """The event as published; a tombstone (empty content, `metadata.erased`) when its user's key
    is gone. An event stored before encryption was on comes back as it is."""
    if SEALED not in payload:
        return payload
    clear = {k: v for k, v in payload.items() if k != SEALED}
    if data_key is None:
        return {**clear, **tombstone(str(payload.get("type")))}
    sealed, aad = base64.b64decode(payload[SEALED]), str(payload["event_id"]).encode()
    try:
        plain = _siv(data_key).decrypt(sealed[:_NONCE], sealed[_NONCE:], aad)
    except Exception as error:  # InvalidTag, or a truncated value
        raise KeyUnusable("cannot decrypt: wrong key or damaged data") from error
    return {**clear, **json.loads(plain)}


def tombstone(event_type: str) -> dict[str, Any]:
    empty: dict[str, Any] = {"text": "", "attachments": [], "args": {}}
    fields = CONTENT_FIELDS.get(event_type, ())
    return {**{k: empty[k] for k in fields if k in empty}, "metadata": {ERASED: True}}


def kek_from_setting(value: str) -> bytes:
    try:
        key = base64.b64decode(value.strip(), validate=True)
    except ValueError as error:
        raise KeyUnusable("CHATMEM_KEK is not base64") from error
    if len(key) != 32:
        raise KeyUnusable("CHATMEM_KEK must be 32 bytes (256 bits), base64-encoded")
    return key


def load_or_create_kek(path: Path) -> bytes:
    """The embedded default's KEK: kept beside the data, created on first use. Losing it loses
    every event's content; an operator must back it up (and keep the backup apart from the
    database backups, or erasure means nothing for those)."""
    if path.exists():
        try:
            return kek_from_setting(path.read_text(encoding="utf-8"))
        except KeyUnusable as error:
            raise KeyUnusable(f"{path}: {error}") from error
    key = new_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(base64.b64encode(key).decode() + "\n")
    log.warning(
        "created the key-encryption key %s: back it up, apart from database backups; without it the "
        "content of the event log cannot be read",
        path,
    )
    return key
