"""Summary jobs, fact jobs, the Jobs facade and the sweeper, over the in-memory fakes."""

from dataclasses import replace
from datetime import timedelta

import pytest

from chatmem.memory import fact_jobs
from chatmem.memory.episodes import Job, SummaryPolicy
from chatmem.memory.fact_jobs import FactStore, MemoryStore, counts_only, write_episode_facts
from chatmem.memory.jobs import CommandFacts, SummaryVectors
from chatmem.memory.pipeline import Projections
from chatmem.memory.ports import LLM, Embedder, TransientError
from chatmem.memory.prompts import FactItem, FactList, FinalSummary
from chatmem.memory.recall import FactSearch
from chatmem.memory.summaries import SummaryStore, run_job
from chatmem.memory.sweeper import STALE_ATTACHMENT_S, LostAttachments, LostFinals, Sweeper
from chatmem.memory.tokens import TokenCounter
from chatmem.schemas.events import CommandEvent, MessageEvent
from tests.fakes import (
    FakeAttachmentStore,
    FakeEmbedder,
    FakeFactStore,
    FakeLLM,
    FakeMem0,
    FakeProjections,
    FakeTokenCounter,
    MemoryRig,
)
from tests.scripted import T0, command


def say(thread, n, text, minute, user="alex", role="user"):
    return MessageEvent(
        event_id=f"{thread}-{n}",
        thread_id=thread,
        user_id=user,
        role=role,
        text=text,
        occurred_at=T0 + timedelta(minutes=minute),
        platform_message_id=f"{thread}-m{n}",
    )


def episodes_of(rig, texts, thread="t", user="alex"):
    """One closed episode per text (a close_episode after each)."""
    events = []
    for i, text in enumerate(texts, start=1):
        events += [say(thread, i, text, 2 * i, user), command(thread, "close_episode", i, 2 * i + 1, user)]
    rig.publish(events)
    rig.drain(thread)
    return rig


def summary_jobs(rig, kind=None):
    return [(t, g, j) for t, g, j in rig.queued if j.kind != "remember" and (kind is None or j.kind == kind)]


def test_the_fakes_satisfy_their_ports() -> None:
    # Checked by mypy (structural typing); at run time, that they are what the domain gets.
    db = FakeProjections()
    ports: list[object] = []
    summaries: SummaryStore = db
    vectors: SummaryVectors = db
    projections: Projections = db
    finals: LostFinals = db
    facts: FactStore = FakeFactStore(db)
    commands: CommandFacts = FakeFactStore(db)
    mem: MemoryStore = FakeMem0()
    search: FactSearch = FakeMem0()
    embedder: Embedder = FakeEmbedder()
    llm: LLM = FakeLLM()
    counter: TokenCounter = FakeTokenCounter()
    lost: LostAttachments = FakeAttachmentStore()
    ports += [summaries, vectors, projections, finals, facts, commands, mem, search, embedder, llm, counter, lost]
    assert all(p is not None for p in ports)


def test_the_fake_embedder_is_deterministic_and_unit_normalised():
    e = FakeEmbedder(dim=32)
    a, b, c = e.embed(["flights to Lisbon", "flights to Lisbon", "laptop fan noise"])
    assert (a == b).all() and abs(float(a @ a) - 1.0) < 1e-6
    assert float(a @ e.embed(["cheap flights to Lisbon"])[0]) > float(a @ c)


# --- summaries -----------------------------------------------------------------------------------


def test_a_final_summary_is_saved_once_and_archives_its_episode():
    rig = episodes_of(MemoryRig(), ["I am planning a trip to Lisbon in May."])
    (t, g, job), *_ = summary_jobs(rig, "final")
    assert run_job(rig.db, rig.llm, job, t, g, fanin=2, keep=1) == "saved"
    assert run_job(rig.db, rig.llm, job, t, g, fanin=2, keep=1) == "duplicate"
    assert rig.llm.called("final_summary") == 1  # the duplicate asked nothing
    (final,) = rig.db.thread_summaries("t")
    assert final.record.summary_key == "t#1:final" and "Lisbon" in final.record.text and final.is_active
    assert [m["is_active"] for m in rig.db.thread_messages("t")] == [False]
    assert rig.db.thread_episodes("t")[0]["topic_label"] == final.record.content["topic_label"]


