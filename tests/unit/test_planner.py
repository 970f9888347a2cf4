"""The pure episode planner: splits (time gap, marker, close_episode), the pause commands, and
the jobs it plans (running / chunk / final summaries, remember / forget)."""

from dataclasses import replace
from datetime import timedelta

import pytest

from chatmem.memory.episodes import Job, SummaryPolicy, ThreadContext, plan_batch
from chatmem.memory.segmentation import SegmenterConfig, SegmenterState, TaskEnds
from chatmem.schemas.events import MessageDeletedEvent, MessageEvent
from chatmem.schemas.records import LoggedEvent
from tests.scripted import T0, command

NO_SHIFT = SegmenterConfig(shift_threshold=-1.0)  # no vectors here: only gaps, markers and commands split


def say(n, text, minute, role="user", thread="t"):
    return MessageEvent(
        event_id=f"{thread}-{n}",
        thread_id=thread,
        user_id="alex",
        role=role,
        text=text,
        occurred_at=T0 + timedelta(minutes=minute),
        platform_message_id=f"m{n}",
    )


def logged(events, start=1):
    return [
        LoggedEvent(pos, e.event_id, e.type, e.thread_id, e.user_id, e.occurred_at, e.model_dump(mode="json"))
        for pos, e in enumerate(events, start=start)
    ]


def fresh(thread="t", memory_on=True):
    return ThreadContext(thread, 1, memory_on, {}, SegmenterState(), None, 0, 0)


def plan(events, ctx=None, policy=SummaryPolicy(), start=1):
    return plan_batch(ctx or fresh(), logged(events, start), {}, NO_SHIFT, policy)


def test_a_time_gap_closes_the_episode_and_plans_its_final_summary():
    p = plan([say(1, "Hello there", 0), say(2, "Flights to Lisbon", 1), say(3, "Back after a night", 9 * 60)])
    assert [(o.episode_id, o.start_seq, o.opened_by) for o in p.opened] == [("t#1", 1, "first"), ("t#2", 3, "gap")]
    assert [(c.episode_id, c.end_seq, c.closed_by) for c in p.closed] == [("t#1", 2, "gap")]
    assert [m.episode_id for m in p.messages] == ["t#1", "t#1", "t#2"]
    assert Job("final", "t#1", 1, 2) in p.jobs
    assert p.context.episode.episode_id == "t#2" and p.context.message_count == 3


def test_a_short_pause_does_not_split():
    p = plan([say(1, "Hello there", 0), say(2, "Still here", 7 * 60)])
    assert len(p.opened) == 1 and p.closed == [] and not any(j.kind == "final" for j in p.jobs)


def test_an_explicit_marker_opens_a_new_episode_at_once():
    p = plan([say(1, "Planning the trip", 0), say(2, "By the way, how do I fix my laptop?", 1)])
    assert [(o.start_seq, o.opened_by) for o in p.opened] == [(1, "first"), (2, "marker")]
    assert [(c.episode_id, c.end_seq) for c in p.closed] == [("t#1", 1)]


def test_close_episode_closes_and_the_next_message_opens_by_command():
    p = plan([say(1, "One", 0), say(2, "Two", 1), command("t", "close_episode", 1, 2), say(3, "Three", 3)])
    assert [(c.episode_id, c.end_seq, c.closed_by) for c in p.closed] == [("t#1", 2, "command")]
    assert [(o.episode_id, o.opened_by) for o in p.opened] == [("t#1", "first"), ("t#2", "command")]
    assert [j for j in p.jobs if j.kind == "final"] == [Job("final", "t#1", 1, 2)]
    assert [(a.command, a.status) for a in p.commands] == [("close_episode", "applied")]
    # the thread keeps that its user ends tasks with a thanks; the command is a boundary
    thanked = plan([say(1, "Find a cafe", 0), say(2, "Thanks, that's all", 1), command("t", "close_episode", 1, 2)])
    assert thanked.context.seg_state.ends == TaskEnds(seen=True, since_boundary=False)


def test_close_episode_without_an_open_episode_is_rejected():
    p = plan([command("t", "close_episode", 1, 0)])
    assert [(a.status, a.detail) for a in p.commands] == [("rejected", "no open episode")]
    assert p.closed == [] and p.jobs == []


