"""Replay over the fakes: a thread rebuilt into a new generation and switched to, the lease held
throughout and released whatever happens."""

from datetime import timedelta

import pytest

from chatmem.memory.episodes import SummaryPolicy
from chatmem.memory.ports import LeaseLost
from chatmem.memory.replay import replay_thread
from chatmem.schemas.events import MessageEvent
from tests.fakes import MemoryRig
from tests.scripted import T0, command


def say(n, text, minute, thread="t"):
    return MessageEvent(
        event_id=f"{thread}-{n}",
        thread_id=thread,
        user_id="alex",
        text=text,
        occurred_at=T0 + timedelta(minutes=minute),
        platform_message_id=f"m{n}",
    )


CONVERSATION = [
    say(1, "I am planning a trip to Lisbon in May.", 0),
    say(2, "I prefer morning flights from Berlin.", 1),
    say(3, "Book the direct flight on May 12.", 2),
    say(4, "Now the hotel near Alfama, under 150 euros.", 9 * 60),  # a gap: episode 2
    command("t", "close_episode", 1, 9 * 60 + 1),
    say(5, "By the way, I live in Berlin.", 9 * 60 + 2),
    command("t", "close_episode", 2, 9 * 60 + 3),
]


def live(rig=None):
    rig = rig or MemoryRig(policy=SummaryPolicy(running_every=2, running_tokens=10_000, chunk_every=3))
    rig.publish(CONVERSATION)
    rig.drain("t")
    rig.run_jobs()
    return rig


def replay(rig, run=None, owner="replay", batch_size=2, **kw):
    return replay_thread(
        "t",
        threads=rig.log,
        projections=rig.db,
        embedder=rig.embedder,
        run=run or (lambda job, generation: rig.jobs.run_inline(rig.llm, "t", generation, job)),
        seg_cfg=rig.seg_cfg,
        policy=rig.policy,
        owner=owner,
        lease_s=30,
        batch_size=batch_size,
        **kw,
    )


def shape(rig, generation):
    episodes = [
        (e["episode_id"], e["start_seq"], e["end_seq"], e["opened_by"]) for e in rig.db.thread_episodes("t", generation)
    ]
    messages = [(m["seq"], m["event_id"], m["episode_id"]) for m in rig.db.thread_messages("t", generation)]
    summaries = [(s.record.summary_key, s.record.text, s.is_active) for s in rig.db.thread_summaries("t", generation)]
    return episodes, messages, summaries


def test_replay_rebuilds_the_same_thread_in_a_new_generation_and_switches():
    rig = live()
    before = shape(rig, 1)
    cursor = rig.log.cursors["t"]
    result = replay(rig, after_switch=lambda g: rig.jobs.retire_rebuilt("t", g))
    assert (result.generation, result.events, result.episodes) == (2, len(CONVERSATION), 3)
    assert rig.db.contexts["t"].generation == 2 and rig.log.cursors["t"] == cursor
    assert shape(rig, 2) == before and before[2]  # same episodes, messages and summaries
    assert "t" not in rig.log.leases
    # Facts re-derived unchanged move to the new generation instead of being churned.
    assert [(f["value"], f["generation"], f["is_active"]) for f in rig.facts.facts] == [
        ("morning flights from Berlin", 2, True),
        ("Berlin", 2, True),
    ]
    assert rig.mem0.deleted == [] and len(rig.mem0.memories) == 2


def test_replay_runs_the_planned_jobs_in_order_for_the_new_generation():
    rig = live()
    rig2 = MemoryRig(policy=rig.policy)
    rig2.publish(CONVERSATION)
    rig2.drain("t")
    live_jobs = [j for _, _, j in rig2.queued]
    ran = []
    replay(rig, run=lambda job, generation: ran.append((job, generation)))
    assert ran == [(j, 2) for j in live_jobs] and any(j.kind == "final" for j in live_jobs)


def test_replay_covers_only_what_live_processing_has_applied():
    rig = live()
    rig.publish([say(6, "Something new", 9 * 60 + 4)])
    result = replay(rig)
    assert result.events == len(CONVERSATION)
    assert [m["seq"] for m in rig.db.thread_messages("t", 2)] == [1, 2, 3, 4, 5]
    assert rig.drain("t") == 1  # the rest applies live, on the new generation
    assert [m["seq"] for m in rig.db.thread_messages("t", 2)] == [1, 2, 3, 4, 5, 6]


def test_an_error_during_replay_releases_the_lease_and_keeps_the_old_generation():
    rig = live()

    def boom(job, generation):
        raise RuntimeError("llm down")

    with pytest.raises(RuntimeError, match="llm down"):
        replay(rig, run=boom)
    assert "t" not in rig.log.leases and rig.db.contexts["t"].generation == 1
    assert rig.drain("t") == 0 and rig.log.acquire_lease("t", "w2", 30) is not None  # free for the next worker


def test_a_lease_taken_over_during_replay_aborts_without_switching():
    rig = live()

    def steal(job, generation):
        rig.log.leases["t"] = "intruder"

    with pytest.raises(LeaseLost):
        replay(rig, run=steal)
    assert rig.db.contexts["t"].generation == 1 and rig.log.leases["t"] == "intruder"  # not released by us


def test_a_busy_thread_times_out():
    rig = live()
    rig.log.leases["t"] = "live-worker"
    with pytest.raises(TimeoutError):
        replay(rig, wait_s=0.0)
    assert rig.log.leases["t"] == "live-worker"