def test_a_job_of_an_abandoned_generation_is_stale_and_asks_nothing():
    rig = episodes_of(MemoryRig(), ["Hello, the trip to Lisbon."])
    (t, g, job), *_ = summary_jobs(rig, "final")
    rig.db.contexts[t] = replace(rig.db.contexts[t], generation=g + 1)  # a replay switched meanwhile
    assert run_job(rig.db, rig.llm, job, t, g, fanin=2, keep=1) == "stale"
    assert rig.llm.calls == [] and rig.db.summaries == {}


def test_a_switch_during_the_llm_call_makes_the_result_stale():
    rig = episodes_of(MemoryRig(), ["Hello, the trip to Lisbon."])
    (t, g, job), *_ = summary_jobs(rig, "final")

    def switch_then_answer(data):
        rig.db.contexts[t] = replace(rig.db.contexts[t], generation=g + 1)
        return FinalSummary(topic="Lisbon", topic_label="lisbon trip", summary="A trip to Lisbon.")

    rig.llm.answers["final_summary"] = switch_then_answer
    assert run_job(rig.db, rig.llm, job, t, g, fanin=2, keep=1) == "stale"
    assert rig.db.summaries == {} and rig.db.thread_messages("t", g)[0]["is_active"] is True


def test_only_the_newest_running_summary_stays_active_whatever_the_order():
    rig = MemoryRig(policy=SummaryPolicy(running_every=2, running_tokens=10_000, chunk_every=100))
    rig.publish([say("t", i, f"message {i} about the trip", i) for i in range(1, 5)])
    rig.drain("t")
    running = summary_jobs(rig, "running")
    assert [j.upto_seq for _, _, j in running] == [2, 4]
    for t, g, job in reversed(running):  # the newer one finishes first
        assert run_job(rig.db, rig.llm, job, t, g, fanin=2, keep=1) == "saved"
    active = {s.record.summary_key: s.is_active for s in rig.db.thread_summaries("t")}
    assert active == {"t#1:running:2": False, "t#1:running:4": True}


def run_finals(rig, order):
    finals = summary_jobs(rig, "final")
    for i in order:
        t, g, job = finals[i]
        run_job(rig.db, rig.llm, job, t, g, fanin=2, keep=1)
    return {s.record.summary_key: s for s in rig.db.thread_summaries("t")}


def test_a_full_group_rolls_up_once_keep_newer_summaries_exist():
    rig = episodes_of(MemoryRig(), ["Lisbon flights.", "Lisbon hotels.", "Laptop fans."])
    partial = run_finals(rig, [0, 1])
    assert "t:L2:g0" not in partial  # two finals, none newer than the group yet (keep=1)
    done = run_finals(rig, [2])
    rollup = done["t:L2:g0"]
    assert rollup.record.level == 2 and rollup.record.source_keys == ("t#1:final", "t#2:final")
    assert (rollup.record.from_seq, rollup.record.upto_seq) == (1, 2)
    assert not done["t#1:final"].is_active and not done["t#2:final"].is_active and done["t#3:final"].is_active
    assert rig.llm.called("rollup_summary") == 1


def test_roll_ups_do_not_depend_on_the_order_jobs_finish_in():
    forward = run_finals(episodes_of(MemoryRig(), ["a.", "b.", "c.", "d.", "e."]), [0, 1, 2, 3, 4])
    backward = run_finals(episodes_of(MemoryRig(), ["a.", "b.", "c.", "d.", "e."]), [4, 3, 2, 1, 0])
    shape = lambda rows: {k: (s.record.source_keys, s.is_active) for k, s in rows.items()}  # noqa: E731
    assert shape(forward) == shape(backward)
    assert {"t:L2:g0", "t:L2:g1"} <= set(forward)


