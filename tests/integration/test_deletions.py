"""A deleted message on the real stack, beyond the adapters: what its thread's rebuild asks the
models again, that no cached answer derived from it is left, and that a run stopped between the
shredding and the rebuild is finished by the next."""

import json
from datetime import timedelta

import pytest

from chatmem.adapters.metrics import instruments
from chatmem.schemas.events import MessageDeletedEvent, MessageEvent
from tests.conftest import scalar
from tests.integration.test_episodes import Driver
from tests.scripted import T0, command, script_events


def asked(c) -> float:
    """LLM requests that reached the model so far (the cache's answers are counted apart)."""
    return instruments().llm_calls.labels(c.llm("maintenance").model, "ok")._value.get()


def llm_outputs(c) -> str:
    with c.pool.connection() as conn:
        return json.dumps([r[0] for r in conn.execute("SELECT output FROM llm_cache")])


def test_a_deletion_asks_the_llm_again_only_for_what_held_the_message(container):
    c = container
    d = Driver(c)
    events = script_events("del")
    secret = "Now the hotel in Lisbon: the Quokka Inn near Alfama, my booking code is QX-4417."
    assert events[8].platform_message_id == "m9"  # the hotel request opens the third of five episodes
    events[8] = events[8].model_copy(update={"text": secret})
    d.publish(events)
    d.advance("del")
    d.run_jobs(with_facts=True)
    assert "QX-4417" in llm_outputs(c)
    entries = scalar(c, "SELECT count(*) FROM llm_cache WHERE thread_id = 'del'")

    d.publish([MessageDeletedEvent(event_id="del-d", thread_id="del", user_id="alex", platform_message_ids=["m9"])])
    d.advance("del")
    before = asked(c)
    removed = c.forget_deleted("del")
    again = asked(c) - before
    assert removed["events"] == 1

    assert "QX-4417" not in llm_outputs(c)
    # The third episode's summary is asked again; the later episodes' prompts number their lines
    # from 1 and are unchanged (3 of 8 while prompts used the thread's numbering, 7 of 8 while
    # the rebuild dropped the thread's outputs first).
    assert 0 < again <= 2 < entries, (again, entries)


CHAT = [  # two people, no assistant: the segmenter's pair model reads their turns
    ("ann", "Did you see the match last night?"),
    ("bob", "Yes, what a finish in the last minute!"),
    ("ann", "The keeper saved everything until then."),
    ("bob", "I still can't believe that header."),
    ("ann", "Anyway, my new flat has a leak in the bathroom, the code for the door is 7741."),
    ("bob", "Oh no, did you call the landlord about the leak?"),
    ("ann", "He says a plumber comes on Thursday."),
    ("bob", "Good, keep the bathroom door open so it dries."),
    ("ann", "By the way, are you coming to the quiz night on Friday?"),
    ("bob", "Sure, I'll bring my brother, he knows all the geography."),
]


def test_the_pair_models_answers_about_other_turns_are_kept(container):
    c = container
    d = Driver(c)
    d.processor.scorer = c.boundary_scorer  # as the segment worker has it: with the pair model
    d.publish(
        [
            MessageEvent(
                event_id=f"chat-{i}",
                thread_id="chat",
                user_id=who,
                text=text,
                occurred_at=T0 + timedelta(minutes=i),
                platform_message_id=f"p{i}",
                metadata={"author_name": who.capitalize()},
            )
            for i, (who, text) in enumerate(CHAT, start=1)
        ]
    )
    d.advance("chat")
    pairs = scalar(c, "SELECT count(*) FROM pair_cache WHERE thread_id = 'chat'")
    assert pairs > 4
    d.publish([MessageDeletedEvent(event_id="chat-d", thread_id="chat", user_id="ann", platform_message_ids=["p5"])])
    d.advance("chat")
    removed = c.forget_deleted("chat")
    kept = scalar(c, "SELECT count(*) FROM pair_cache WHERE thread_id = 'chat'")
    # The answers that read the deleted turn go; the others were used again by the rebuild.
    assert 0 < removed["pair_cache"] < pairs and 0 < kept, (pairs, removed["pair_cache"], kept)
    with c.pool.connection() as conn:
        assert not [t for (t,) in conn.execute("SELECT text FROM messages") if "7741" in t]


def test_a_run_stopped_before_its_rebuild_is_finished_by_the_next(container, monkeypatch):
    c = container
    d = Driver(c)
    d.publish(script_events("stop"))
    d.advance("stop")
    d.publish([MessageDeletedEvent(event_id="stop-d", thread_id="stop", user_id="alex", platform_message_ids=["m9"])])
    d.advance("stop")

    def hotel_projected() -> bool:
        return scalar(c, "SELECT count(*) FROM messages WHERE text LIKE %s", "%near Alfama under 150%") > 0

    def lost(*args, **kwargs):
        raise ConnectionError("the worker was lost")

    monkeypatch.setattr(c, "_rebuild", lost)
    with pytest.raises(ConnectionError):
        c.forget_deleted("stop")
    monkeypatch.undo()
    assert hotel_projected()  # shredded in the log, not yet rebuilt: the retry finds no content left
    assert c.forget_deleted("stop")["old_messages"] > 0  # ...and rebuilds all the same
    assert not hotel_projected()
    assert scalar(c, "SELECT count(*) FROM erasures WHERE finished_at IS NULL") == 0
    assert c.forget_deleted("stop") == {"events": 0}


