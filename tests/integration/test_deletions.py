"""A deleted message on the real stack, beyond the adapters: what its thread's rebuild asks the
LLM again, and that nothing derived from it is left in the LLM's output cache."""

import json

from chatmem.adapters.metrics import instruments
from chatmem.schemas.events import MessageDeletedEvent
from tests.conftest import scalar
from tests.integration.test_episodes import Driver
from tests.scripted import script_events


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
    assert c.forget_deleted("del")["events"] == 1
    again = asked(c) - before

    assert "QX-4417" not in llm_outputs(c)
    assert 0 < again < entries / 2, (again, entries)