# --- facts ---------------------------------------------------------------------------------------


def facts(rig, user="alex", history=False):
    return [
        (f["category"], f["key"], f["value"], f["is_active"], f["archived_reason"])
        for f in rig.facts.user_facts(user, include_history=history)
    ]


def test_names_resolve_by_confidence_and_keep_history():
    rig = episodes_of(
        MemoryRig(), ["Hello! My name is Alex.", "You can call me Al.", "For the forms: my full name is Alexander."]
    )
    rig.run_jobs()  # finals, then each episode's facts inline
    assert facts(rig) == [("identity", "name", "Alexander", True, None)]
    assert facts(rig, history=True) == [
        ("identity", "name", "Alex", False, "replaced"),
        ("identity", "name", "Alexander", True, None),
    ]  # "call me Al" (0.6 < 0.9) kept the old value
    assert rig.mem0.of_user("alex") == ["For the forms: my full name is Alexander."]
    (hit,) = rig.mem0.search("what is my full name", user_id="alex")
    assert hit["metadata"]["episode_id"] == "t#3" and hit["metadata"]["source_event_ids"] == ["t-3"]


def test_a_retried_facts_job_writes_nothing_twice():
    rig = episodes_of(MemoryRig(), ["I live in Berlin. I prefer window seats."])
    first = write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#1")
    assert first == {"insert": 2}
    again = write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#1")
    assert again == {"insert": 2, "duplicate": True}
    assert rig.llm.called("extract_facts") == 1 and rig.mem0.adds == 2 and len(rig.facts.facts) == 2


def test_a_worker_lost_after_the_mem0_write_leaves_one_memory():
    rig = episodes_of(MemoryRig(), ["I live in Berlin."])
    rig.mem0.crash_after_add = True
    with pytest.raises(TransientError):
        write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#1")
    assert rig.facts.facts[0]["mem0_id"] == fact_jobs.PENDING
    write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#1")
    (memory_id,) = rig.mem0.memories
    assert rig.mem0.adds == 1 and rig.facts.facts[0]["mem0_id"] == memory_id and len(rig.facts.facts) == 1


def test_facts_of_an_abandoned_generation_are_not_written():
    rig = episodes_of(MemoryRig(), ["I live in Berlin."])
    rig.db.contexts["t"] = replace(rig.db.contexts["t"], generation=2)
    assert write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#1") == {
        "stale": True
    }
    assert rig.facts.facts == [] and rig.llm.calls == []


def test_model_facts_attributed_to_no_user_message_are_dropped():
    rig = episodes_of(MemoryRig(), ["I live in Berlin."])
    item = dict(category="identity", key="location", value="Berlin", confidence=0.9, importance=0.8, text="x")
    rig.llm.answers["extract_facts"] = FactList(facts=[FactItem(seq=1, **item), FactItem(seq=99, **item)])
    out = write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#1")
    assert out == {"insert": 1} and [f["source_event_ids"] for f in rig.facts.facts] == [["t-1"]]


def test_a_lower_confidence_value_keeps_the_old_one_and_a_higher_replaces_it_in_mem0():
    rig = episodes_of(MemoryRig(), ["x", "y", "z"])

    def one(value, confidence):
        def answer(data):  # the fact stated in the episode's (only) message
            seq = data["messages"][0]["seq"]
            item = FactItem(
                seq=seq,
                category="preference",
                key="seat",
                value=value,
                confidence=confidence,
                importance=0.5,
                text=value,
            )
            return FactList(facts=[item])

        return answer

    for episode, (value, confidence) in enumerate([("window", 0.8), ("aisle", 0.5), ("middle", 0.9)], start=1):
        rig.llm.answers["extract_facts"] = one(value, confidence)
        out = write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id=f"t#{episode}")
        assert out == {["insert", "keep_old", "replace"][episode - 1]: 1}
    assert [(f["value"], f["is_active"]) for f in rig.facts.facts] == [("window", False), ("middle", True)]
    assert rig.mem0.of_user("alex") == ["middle"] and len(rig.mem0.deleted) == 1