def deleted_while_off(c, d: Driver, chat: str, message_id: str, shown: str) -> list[str]:
    """A deletion of `message_id` published in the paused `chat`: one run is queued, and it shreds
    one message. The texts left in thread `shown`."""
    deletion = MessageDeletedEvent(
        event_id=f"{chat}-d", thread_id=chat, user_id="bot", platform_message_ids=[message_id]
    )
    d.publish([deletion])
    d.advance(chat)
    assert [j.kind for _, _, j in d.jobs if j.kind == "forget_deleted"] == ["forget_deleted"]
    assert c.forget_deleted(chat)["events"] == 1
    with c.pool.connection() as conn:
        return [t for (t,) in conn.execute("SELECT text FROM messages WHERE thread_id = %s ORDER BY seq", (shown,))]


def test_a_deletion_is_shredded_while_the_chats_memory_is_off(container):
    """Events wait in the log while memory is off; a deletion does not: what someone deleted goes
    now. The thread stays paused."""
    c = container
    d = Driver(c)
    events = script_events("off")[:4]
    d.publish([*events, command("off", "memory_off", 1, 5)])
    d.advance("off")
    texts = deleted_while_off(c, d, "off", "m3", "off")
    assert texts == [e.text for e in events if e.platform_message_id != "m3"]
    assert scalar(c, "SELECT NOT memory_on FROM threads WHERE thread_id = 'off'")
    d.jobs.clear()
    d.publish(
        [MessageEvent(event_id="off-5", thread_id="off", user_id="alex", text="still off", platform_message_id="m5")]
    )
    d.advance("off")
    assert d.jobs == []  # nothing left to shred: no more runs


def test_a_deletion_in_a_forum_topic_is_shredded_while_the_chats_memory_is_off(container):
    """A chat's deletion names only the chat; the message may sit in one of its forum topics
    (`<chat>:<topic>`). With the chat's memory off it waited until memory was on again."""
    c = container
    d = Driver(c)
    topic = [
        MessageEvent(event_id=f"t-{n}", thread_id="forum:7", user_id="alex", text=text, platform_message_id=f"m{n}")
        for n, text in enumerate(["the door code is 4512", "thanks, got it"], start=1)
    ]
    d.publish([*topic, command("forum", "memory_off", 1, 5)])
    d.advance("forum:7")
    d.advance("forum")
    d.jobs.clear()
    assert deleted_while_off(c, d, "forum", "m1", "forum:7") == ["thanks, got it"]


@pytest.mark.parametrize("where", ["late", "late:7"])
def test_a_message_logged_after_its_deletion_is_shredded(container, where):
    """A producer's spool can deliver a message after the deletion that names it. It was kept
    until the thread's next deletion; now its arrival runs the deletion's thread again (the chat's,
    for a message in one of its forum topics)."""
    c = container
    d = Driver(c)
    d.publish([MessageDeletedEvent(event_id="late-d", thread_id="late", user_id="bot", platform_message_ids=["m1"])])
    d.advance("late")
    d.jobs.clear()
    spooled = [
        MessageEvent(event_id=f"{where}-{n}", thread_id=where, user_id="alex", text=text, platform_message_id=f"m{n}")
        for n, text in enumerate(["the door code is 4512", "see you at six"], start=1)
    ]
    d.publish(spooled)
    d.advance(where)
    assert [(t, j.kind) for t, _, j in d.jobs if j.kind == "forget_deleted"] == [("late", "forget_deleted")]
    assert c.forget_deleted("late")["events"] == 1
    with c.pool.connection() as conn:
        texts = [t for (t,) in conn.execute("SELECT text FROM messages WHERE thread_id = %s", (where,))]
    assert texts == ["see you at six"]
    d.jobs.clear()
    d.publish(
        [MessageEvent(event_id=f"{where}-3", thread_id=where, user_id="alex", text="ok", platform_message_id="m3")]
    )
    d.advance(where)
    assert [j for _, _, j in d.jobs if j.kind == "forget_deleted"] == []  # m3 was never deleted


def test_a_deletion_logged_after_its_message_is_left_to_the_planner(container):
    """Both already in the log, the message in an earlier batch than its deletion: one run, queued
    when the thread reaches the deletion (not a second one when it reaches the message)."""
    c = container
    d = Driver(c)
    said = [
        MessageEvent(
            event_id=f"order-{n}", thread_id="order", user_id="alex", text=f"line {n}", platform_message_id=f"m{n}"
        )
        for n in range(1, 5)
    ]
    d.publish(
        [*said, MessageDeletedEvent(event_id="order-d", thread_id="order", user_id="bot", platform_message_ids=["m1"])]
    )
    d.advance("order", batch_size=2)
    assert [j.kind for _, _, j in d.jobs if j.kind == "forget_deleted"] == ["forget_deleted"]


def test_a_late_message_in_a_paused_chat_is_shredded(container):
    """The deletion was applied before the chat's memory went off; the message it names arrives
    after (a spool delivered late) and waits behind the paused cursor. It waited, sealed, until
    memory was on again."""
    c = container
    d = Driver(c)
    d.publish([MessageDeletedEvent(event_id="hush-d", thread_id="hush", user_id="bot", platform_message_ids=["m1"])])
    d.publish([command("hush", "memory_off", 1, 5)])
    d.advance("hush")
    d.jobs.clear()
    late = MessageEvent(event_id="hush-1", thread_id="hush", user_id="alex", text="pin 4411", platform_message_id="m1")
    d.publish([late])
    d.advance("hush")
    assert [j.kind for _, _, j in d.jobs if j.kind == "forget_deleted"] == ["forget_deleted"]
    assert c.forget_deleted("hush")["events"] == 1
    payload = scalar(c, "SELECT payload FROM events WHERE event_id = 'hush-1'")
    assert "text" not in payload and payload["metadata"] == {"erased": True}
    d.jobs.clear()
    d.publish([MessageEvent(event_id="hush-2", thread_id="hush", user_id="alex", text="ok", platform_message_id="m2")])
    d.advance("hush")
    assert d.jobs == []  # nothing left to shred: no more runs