def test_memory_off_stops_the_batch_and_memory_on_catches_up():
    events = [say(1, "One", 0), command("t", "memory_off", 1, 1), say(2, "Two", 2), command("t", "memory_on", 2, 3)]
    first = plan(events)
    assert [e.event_id for e in first.consumed] == ["t-1", "t-cmd-1"]
    assert [m.seq for m in first.messages] == [1] and first.context.memory_on is False
    # The processor resumes a paused thread (memory_on ahead) by planning the rest as memory on.
    rest = plan(
        events[2:] + [say(3, "Three", 4)],
        ctx=replace(first.context, memory_on=True),
        start=3,
    )
    assert [m.seq for m in rest.messages] == [2, 3]
    assert [(a.command, a.status) for a in rest.commands] == [("memory_on", "applied")]
    assert rest.context.memory_on is True


def test_running_and_chunk_summaries_are_planned_on_schedule():
    policy = SummaryPolicy(running_every=3, running_tokens=10_000, chunk_every=4)
    p = plan([say(i, f"message number {i}", i) for i in range(1, 8)], policy=policy)
    assert [j for j in p.jobs if j.kind == "running"] == [Job("running", "t#1", 1, 3), Job("running", "t#1", 1, 6)]
    assert [j for j in p.jobs if j.kind == "chunk"] == [Job("chunk", "t#1", 1, 4)]
    assert p.context.episode.summarized_upto == 6 and p.context.episode.chunked_upto == 4


def test_a_long_message_makes_a_running_summary_due_by_tokens():
    policy = SummaryPolicy(running_every=100, running_tokens=50, chunk_every=100)
    p = plan([say(1, "short", 0), say(2, "word " * 60, 1)], policy=policy)
    assert [j for j in p.jobs if j.kind == "running"] == [Job("running", "t#1", 1, 2)]


def test_summarize_now_forces_a_running_summary():
    p = plan([say(1, "One", 0), command("t", "summarize_now", 1, 1)])
    assert Job("running", "t#1", 1, 1) in p.jobs
    rejected = plan([command("t", "summarize_now", 1, 0)])
    assert rejected.commands[0].status == "rejected" and rejected.jobs == []


def test_remember_and_forget_become_fact_jobs_of_the_open_episode():
    p = plan(
        [say(1, "One", 0), command("t", "remember", 1, 1, text="I am vegan"), command("t", "forget", 2, 2, text="x")]
    )
    assert [j for j in p.jobs if j.kind in ("remember", "forget")] == [
        Job("remember", "t#1", 0, 0, "t-cmd-1"),
        Job("forget", "t#1", 0, 0, "t-cmd-2"),
    ]
    assert [a.detail for a in p.commands] == ["remember: queued", "forget: queued"]


def test_configure_changes_the_policy_and_rejects_unknown_settings():
    p = plan(
        [
            command("t", "configure", 1, 0, bogus=1),
            command("t", "configure", 2, 0, running_summary_every=2),
            say(1, "One", 1),
            say(2, "Two", 2),
        ]
    )
    assert [a.status for a in p.commands] == ["rejected", "applied"]
    assert p.context.config == {"running_summary_every": 2}
    assert [j for j in p.jobs if j.kind == "running"] == [Job("running", "t#1", 1, 2)]


@pytest.mark.parametrize(
    ("setting", "value", "detail"),
    [
        ("time_gap_hours", "inf", "must be a finite number"),
        ("shift_threshold", "nan", "must be a finite number"),
        ("running_summary_every", float("inf"), "must be a number"),
        ("running_summary_every", True, "must be a number"),
        ("time_gap_hours", -1, "must be positive"),
        ("time_gap_hours", 0, "must be positive"),
        ("shift_threshold", -0.5, "must be positive or 0"),
        ("markers", ["new\x00topic"], "must be a list of non-empty strings without NUL"),
    ],
)
def test_configure_rejects_what_postgres_or_the_segmenter_cannot_take(setting, value, detail):
    # "inf" is a plain JSON string; taken, it would be stored as Infinity, which Postgres refuses.
    # (The wire refuses a number that is Infinity; a log written before it did may hold one.)
    ev = LoggedEvent(1, "t-c", "command", "t", "alex", T0, {"command": "configure", "args": {setting: value}})
    p = plan_batch(fresh(), [ev], {}, NO_SHIFT, SummaryPolicy())
    assert [(a.status, a.detail) for a in p.commands] == [("rejected", f"{setting}: {detail}")]
    assert p.context.config == {}


