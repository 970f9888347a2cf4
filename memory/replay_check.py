"""What `replay --check` compares beyond the generation's own tables: facts and artifacts.

Facts. The rebuild runs the fact jobs as replay does (inline, through the cached LLM) into
`ScratchFacts`, an in-memory fact store: nothing reaches the `facts` table or mem0. Its
derivation is compared with the active generation's in two ways:
- `derived`: per operation (an episode's extraction, a remember command) and fact, the user,
  category, key and a digest of the candidate, against what the operation's ledger entry
  recorded when it ran;
- `fact`: the rows of `facts` the active generation owns (value, source, source events),
  against the candidates whose recorded write left such a row (an insert, a replace, a rebuild's
  move). A candidate that met an equal or stronger value elsewhere (`same`, `keep_old`) owns no
  row, which is why the ledger's record decides.
Forget commands are not compared: what they archive depends on the user's facts in every thread.

Artifacts belong to the file, not to a generation, and are not analysed again (OCR and vision are
neither cheap nor, for a remote model, repeatable). What is checked is exact and cheap:
- each attachment the log references has its reference row with the same reference, and no
  reference row exists that the log does not hold;
- the caption of each linked attachment is the caption the log holds;
- each linked file's bytes are in the blob store and hash to their name;
- each analysed file's stored texts and description are what its analysis produced (the digest
  recorded with it, `meta.texts_sha256`; files analysed before it was recorded are skipped)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatmem.memory.attachments import texts_digest
from chatmem.memory.fact_jobs import FactWrite, UserLine
from chatmem.memory.facts import FactCandidate

Row = tuple[Any, ...]
OpKey = tuple[str, str]  # ("episode", episode_id) | ("remember", event_id)


def op_of(op_key: str) -> OpKey | None:
    """The operation of a ledger key (`<episode>:g<generation>:facts`, `<event>:g<n>:remember`),
    without the generation; None for operations the check does not compare (forget)."""
    ident, _, kind = op_key.rsplit(":", 2)
    return {"facts": ("episode", ident), "remember": ("remember", ident)}.get(kind)


@dataclass(frozen=True)
class FactRow:
    """A row of `facts` a generation owns, or a candidate a rebuild derived."""

    user_id: str
    episode_id: str | None
    category: str
    key: str
    value: str
    source: str
    event_ids: tuple[str, ...]

    @property
    def op(self) -> OpKey:
        if self.source == "remember":
            return ("remember", self.event_ids[0] if self.event_ids else "")
        return ("episode", self.episode_id or "")

    def row(self) -> Row:
        # Compared without case: a rebuild keeps the row of an equal value (facts_pg, "same").
        return ("fact", *self.op, self.user_id, self.category, self.key, self.value.lower(), self.source,
                self.event_ids)  # fmt: skip


class UserLines(Protocol):
    def episode_user_lines(self, thread_id: str, generation: int, episode_id: str) -> list[UserLine]: ...

    def command_event(self, event_id: str) -> dict | None: ...


@dataclass
class ScratchFacts:
    """The FactStore and CommandFacts ports in memory, for a generation that is never switched to:
    it reads the scratch generation's messages and the command events, and keeps every write."""

    source: UserLines
    ledger: dict[str, dict] = field(default_factory=dict)
    candidates: list[FactRow] = field(default_factory=list)

    def ledger_get(self, op_key: str) -> dict | None:
        return self.ledger.get(op_key)

    def ledger_put(self, op_key: str, result: dict) -> None:
        self.ledger.setdefault(op_key, result)

    def job_state(self, op_key: str, thread_id: str, generation: int) -> tuple[dict | None, bool]:
        return self.ledger.get(op_key), True  # the scratch generation is the one being derived

    def episode_user_lines(self, thread_id: str, generation: int, episode_id: str) -> list[UserLine]:
        return self.source.episode_user_lines(thread_id, generation, episode_id)

    def command_event(self, event_id: str) -> dict | None:
        return self.source.command_event(event_id)

    def apply_fact(
        self,
        *,
        user_id: str,
        thread_id: str,
        generation: int,
        episode_id: str | None,
        fact: FactCandidate,
        event_ids: list[str],
        source: str,
    ) -> FactWrite:
        self.candidates.append(
            FactRow(user_id, episode_id, fact.category, fact.key, fact.value, source, tuple(event_ids))
        )
        return FactWrite("derived", None, [])

    def set_mem0_id(self, fact_id: int, mem0_id: str) -> None:
        raise AssertionError("a scratch derivation never writes to mem0")

    def mem0_id_of(self, fact_id: int) -> str | None:
        return None

    def forget(self, *, user_id: str, text: str, event_id: str) -> list[tuple[int, str | None]]:
        return []

    def set_command_detail(self, event_id: str, generation: int, detail: str) -> None:
        pass

    def archive_rebuilt(self, thread_id: str, generation: int) -> list[tuple[int, str | None]]:
        return []