def test_remember_once_even_when_retried():
    rig = MemoryRig()
    rig.publish([say("t", 1, "Hi", 0), command("t", "remember", 1, 1, text="I am allergic to peanuts")])
    rig.drain("t")
    (_, g, job), *_ = [q for q in rig.queued if q[2].kind == "remember"]
    detail = rig.jobs.fact_command("t", g, job.event_id)
    assert detail == "remember: constraint/peanuts = 'peanuts' (insert)"
    assert rig.jobs.fact_command("t", g, job.event_id) == detail
    assert facts(rig) == [("constraint", "peanuts", "peanuts", True, None)]
    assert rig.facts.facts[0]["confidence"] == 1.0 and rig.mem0.adds == 1
    assert rig.db.commands[(job.event_id, g)]["detail"] == detail


def test_a_nul_in_an_older_logs_remember_is_dropped_from_the_fact():
    # The wire refuses it now; built without validation, as a log written before that may hold it.
    valid = command("t", "remember", 1, 1, text="I am allergic to peanuts")
    old = CommandEvent.model_construct(**{**valid.model_dump(), "args": {"text": "I am allergic\x00 to peanuts"}})
    rig = MemoryRig()
    rig.publish([say("t", 1, "Hi", 0), old])
    rig.drain("t")
    (_, g, job), *_ = [q for q in rig.queued if q[2].kind == "remember"]
    rig.jobs.fact_command("t", g, job.event_id)
    assert facts(rig) == [("constraint", "peanuts", "peanuts", True, None)]
    assert "\x00" not in str(rig.facts.facts) and "\x00" not in str(rig.mem0.of_user("alex"))


def test_forget_archives_matching_facts_and_deletes_them_from_mem0():
    rig = episodes_of(MemoryRig(), ["I live in Berlin. I prefer window seats."])
    rig.run_jobs()
    # Another user's identical fact must stay untouched.
    rig.facts.apply_fact(
        user_id="bob",
        thread_id="u",
        generation=1,
        episode_id=None,
        fact=fact_jobs.FactCandidate("identity", "location", "Berlin", 0.9, 0.8, "I live in Berlin."),
        event_ids=["u-1"],
        source="extracted",
    )
    berlin = next(f for f in rig.facts.facts if f["user_id"] == "alex" and f["value"] == "Berlin")
    out = fact_jobs.forget(
        rig.facts, rig.mem0, thread_id="t", generation=1, event_id="e1", user_id="alex", text="berlin"
    )
    assert out == "forget: archived 1 fact(s)"
    assert berlin["is_active"] is False and berlin["archived_reason"] == "forgotten"
    assert berlin["mem0_id"] in rig.mem0.deleted and rig.mem0.of_user("alex") == ["I prefer window seats."]
    assert [f["is_active"] for f in rig.facts.facts if f["user_id"] == "bob"] == [True]
    none = fact_jobs.forget(
        rig.facts, rig.mem0, thread_id="t", generation=1, event_id="e2", user_id="alex", text="unicorns"
    )
    assert none == "forget: nothing matched"


# --- the Jobs facade -----------------------------------------------------------------------------


def test_summarize_hands_a_saved_final_to_facts_next_and_embeds_it():
    rig = episodes_of(MemoryRig(policy=SummaryPolicy(running_every=1)), ["I live in Berlin."])
    handed = []
    for t, g, job in summary_jobs(rig):
        rig.jobs.summarize(rig.llm, t, g, job, facts_next=lambda *a: handed.append(a))
    assert handed == [("t", 1, "t#1")]  # the running summary handed nothing on
    assert all(s.embedding is not None for s in rig.db.thread_summaries("t"))
    assert rig.facts.facts == []  # queued, not run