def test_configure_takes_a_shift_threshold_of_0_which_turns_shifts_off():
    p = plan([command("t", "configure", 1, 0, shift_threshold=0), say(1, "One", 1)])
    assert [a.status for a in p.commands] == ["applied"]
    assert p.context.config == {"shift_threshold": 0.0}


def test_an_unknown_command_in_the_log_is_rejected():
    # The schema refuses unknown commands at ingest; a log written by an older version may hold one.
    ev = LoggedEvent(1, "t-x", "command", "t", "alex", T0, {"command": "dance", "args": {}})
    p = plan_batch(fresh(), [ev], {}, NO_SHIFT, SummaryPolicy())
    assert p.commands[0].status == "rejected" and "dance" in p.commands[0].detail


def test_planning_in_batches_equals_planning_at_once():
    events = [say(1, "a", 0), say(2, "b", 1), command("t", "close_episode", 1, 2), say(3, "c", 3)]
    events += [say(4, "d", 10 * 60), say(5, "By the way, e", 10 * 60 + 1), say(6, "f", 10 * 60 + 2)]
    policy = SummaryPolicy(running_every=2, running_tokens=10_000, chunk_every=3)
    whole = plan(events, policy=policy)
    ctx, opened, jobs, messages = fresh(), [], [], []
    for i in range(0, len(events), 2):
        part = plan(events[i : i + 2], ctx=ctx, policy=policy, start=i + 1)
        ctx = part.context
        opened += part.opened
        jobs += part.jobs
        messages += [(m.seq, m.episode_id) for m in part.messages]
    assert opened == whole.opened and jobs == whole.jobs
    assert messages == [(m.seq, m.episode_id) for m in whole.messages]
    assert ctx == whole.context


def test_an_erased_event_is_consumed_and_leaves_nothing():
    from chatmem.adapters.crypto import tombstone

    events = logged([say(1, "Hello there", 0), say(2, "my code is 4512", 1), say(3, "and the weather", 2)])
    erased = replace(events[1], payload={**events[1].payload, **tombstone("message")})
    p = plan_batch(fresh(), [events[0], erased, events[2]], {}, NO_SHIFT, SummaryPolicy())
    assert [m.event_id for m in p.messages] == ["t-1", "t-3"] and [m.seq for m in p.messages] == [1, 2]
    assert len(p.consumed) == 3  # the cursor moves past it


def test_forget_me_plans_an_erasure_and_erased_is_acknowledged():
    p = plan([say(1, "Hello there", 0), command("t", "forget_me", 2, 1), command("t", "erased", 3, 2)])
    assert [j for j in p.jobs if j.kind == "forget_me"] == [Job("forget_me", "", 0, 0, "t-cmd-2")]
    assert [(c.command, c.status) for c in p.commands] == [("forget_me", "applied"), ("erased", "applied")]


def test_a_deletion_plans_its_shredding_on_the_maintenance_queue_and_projects_nothing():
    gone = MessageDeletedEvent(event_id="t-d", thread_id="t", user_id="alex", platform_message_ids=["m1"])
    also = MessageDeletedEvent(event_id="t-d2", thread_id="t", user_id="alex", platform_message_ids=["m2"])
    p = plan([say(1, "my PIN is 4411", 0), gone, say(2, "and the weather", 1), also])
    # One run shreds every deletion the thread has logged: one job for the batch.
    assert [j for j in p.jobs if j.kind == "forget_deleted"] == [Job("forget_deleted", "", 0, 0, "t-d")]
    assert [m.event_id for m in p.messages] == ["t-1", "t-2"]  # the shredding and a rebuild remove them
    assert len(p.consumed) == 4 and p.commands == [] and p.edits == []
