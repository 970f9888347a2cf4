"""From a thread's events to its episodes: a pure planner. Given the thread's context and a batch
of logged events (with embeddings computed beforehand, outside any transaction), it returns the
changes to apply in one transaction together with the cursor, and the summary jobs to queue
after the commit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from chatmem.memory.attachments.surrogates import RefState, attachment_lines
from chatmem.memory.dates import annotate, date_note
from chatmem.memory.prompts import named_text
from chatmem.memory.segmentation import (
    BoundaryAssist,
    Scorer,
    SegmenterConfig,
    SegmenterState,
    SegTurn,
    TaskEnds,
    feed,
)
from chatmem.schemas.events import ERASED
from chatmem.schemas.records import LoggedEvent

# What `configure` may change per thread, and the type each value must have.
CONFIGURABLE: dict[str, type] = {
    "time_gap_hours": float,
    "shift_threshold": float,
    "closed_thread_bar": float,  # 1 or more: off (it caps nothing, and closings are candidates again)
    "markers": list,
    "running_summary_every": int,
    "running_summary_tokens": int,
    "chunk_summary_every": int,
}

# Settings whose 0 means "off" rather than nonsense: a shift threshold of 0 turns topic shifts off.
ZERO_TURNS_OFF = frozenset({"shift_threshold"})


@dataclass(frozen=True)
class SummaryPolicy:
    running_every: int = 10
    running_tokens: int = 1500
    chunk_every: int = 40

    def with_overrides(self, cfg: dict) -> SummaryPolicy:
        return SummaryPolicy(
            int(cfg.get("running_summary_every", self.running_every)),
            int(cfg.get("running_summary_tokens", self.running_tokens)),
            int(cfg.get("chunk_summary_every", self.chunk_every)),
        )


@dataclass(frozen=True)
class OpenEpisode:
    episode_id: str
    ordinal: int
    start_seq: int
    started_at: datetime
    summarized_upto: int  # last seq covered by a running summary job
    chunked_upto: int  # last seq covered by a chunk summary job
    pending_tokens: int  # rough tokens not yet in a running summary


@dataclass(frozen=True)
class ThreadContext:
    thread_id: str
    generation: int
    memory_on: bool
    config: dict[str, Any]
    seg_state: SegmenterState
    episode: OpenEpisode | None
    episode_count: int
    message_count: int


@dataclass(frozen=True)
class NewMessage:
    seq: int
    event_id: str
    stream_pos: int
    episode_id: str
    user_id: str
    role: str
    text: str
    platform_message_id: str | None
    occurred_at: datetime
    embedding: np.ndarray | None
    dates: str = ""  # the absolute dates its relative ones name (memory/dates.py), full-text indexed


@dataclass(frozen=True)
class EpisodeOpen:
    episode_id: str
    ordinal: int
    start_seq: int
    opened_by: str
    started_at: datetime


@dataclass(frozen=True)
class EpisodeClose:
    episode_id: str
    end_seq: int
    closed_by: str
    ended_at: datetime


@dataclass(frozen=True)
class Move:
    from_seq: int
    from_episode: str
    to_episode: str


@dataclass(frozen=True)
class CommandAck:
    event_id: str
    command: str
    status: str  # applied | rejected
    detail: str


@dataclass(frozen=True)
class Job:
    # running | chunk | final (summarize queue) · remember | forget (facts queue) ·
    # forget_me | forget_deleted (maintenance queue)
    kind: str
    episode_id: str
    from_seq: int
    upto_seq: int
    event_id: str | None = None


@dataclass
class Plan:
    messages: list[NewMessage] = field(default_factory=list)
    edits: list[tuple[str, str]] = field(default_factory=list)  # (platform_message_id, new text)
    opened: list[EpisodeOpen] = field(default_factory=list)
    closed: list[EpisodeClose] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    commands: list[CommandAck] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    attachments: list[tuple[str, int, str, dict]] = field(
        default_factory=list
    )  # (event_id, position, user_id, the reference as sent)
    consumed: list[LoggedEvent] = field(default_factory=list)
    context: ThreadContext | None = None
    embed_model: str | None = None  # the model of the messages' vectors (set by who embedded them)


def episode_id(thread_id: str, ordinal: int) -> str:
    # Stable across replays: the same log yields the same ids (mem0 run_id relies on it).
    return f"{thread_id}#{ordinal}"


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def message_text(payload: dict, attachments: dict[int, RefState] | None = None) -> str:
    """A message's history text: what was said, then one surrogate line per attachment (a
    placeholder until the attachment is analysed, see memory/attachments/)."""
    text = payload.get("text") or ""
    return "\n".join([text, *attachment_lines(payload, attachments)]).strip()


def log_text(message: dict, edit: dict | None) -> str:
    """A message's text as the log fixes it at some position: its latest edit up to there, else
    what was sent. Summaries read this, not the projection, whose text also changes with edits
    and attachment surrogates that arrive whenever they arrive."""
    return message_text(edit) if edit is not None else message_text(message)


def validate_configure(args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    unknown = sorted(set(args) - set(CONFIGURABLE))
    if unknown:
        return {}, f"unknown settings: {', '.join(unknown)} (allowed: {', '.join(sorted(CONFIGURABLE))})"
    clean: dict[str, Any] = {}
    for key, value in args.items():
        want = CONFIGURABLE[key]
        if want is list:
            # NUL: Postgres cannot store it in the thread's settings (an older log may hold one).
            fine = isinstance(value, list) and all(isinstance(v, str) and v.strip() and "\x00" not in v for v in value)
            if not fine:
                return {}, f"{key}: must be a list of non-empty strings without NUL"
            clean[key] = [v.strip().lower() for v in value]
        else:
            if isinstance(value, bool):  # JSON true is no number, though int(True) is 1
                return {}, f"{key}: must be a number"
            try:
                number = want(value)
            except (TypeError, ValueError, OverflowError):
                return {}, f"{key}: must be a number"
            # "inf" and "nan" convert, and would wedge the thread: Postgres refuses them in the
            # stored settings on every try.
            if not math.isfinite(number):
                return {}, f"{key}: must be a finite number"
            if number < 0 or (number == 0 and key not in ZERO_TURNS_OFF):
                return {}, f"{key}: must be positive" + (" or 0" if key in ZERO_TURNS_OFF else "")
            clean[key] = number
    return clean, None


class _Builder:
    """Mutable state while planning one batch."""

    def __init__(
        self,
        ctx: ThreadContext,
        seg_cfg: SegmenterConfig,
        policy: SummaryPolicy,
        assist: BoundaryAssist | None,
        scorer: Scorer | None,
    ):
        self.ctx = ctx
        self.seg_cfg = seg_cfg
        self.assist = assist
        self.scorer = scorer
        self.policy = policy
        self.plan = Plan()
        self.state = ctx.seg_state
        self.episode = ctx.episode
        self.episode_count = ctx.episode_count
        self.message_count = ctx.message_count
        self.config = dict(ctx.config)
        self.memory_on = ctx.memory_on

    def open(self, start_seq: int, opened_by: str, at: datetime) -> OpenEpisode:
        self.episode_count += 1
        eid = episode_id(self.ctx.thread_id, self.episode_count)
        self.plan.opened.append(EpisodeOpen(eid, self.episode_count, start_seq, opened_by, at))
        self.episode = OpenEpisode(eid, self.episode_count, start_seq, at, start_seq - 1, start_seq - 1, 0)
        return self.episode

    def close(self, end_seq: int, closed_by: str, at: datetime) -> None:
        ep = self.episode
        if ep is None:
            return
        if end_seq >= ep.start_seq:
            self.plan.closed.append(EpisodeClose(ep.episode_id, end_seq, closed_by, at))
            self.plan.jobs.append(Job("final", ep.episode_id, ep.start_seq, end_seq))
        self.episode = None

    def split(self, at_seq: int, reason: str, at: datetime) -> None:
        """A boundary at `at_seq`: the current episode ends before it, a new one starts at it."""
        old = self.episode
        self.close(at_seq - 1, reason, at)
        self.open(at_seq, reason, at)
        if old is not None and at_seq <= self.message_count:
            # A confirmed shift reaches back: earlier messages move to the new episode.
            self.plan.moves.append(Move(at_seq, old.episode_id, self.episode.episode_id))  # type: ignore[union-attr]
            moved = [m for m in self.plan.messages if m.seq >= at_seq and m.episode_id == old.episode_id]
            for m in moved:
                idx = self.plan.messages.index(m)
                self.plan.messages[idx] = replace(m, episode_id=self.episode.episode_id)  # type: ignore[union-attr]

    def message(self, ev: LoggedEvent, vector: np.ndarray | None) -> None:
        p = ev.payload
        text = message_text(p)
        seq = self.message_count + 1
        turn = SegTurn(seq, p.get("role", "user"), text, ev.occurred_at, vector)
        self.state, bounds = feed(self.state, turn, self.seg_cfg, self.scorer, self.assist)
        self.message_count = seq
        if self.episode is None:
            self.open(seq, "first" if self.episode_count == 0 else "command", ev.occurred_at)
        for b in bounds:
            self.split(b.seq, b.reason, ev.occurred_at)
        ep = self.episode
        assert ep is not None
        self.plan.messages.append(
            NewMessage(
                seq,
                ev.event_id,
                ev.stream_pos,
                ep.episode_id,
                ev.user_id,
                turn.role,
                text,
                p.get("platform_message_id"),
                ev.occurred_at,
                vector,
                date_note(text, ev.occurred_at),
            )
        )
        self.plan.attachments += [(ev.event_id, i, ev.user_id, a) for i, a in enumerate(p.get("attachments") or [])]
        self.episode = replace(ep, pending_tokens=ep.pending_tokens + estimate_tokens(text))
        self.schedule_summaries(force=False)

    def schedule_summaries(self, *, force: bool) -> None:
        """Running and chunk summaries end at the last settled message: one awaiting a shift's
        confirmation may still move to the next episode, and a job over it would read a
        membership that depends on when it runs. So every cut is fixed by the log."""
        ep = self.episode
        pending = self.state.pending_since
        upto = self.message_count if pending is None else min(self.message_count, pending - 1)
        if ep is None or upto < ep.start_seq:
            return
        due = upto - ep.summarized_upto >= self.policy.running_every or ep.pending_tokens >= self.policy.running_tokens
        if (due or force) and upto > ep.summarized_upto:
            self.plan.jobs.append(Job("running", ep.episode_id, ep.start_seq, upto))
            ep = replace(ep, summarized_upto=upto, pending_tokens=0)
        if upto - ep.chunked_upto >= self.policy.chunk_every:
            self.plan.jobs.append(Job("chunk", ep.episode_id, ep.chunked_upto + 1, upto))
            ep = replace(ep, chunked_upto=upto)
        self.episode = ep

    def command(self, ev: LoggedEvent) -> bool:
        """Apply a command; False when processing must stop after it (memory_off)."""
        name = ev.payload.get("command", "")
        args = ev.payload.get("args") or {}
        ack = lambda status, detail: self.plan.commands.append(CommandAck(ev.event_id, name, status, detail))  # noqa: E731
        if name == "close_episode":
            if self.episode is None:
                ack("rejected", "no open episode")
            else:
                closed = self.episode.episode_id
                self.close(self.message_count, "command", ev.occurred_at)
                # the next message starts afresh; that this user ends tasks with a thanks still holds
                self.state = SegmenterState(ends=TaskEnds(seen=self.state.ends.seen))
                ack("applied", f"closed {closed}")
        elif name == "summarize_now":
            if self.episode is None or self.message_count < self.episode.start_seq:
                ack("rejected", "no open episode with messages")
            else:
                self.schedule_summaries(force=True)
                ack("applied", f"running summary of {self.episode.episode_id} up to message {self.message_count}")
        elif name == "memory_off":
            self.memory_on = False
            ack("applied", "memory off: events are logged but not processed until memory_on")
            return False
        elif name == "memory_on":
            ack("applied", "memory on" if self.ctx.memory_on else "memory on: caught up")
            self.memory_on = True
        elif name == "configure":
            clean, error = validate_configure(args)
            if error:
                ack("rejected", error)
            else:
                self.config.update(clean)
                self.seg_cfg = self.seg_cfg.with_overrides(clean)
                self.policy = self.policy.with_overrides(clean)
                ack("applied", "configured " + ", ".join(f"{k}={v}" for k, v in sorted(clean.items())))
        elif name == "forget_me":
            # Erasure is not a projection: the maintenance queue runs it (chatmem erase --user).
            ack("applied", "erasure of the sender queued")
            self.plan.jobs.append(Job(name, "", 0, 0, ev.event_id))
        elif name == "erased":
            ack("applied", "an erasure was done here")
        elif name in ("remember", "forget"):
            # Facts belong to the facts queue; its job fills in the outcome (what matched).
            ack("applied", f"{name}: queued")
            self.plan.jobs.append(Job(name, self.episode.episode_id if self.episode else "", 0, 0, ev.event_id))
        else:
            ack("rejected", f"unknown command {name!r}")
        return True


def plan_batch(
    ctx: ThreadContext,
    events: Sequence[LoggedEvent],
    vectors: dict[str, np.ndarray],
    seg_cfg: SegmenterConfig,
    policy: SummaryPolicy,
    assist: BoundaryAssist | None = None,
    scorer: Scorer | None = None,
) -> Plan:
    """Plan the effects of `events` (in publish order). Stops after a memory_off: the events
    after it stay in the log until a memory_on arrives. `assist`: a model's opinion on the
    segmenter's unsure decisions (memory/boundary_llm.py); it may call out, so planning runs
    outside any transaction, as embedding does. `scorer`: the boundary scorer (None: the shipped
    bag alone; the composition root gives it the pair model)."""
    b = _Builder(ctx, seg_cfg.with_overrides(ctx.config), policy.with_overrides(ctx.config), assist, scorer)
    for ev in events:
        b.plan.consumed.append(ev)
        if is_erased(ev.payload):
            continue  # its content is gone (chatmem erase): it never happened, as far as memory goes
        if ev.type == "message":
            b.message(ev, vectors.get(ev.event_id))
        elif ev.type == "message_edited":
            b.plan.edits.append((ev.payload.get("platform_message_id", ""), message_text(ev.payload)))
        elif ev.type == "message_deleted" and not any(j.kind == "forget_deleted" for j in b.plan.jobs):
            # Shredding is not a projection: the maintenance queue runs it and rebuilds the thread,
            # once for all the deletions logged so far.
            b.plan.jobs.append(Job("forget_deleted", "", 0, 0, ev.event_id))
        elif ev.type == "command" and not b.command(ev):
            break
    b.plan.context = ThreadContext(
        ctx.thread_id, ctx.generation, b.memory_on, b.config, b.state, b.episode, b.episode_count, b.message_count
    )
    return b.plan


def is_erased(payload: dict) -> bool:
    """A tombstone: an event whose content was erased (its key destroyed)."""
    return bool((payload.get("metadata") or {}).get(ERASED))


def texts_to_embed(events: Sequence[LoggedEvent]) -> dict[str, str]:
    return {
        ev.event_id: embed_text(ev.payload, ev.occurred_at)
        for ev in events
        if ev.type == "message" and message_text(ev.payload) and not is_erased(ev.payload)
    }


AUTHOR_NAME_KEY = "author_name"


def embed_text(payload: dict, at: datetime) -> str:
    """What a message's vector is computed from: its text, after the author's display name when
    the platform sent one (metadata `author_name`), since questions about a conversation name
    people ("what did Anna say about ..."), with its relative dates resolved against the time
    it was sent ("yesterday [7 May 2023]"), since questions name dates."""
    text = annotate(message_text(payload), at)
    return named_text(author_name(payload), text)


def author_name(payload: dict) -> str | None:
    name = (payload.get("metadata") or {}).get(AUTHOR_NAME_KEY)
    return name if isinstance(name, str) and name.strip() else None