def _mixed_log(seed: int) -> list:
    """Two topics taking turns (so shifts, hysteresis and moves happen) and edits of earlier
    messages arriving later."""
    import random

    from chatmem.schemas.events import MessageEditedEvent

    rng = random.Random(seed)
    topics = ["lisbon flight hotel booking trip".split(), "pasta garlic tomato sauce oven".split()]
    out = []
    for i in range(60):
        words = topics[(i // 9) % 2]
        out.append(say(i, " ".join(rng.choice(words) for _ in range(4)), i))
        if i % 7 == 3:
            edited = " ".join(["edited", *words[:3]])
            out.append(
                MessageEditedEvent(
                    event_id=f"t-{i}-edit", thread_id="t", user_id="alex", platform_message_id=f"m{i - 1}", text=edited
                )
            )
    return out


@pytest.mark.parametrize("seed", range(8))
def test_replay_rebuilds_exactly_what_live_built_whatever_the_batches_and_job_timing(seed):
    import random

    from chatmem.memory.segmentation import SegmenterConfig

    rng = random.Random(seed)
    policy = SummaryPolicy(running_every=3, running_tokens=10_000, chunk_every=5)
    # shift_threshold bars the learned scorer's P(topic continues) now (it was a cosine distance,
    # 0.3): at 0.5 the two topics of the fake bag-of-words vectors shift.
    rig = MemoryRig(policy=policy, seg_cfg=SegmenterConfig(shift_threshold=0.5))
    log, i = _mixed_log(seed), 0
    while i < len(log):  # batches of any size; jobs run late, in any order, like async workers
        n = rng.randint(1, 6)
        rig.publish(log[i : i + n])
        i += n
        rig.drain("t")
        rng.shuffle(rig.queued)
        cut = rng.randint(0, len(rig.queued))
        for thread_id, generation, job in rig.queued[:cut]:
            rig.jobs.run_inline(rig.llm, thread_id, generation, job)
        rig.queued = rig.queued[cut:]
    rig.run_jobs()
    result = replay(rig, batch_size=500)

    def built(generation):
        summaries = {
            (k, s.record.from_seq, s.record.upto_seq, s.record.text, s.is_active)
            for (g, k), s in rig.db.summaries.items()
            if g == generation
        }
        episodes = {
            (e["start_seq"], e.get("end_seq"), e["status"]) for (g, _), e in rig.db.episodes.items() if g == generation
        }
        return summaries, episodes

    live_summaries, live_episodes = built(1)
    assert len(live_episodes) > 2 and len(live_summaries) > 5  # the log exercises splits and summaries
    assert built(result.generation) == (live_summaries, live_episodes)


def entry(fact, row):
    """A ledger record of one derived fact (the value stands in for its digest)."""
    return {"user_id": fact.user_id, "category": fact.category, "key": fact.key, "digest": fact.value, "row": row}


def _scratch(ledger, candidates):
    from chatmem.memory.replay_check import ScratchFacts

    return ScratchFacts(source=None, ledger=ledger, candidates=candidates)  # type: ignore[arg-type]


def test_fact_rows_follow_the_ledger_record_of_which_writes_own_a_row():
    from chatmem.memory.replay_check import FactRow, fact_rows

    berlin = FactRow("u", "t#1", "identity", "location", "Berlin", "extracted", ("t-1",))
    acme = FactRow("u", "t#1", "identity", "employer", "Acme", "extracted", ("t-2",))
    live_ledger = {"t#1:g1:facts": {"same": 1, "insert": 1, "derived": [entry(berlin, False), entry(acme, True)]}}
    scratch = _scratch({"t#1:g2:facts": {"derived": [entry(berlin, None), entry(acme, None)]}}, [berlin, acme])
    live, rebuilt = fact_rows(live_ledger, [acme], scratch)
    assert live == rebuilt and acme.row() in live and berlin.row() not in live  # Berlin is held elsewhere
    # A rebuild that derives a fact the live run did not: a difference, not a silent extra.
    extra = FactRow("u", "t#1", "preference", "tea", "tea", "extracted", ("t-2",))
    scratch.ledger["t#1:g2:facts"]["derived"].append(entry(extra, None))
    scratch.candidates.append(extra)
    live, rebuilt = fact_rows(live_ledger, [acme], scratch)
    assert rebuilt - live == {("derived", "episode", "t#1", "u", "preference", "tea", "tea")}


def test_fact_rows_compare_a_ledger_entry_from_before_derivations_were_recorded_by_its_count():
    from chatmem.memory.replay_check import FactRow, fact_rows

    acme = FactRow("u", "t#1", "identity", "employer", "Acme", "extracted", ("t-2",))
    derived = {"user_id": "u", "category": "identity", "key": "employer", "digest": "d"}
    scratch = _scratch({"t#1:g2:facts": {"derived": [derived]}}, [acme])
    live, rebuilt = fact_rows({"t#1:g1:facts": {"insert": 1}}, [acme], scratch)
    assert live == rebuilt == {("derived count", "episode", "t#1", 1), acme.row()}
    live, rebuilt = fact_rows({"t#1:g1:facts": {"insert": 2}}, [acme], scratch)
    assert live - rebuilt == {("derived count", "episode", "t#1", 2)}