def test_a_stale_final_hands_nothing_on():
    rig = episodes_of(MemoryRig(), ["I live in Berlin."])
    (t, g, job), *_ = summary_jobs(rig, "final")
    rig.db.contexts[t] = replace(rig.db.contexts[t], generation=2)
    handed = []
    assert rig.jobs.summarize(rig.llm, t, g, job, facts_next=lambda *a: handed.append(a)) == "stale"
    assert handed == []


def test_run_inline_extracts_the_facts_of_a_final_at_once():
    rig = episodes_of(MemoryRig(), ["I live in Berlin."])
    (t, g, job), *_ = summary_jobs(rig, "final")
    rig.jobs.run_inline(rig.llm, t, g, job)
    assert facts(rig) == [("identity", "location", "Berlin", True, None)]
    entry = rig.facts.ledger_get("t#1:g1:facts")
    assert entry is not None and counts_only(entry) == {"insert": 1}
    # The ledger lists what was derived, without the words: replay --check compares with it.
    ((derived),) = entry["derived"]
    assert derived == {
        "user_id": derived["user_id"],
        "category": "identity",
        "key": "location",
        "digest": derived["digest"],
        "action": "insert",
        "row": True,
    }
    assert "Berlin" not in str(entry)


def test_fact_command_rejects_anything_but_a_remember_or_forget_of_the_thread():
    rig = MemoryRig()
    rig.publish([say("t", 1, "Hi", 0), command("t", "close_episode", 1, 1), command("u", "remember", 2, 2, text="x")])
    for event_id in ("t-1", "t-cmd-1", "u-cmd-2", "nope"):
        with pytest.raises(ValueError, match="no remember/forget"):
            rig.jobs.fact_command("t", 1, event_id)
    assert rig.facts.facts == [] and rig.facts.ledger == {}


def test_retire_rebuilt_archives_old_generation_facts_and_their_memories():
    rig = episodes_of(MemoryRig(), ["I live in Berlin."])
    rig.run_jobs()
    (fact,) = rig.facts.facts
    rig.jobs.retire_rebuilt("t", 2)
    assert fact["archived_reason"] == "rebuilt" and rig.mem0.memories == {} and rig.mem0.deleted == [fact["mem0_id"]]


# --- the sweeper ---------------------------------------------------------------------------------


def sweeper(rig, attachments, depth, summaries, queued_attachments, queued_facts=None, finals_after_s=0, clock=None):
    facts = [] if queued_facts is None else queued_facts
    return Sweeper(
        rig.log,
        rig.doorbell,
        rig.db,
        attachments,
        rig.facts,
        lambda queue: depth.get(queue, 0),
        lambda t, g, j: summaries.append((t, g, j)),
        lambda e, p: queued_attachments.append((e, p)),
        lambda t, g, e: facts.append((t, g, e)),
        facts_after_s=60,
        finals_after_s=finals_after_s,
        clock=clock or (lambda: 0.0),
    )


def test_sweep_re_rings_threads_whose_cursor_lags_the_log():
    rig = MemoryRig()
    rig.publish([say("a", 1, "Hi", 0), say("b", 1, "Hi", 0)])
    rig.drain("a")
    result = sweeper(rig, FakeAttachmentStore(), {}, [], []).sweep()
    assert result.rung == 1 and rig.doorbell.sent == ["b"]
    assert sweeper(rig, FakeAttachmentStore(), {}, [], []).sweep().rung == 0  # rung once while pending


def test_sweep_re_queues_lost_finals_only_when_the_summarize_queue_is_empty():
    rig = episodes_of(MemoryRig(), ["One.", "Two."])
    run_finals(rig, [0])  # the second final was lost
    busy, idle = [], []
    assert sweeper(rig, FakeAttachmentStore(), {"summarize": 3}, busy, []).sweep().finals == 0
    assert sweeper(rig, FakeAttachmentStore(), {}, idle, []).sweep().finals == 1
    assert busy == [] and idle == [("t", 1, Job("final", "t#2", 2, 2))]