def _derived_rows(op: OpKey, result: Mapping[str, Any]) -> set[Row]:
    return {("derived", *op, d["user_id"], d["category"], d["key"], d["digest"]) for d in result["derived"]}


def _count(result: Mapping[str, Any]) -> int:
    if "derived" in result:
        return len(result["derived"])
    return sum(v for k, v in result.items() if isinstance(v, int) and k != "duplicate")


def fact_rows(
    live_ledger: Mapping[str, dict], live_facts: Sequence[FactRow], scratch: ScratchFacts
) -> tuple[set[Row], set[Row]]:
    """(what the active generation holds, what the rebuild derived), as comparable rows. A live
    ledger entry written before derivations were recorded is compared by its count of facts."""
    live_ops = {op: result for key, result in live_ledger.items() if (op := op_of(key)) is not None}
    rebuilt_ops = {op: result for key, result in scratch.ledger.items() if (op := op_of(key)) is not None}
    live: set[Row] = {f.row() for f in live_facts}
    rebuilt: set[Row] = set()
    for op, result in live_ops.items():
        live |= _derived_rows(op, result) if "derived" in result else {("derived count", *op, _count(result))}
    for op, result in rebuilt_ops.items():
        recorded = live_ops.get(op)
        if recorded is not None and "derived" not in recorded:
            rebuilt.add(("derived count", *op, _count(result)))
        else:
            rebuilt |= _derived_rows(op, result)
    # Which candidates own a row: the live ledger's record of each write, or for an old entry
    # without one, whether such a row is there.
    owns = {
        (op, d["user_id"], d["category"], d["key"])
        for op, result in live_ops.items()
        for d in result.get("derived", [])
        if d["row"]
    }
    legacy = {op for op, result in live_ops.items() if "derived" not in result}
    owns |= {(f.op, f.user_id, f.category, f.key) for f in live_facts if f.op in legacy}
    rebuilt |= {c.row() for c in scratch.candidates if (c.op, c.user_id, c.category, c.key) in owns}
    return live, rebuilt


# --- artifacts ---------------------------------------------------------------------------------------


def ref_digest(ref: Mapping[str, Any] | None) -> str:
    return hashlib.sha256(json.dumps(ref or {}, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StoredReference:
    event_id: str
    position: int
    ref: dict | None
    status: str  # pending | linked | failed
    sha256: str | None
    caption: str | None  # the caption text stored for it (artifact_text, kind user_caption)


@dataclass(frozen=True)
class StoredArtifact:
    sha256: str
    status: str
    description: str | None
    recorded_digest: str | None  # meta.texts_sha256, when the analysis recorded it
    texts: list[tuple[str, int, str]]  # (kind, ord, text) derived from the bytes


def artifact_rows(
    logged: Iterable[tuple[str, int, dict]],
    stored: Sequence[StoredReference],
    artifacts: Sequence[StoredArtifact],
    blob_sha256: Mapping[str, str | None],
) -> tuple[set[Row], set[Row]]:
    """(what is stored, what the log and the blobs say it must be). `logged`: (event_id, position,
    reference) of every attachment the thread's log holds; `blob_sha256`: the sha256 of each linked
    file's stored bytes, None when they are missing."""
    logged = list(logged)
    live: set[Row] = set()
    expected: set[Row] = set()
    for r in stored:
        live.add(("reference", r.event_id, r.position, ref_digest(r.ref)))
        if r.caption is not None:
            live.add(("caption", r.event_id, r.position, hashlib.sha256(r.caption.encode()).hexdigest()[:16]))
    linked = {(r.event_id, r.position) for r in stored if r.status == "linked"}
    for event_id, position, ref in logged:
        expected.add(("reference", event_id, position, ref_digest(ref)))
        caption = (ref or {}).get("caption")
        if caption and (event_id, position) in linked:
            expected.add(("caption", event_id, position, hashlib.sha256(caption.encode()).hexdigest()[:16]))
    for sha in sorted({r.sha256 for r in stored if r.status == "linked" and r.sha256}):
        live.add(("blob", sha))
        found = blob_sha256.get(sha)
        expected.add(("blob", found) if found else ("blob missing", sha))
    for a in artifacts:
        if a.status == "done" and a.recorded_digest:
            live.add(("texts", a.sha256, texts_digest(a.description, a.texts)))
            expected.add(("texts", a.sha256, a.recorded_digest))
    return live, expected
