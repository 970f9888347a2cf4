import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatmem.adapters.llm import OpenAILLM, RateLimiter
from chatmem.memory.offline_llm import OfflineLLM, open_loops, unanswered_questions
from chatmem.memory.ports import LLMRefused, TransientError
from chatmem.memory.prompts import (
    FileSummary,
    FinalSummary,
    Line,
    RunningSummary,
    chunk_summary,
    extract_facts,
    file_summary,
    final_summary,
    rollup_summary,
    running_summary,
)
from tests.fake_openai import FakeOpenAI, completion, serving


class WordEmbedder:
    """A deterministic bag-of-words embedder (the unit tests' fake of the embedding port)."""

    model, dim = "words", 64

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, hash(w.strip(".,!?")) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


LINES = [
    Line(seq=1, role="user", text="Hi!"),
    Line(seq=2, role="user", text="My name is Alex and I prefer window seats on flights."),
    Line(seq=3, role="assistant", text="Noted, window seats. I will look for flights to Rome."),
    Line(seq=4, role="user", text="We decided to go with the Friday flight to Rome."),
    Line(seq=5, role="user", text="I need to renew my passport before the trip."),
    Line(seq=6, role="user", text="Can you check the hotel prices in Rome?"),
]


def test_offline_final_summary_extracts_structure():
    llm = OfflineLLM(WordEmbedder())
    out = llm.complete(final_summary(LINES), FinalSummary)
    assert any("prefer window seats" in f for f in out.facts_candidates)
    assert all("Hi" not in f for f in out.facts_candidates)
    assert any("decided" in d for d in out.decisions)
    assert any("renew my passport" in t for t in out.todos)
    assert out.open_questions == ["Can you check the hotel prices in Rome?"]
    assert "Rome" in out.entities and out.topic_label
    assert llm.complete(final_summary(LINES), FinalSummary) == out  # deterministic


_PIECES = [
    *"Hi I my name is Anna I'm from Lisbon I like we decided to will let's need to remember ? ! . ... 😀".split(),
    *["\u200b", "[image#ab12cd]", "[file#00ff] caption", "Mr.", "e.g.", "U.S.A.", "1", "\n\n", "", " ", ". " * 40],
]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=25).map(" ".join) | st.text(max_size=40)
_LINE = st.builds(
    Line,
    seq=st.integers(1, 10**6),
    role=st.sampled_from(["user", "assistant", "system"]),
    text=_TEXT,
    name=st.none() | st.sampled_from(["Anna", "", "Bob 😀"]),
)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(_LINE, max_size=15), texts=st.lists(_TEXT, max_size=5))
def test_the_offline_model_answers_every_prompt_for_any_text(lines, texts):
    # Its answer is the last attempt's when a model endpoint fails: an exception here fails the
    # job for good. A document whose first part was one character ("1") once raised IndexError.
    llm = OfflineLLM(WordEmbedder())
    for prompt in (
        *(build(lines) for build in (running_summary, chunk_summary, final_summary, extract_facts)),
        rollup_summary(texts),
        file_summary(None, texts),
        file_summary("notes.txt", texts),
    ):
        llm.complete(prompt, prompt.response_model)
    assert llm.complete(file_summary(None, ["1", "The rest of the page."]), FileSummary).title == "1"


def test_open_loops_and_unanswered_questions():
    assert unanswered_questions(LINES) == ["Can you check the hotel prices in Rome?"]
    loops = open_loops(LINES)
    assert "I will look for flights to Rome." in loops and "I need to renew my passport before the trip." in loops
    ru = [Line(seq=1, role="user", text="Мне нужно купить билеты. Напомни завтра.")]
    assert len(open_loops(ru)) == 2


def test_a_phone_s_typographic_apostrophes_still_make_loops_decisions_and_fact_candidates():
    typed = [
        Line(seq=1, role="user", text="I\u2019ll send the signed lease tomorrow."),
        Line(seq=2, role="user", text="Let\u2019s go with the blue sofa."),
        Line(seq=3, role="user", text="I\u2019m allergic to cats."),
    ]
    assert open_loops(typed) == ["I\u2019ll send the signed lease tomorrow."]  # quoted as written
    out = OfflineLLM(WordEmbedder()).complete(final_summary(typed), FinalSummary)
    assert out.decisions == ["Let\u2019s go with the blue sofa."]
    assert out.facts_candidates == ["I\u2019m allergic to cats."]


def test_offline_running_summary_picks_central_messages():
    out = OfflineLLM(WordEmbedder(), max_sentences=2).complete(running_summary(LINES), RunningSummary)
    assert out.summary and "Hi!" not in out.summary


def test_offline_summaries_embed_the_texts_the_segment_path_embedded():
    """Named authors: the summariser asks for the same texts as embed_text (cache hits), and
    the prompt of a thread without names is what it was before names were carried."""
    from datetime import UTC, datetime

    from chatmem.memory.episodes import embed_text

    asked: list[str] = []

    class Recording(WordEmbedder):
        def embed(self, texts):
            asked.extend(texts)
            return super().embed(texts)

    payloads = [{"text": ln.text, "metadata": {"author_name": "Alex"}} for ln in LINES]
    named = [ln.model_copy(update={"name": "Alex"}) for ln in LINES]
    at = datetime(2026, 1, 1, tzinfo=UTC)
    OfflineLLM(Recording(), max_sentences=2).complete(running_summary(named), RunningSummary)
    expected = {embed_text(p, at) for p in payloads if p["text"] != "Hi!"}
    assert asked and set(asked) == expected
    assert running_summary(LINES).input["messages"][0] == {"seq": 1, "role": "user", "text": "Hi!"}
    assert running_summary(named).input["messages"][0]["name"] == "Alex"


@pytest.fixture
def fake_openai():
    with serving() as url:
        yield url


def test_openai_adapter_parses_structured_output(fake_openai):
    content = {"summary": "Trip to Rome.", "open_loops": ["renew passport"]}
    FakeOpenAI.body = completion(content)
    llm = OpenAILLM("m", "key", fake_openai)
    out = llm.complete(running_summary(LINES), RunningSummary)
    assert out == RunningSummary(**content)


def test_openai_rate_limit_becomes_a_transient_error(fake_openai):
    FakeOpenAI.status = 429
    FakeOpenAI.body = {"error": {"message": "slow down", "type": "rate_limit"}}
    llm = OpenAILLM("m", "key", fake_openai)
    llm.client = llm.client.with_options(max_retries=0)
    with pytest.raises(TransientError, match="LLM unavailable"):
        llm.complete(running_summary(LINES), RunningSummary)


def test_rate_limiter_spaces_calls():
    now = [100.0]
    slept = []

    def sleep(seconds):
        slept.append(round(seconds, 3))
        now[0] += seconds

    limiter = RateLimiter(per_minute=1200, clock=lambda: now[0], sleep=sleep)  # one call per 50 ms
    for _ in range(4):
        limiter.wait()
    assert slept == [0.05, 0.05, 0.05]
    assert RateLimiter(per_minute=0).interval == 0.0


def test_a_refusal_becomes_llm_refused_and_its_message_holds_no_part_of_the_key(fake_openai):
    FakeOpenAI.status = 401
    FakeOpenAI.body = {"error": {"message": "Incorrect API key provided: sk-secret-1234", "type": "invalid_request"}}
    llm = OpenAILLM("m", "sk-secret-1234", fake_openai)
    with pytest.raises(LLMRefused) as refused:
        llm.complete(running_summary(LINES), RunningSummary)
    assert "401" in str(refused.value) and "secret" not in str(refused.value)