def test_sweep_takes_a_final_for_lost_only_once_it_has_been_missing_long_enough():
    # A final being written has left the queue: an empty queue alone must not queue it twice.
    rig = episodes_of(MemoryRig(), ["One.", "Two.", "Three."])
    run_finals(rig, [0])
    now, queued = [0.0], []
    sweep = sweeper(rig, FakeAttachmentStore(), {}, queued, [], finals_after_s=60, clock=lambda: now[0]).sweep
    assert sweep().finals == 0  # both first seen missing
    now[0] = 30
    run_finals(rig, [1])  # the one in flight was written meanwhile
    assert sweep().finals == 0
    now[0] = 61
    assert sweep().finals == 1 and queued == [("t", 1, Job("final", "t#3", 3, 3))]
    now[0] = 100
    assert sweep().finals == 0  # queued again: as long again before the next time
    now[0] = 122
    assert sweep().finals == 1 and len(queued) == 2


def test_sweep_re_queues_lost_fact_jobs_once_their_final_is_old_and_the_facts_queue_is_empty():
    rig = episodes_of(MemoryRig(), ["I live in Berlin.", "I work at Acme."])
    run_finals(rig, [0, 1])
    rig.jobs.episode_facts(rig.llm, "t", 1, "t#1")  # the second episode's facts job was lost
    young, busy, idle = [], [], []
    assert sweeper(rig, FakeAttachmentStore(), {}, [], [], young).sweep().facts == 0  # may still run
    rig.db.clock += 61
    assert sweeper(rig, FakeAttachmentStore(), {"facts": 2}, [], [], busy).sweep().facts == 0
    assert sweeper(rig, FakeAttachmentStore(), {}, [], [], idle).sweep().facts == 1
    assert young == busy == [] and idle == [("t", 1, "t#2")]
    rig.jobs.episode_facts(rig.llm, *idle[0])
    assert sweeper(rig, FakeAttachmentStore(), {}, [], []).sweep().facts == 0


def test_sweep_re_queues_stale_attachments_only_when_their_queue_is_empty():
    store = FakeAttachmentStore()
    store.add_message("old", "t", "alex", {"text": "see", "attachments": [{"url": "file:///a.png", "kind": "image"}]})
    store.clock += STALE_ATTACHMENT_S + 1
    store.add_message("new", "t", "alex", {"text": "see", "attachments": [{"url": "file:///b.png", "kind": "image"}]})
    rig, busy, idle = MemoryRig(), [], []
    assert sweeper(rig, store, {"attachments": 1}, [], busy).sweep().attachments == 0
    assert sweeper(rig, store, {}, [], idle).sweep().attachments == 1
    assert busy == [] and idle == [("old", 0)]


def test_a_fact_is_read_by_its_place_in_the_prompt_not_in_the_thread():
    """Prompts number their lines from 1, so a message deleted earlier in the thread leaves a later
    episode's prompt, and its cached answer, unchanged (prompts.numbered)."""
    rig = episodes_of(MemoryRig(), ["I live in Berlin.", "I live in Lisbon."])
    item = dict(category="identity", key="location", value="Lisbon", confidence=0.9, importance=0.8, text="x")
    rig.llm.answers["extract_facts"] = FactList(facts=[FactItem(seq=1, **item)])
    out = write_episode_facts(rig.facts, rig.mem0, rig.llm, thread_id="t", generation=1, episode_id="t#2")
    assert out == {"insert": 1} and [f["source_event_ids"] for f in rig.facts.facts] == [["t-2"]]
    assert rig.llm.calls[-1].input["messages"] == [{"seq": 1, "role": "user", "text": "I live in Lisbon."}]
