"""The segmenter's LLM assist through the real OpenAI adapter, against a local OpenAI-compatible
endpoint (no model is reachable from here), with the real embedder, scorer, output cache and
Postgres: the model's answers move boundaries, a replay reproduces them from the cache without
asking again, and an endpoint that fails leaves the offline episodes."""

from datetime import timedelta

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.memory.replay import replay_thread
from chatmem.schemas.events import MessageEvent
from tests.conftest import scalar
from tests.fake_openai import FakeOpenAI, completion, serving
from tests.integration.test_episodes import Driver
from tests.scripted import T0

pytestmark = pytest.mark.integration

TURNS = [
    ("user", "I'm planning a trip to Lisbon in May, what should I see?"),
    ("assistant", "Alfama, the Belém tower and a ride on tram 28."),
    ("user", "Which area is best for a hotel near the old town?"),
    ("assistant", "Baixa or Chiado: central and walkable."),
    ("user", "My laptop keeps crashing whenever I open the browser."),
    ("assistant", "Which laptop model and operating system is it?"),
    ("user", "A ThinkPad X1 with Ubuntu 22.04."),
    ("assistant", "Try updating the graphics driver first."),
    ("user", "Can you recommend a good pasta recipe for dinner tonight?"),
    ("assistant", "A simple carbonara: eggs, pecorino, guanciale and black pepper."),
    ("user", "How long should I cook the spaghetti?"),
]
USER_SEQS = [i + 1 for i, (role, _) in enumerate(TURNS) if role == "user"]


def events(thread):
    return [
        MessageEvent(
            event_id=f"{thread}-{i}",
            thread_id=thread,
            user_id="ana",
            role=role,
            text=text,
            occurred_at=T0 + timedelta(minutes=i),
        )
        for i, (role, text) in enumerate(TURNS)
    ]


def starts(c, thread):
    with c.pool.connection() as conn:
        rows = conn.execute(
            """SELECT start_seq, opened_by FROM episodes WHERE thread_id = %s
               AND generation = (SELECT generation FROM threads WHERE thread_id = %s) ORDER BY ordinal""",
            (thread, thread),
        ).fetchall()
    return [tuple(r) for r in rows]


def run(c, thread):
    d = Driver(c)
    d.publish(events(thread))
    d.advance(thread, batch_size=3)  # batches: windows stay open across them, the state in Postgres
    return starts(c, thread)


def says(new_topic):
    """The model's structured answer to every question."""
    return completion(
        {
            "context_before": "a trip to Lisbon",
            "context_after": "whatever comes next",
            "turns": [{"seq": 1, "intent": "new_request" if new_topic else "follow_up", "topic": "something"}],
            "new_topic": new_topic,
        },
        model="test-seg",
    )


@pytest.fixture
def endpoint():
    with serving() as url:
        yield url


@pytest.fixture
def containers(settings_factory, endpoint):
    """The offline default and, on the same database, one with the assist on asking about every
    decision (band 1), so the model's answer is visible in the episodes."""
    made = []

    def make(**overrides):
        s = settings_factory(**overrides)
        made.append(Container(s, ServiceUrls(s.database_url, s.redis_url, False, False)))
        return made[-1]

    def assisted():
        return make(
            segment_llm_assist=True,
            segment_llm_band=1.0,
            llm_api_key="sk-test-key",
            llm_base_url=endpoint,
            llm_model="test-seg",
        )

    yield make(), assisted
    for c in made:
        c.close()


def test_the_models_answers_move_boundaries_and_a_replay_reproduces_them_from_the_cache(containers):
    offline, assisted = containers
    plain = run(offline, "plain")
    assert len(plain) >= 2 and all(reason in ("first", "shift") for _, reason in plain)  # the scorer splits

    c = assisted()
    FakeOpenAI.body = says(False)
    assert run(c, "never") == [(1, "first")]  # every decision rejected: one episode
    FakeOpenAI.body = says(True)
    asked = len(FakeOpenAI.requests)
    assert run(c, "same") == [(1, "first")] and len(FakeOpenAI.requests) == asked  # same words: the cache answers
    with c.pool.connection() as conn:
        conn.execute("DELETE FROM llm_cache")
    always = run(c, "always")
    # Every decision confirmed: each user turn whose window was decided starts an episode.
    assert always[:5] == [(1, "first"), *((seq, "shift") for seq in USER_SEQS[1:5])] != plain

    request = FakeOpenAI.requests[-1]
    assert request["model"] == "test-seg" and request["temperature"] == 0
    assert request["response_format"]["json_schema"]["name"] == "TopicShift"
    assert '"candidate_seq"' in request["messages"][1]["content"] and "topic" in request["messages"][0]["content"]
    cached = scalar(
        c, "SELECT count(*) FROM llm_cache WHERE prompt_version = %s AND thread_id = %s", "topic-shift-v2", "always"
    )
    # One question for each window decided (every user turn's but the last one's, still open),
    # tagged with the thread: erasing it removes them.
    assert cached >= len(USER_SEQS) - 2

    # Replay asks the cache, not the model: a changed answer, or an endpoint gone, changes nothing.
    asked = len(FakeOpenAI.requests)
    FakeOpenAI.status, FakeOpenAI.body = 500, {"error": {"message": "down"}}
    result = replay_thread(
        "always",
        threads=c.thread_log,
        projections=c.projections,
        embedder=c.embedder,
        run=lambda job, generation: None,  # summaries are not what is checked here
        seg_cfg=c.seg_config,
        policy=c.summary_policy,
        owner="replay",
        lease_s=30,
        batch_size=500,
        assist=c.boundary_assist(),
    )
    assert result.generation == 2 and starts(c, "always") == always
    assert len(FakeOpenAI.requests) == asked


@pytest.mark.parametrize("status", [500, 401])
def test_an_endpoint_that_fails_leaves_the_offline_episodes(containers, status, caplog):
    offline, assisted = containers
    plain = run(offline, "plain")
    c = assisted()
    FakeOpenAI.status, FakeOpenAI.body = status, {"error": {"message": "no: sk-test-key"}}
    assert run(c, "down") == plain
    # One question (the client retries a 500 twice, not a 401); the rest wait out the cooldown.
    assert len(FakeOpenAI.requests) == (3 if status == 500 else 1)
    assert scalar(c, "SELECT count(*) FROM llm_cache") == 0
    assert "the model failed, the scorer decides (and alone for 60 s): " in caplog.text
    assert f"HTTP {status}" in caplog.text and "sk-test-key" not in caplog.text
