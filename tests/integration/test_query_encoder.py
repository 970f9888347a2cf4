"""The recall query encoder shipped next to all-MiniLM-L6-v2: it loads from the package like the
model, embeds into the model's own space (stored turn vectors are never re-embedded), and still
finds what the model finds. Fine-tuning and export run where the `export` extra is installed."""

from __future__ import annotations

import numpy as np
import pytest

from chatmem.adapters.embedders import (
    ONNX_FILE,
    QUERY_ONNX_FILE,
    TOKENIZER_FILE,
    OnnxMiniLMEmbedder,
    recall_query_encoder,
    torch_available,
)
from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container

pytestmark = pytest.mark.integration

TURNS = [
    "Hey Leo! I finally adopted a rescue greyhound, her name is Pepper.",
    "My sister started a new job at the bank in Porto last month.",
    "I made a blue vase in pottery class, my first one that did not crack.",
    "I am training for the Lisbon half marathon in October.",
    "We painted the kitchen yellow over the weekend.",
    "The conference talk about climate policy was really inspiring.",
]
QUESTIONS = [
    ("What is the name of Maya's dog?", 0),
    ("Where does Maya's sister work?", 1),
    ("What did Maya make in pottery class?", 2),
    ("Which race is Leo training for?", 3),
    ("What colour did they paint the kitchen?", 4),
]


@pytest.fixture(scope="module")
def base() -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder()


@pytest.fixture(scope="module")
def encoder() -> OnnxMiniLMEmbedder:
    return recall_query_encoder()


def test_the_encoder_ships_in_the_package_and_loads_like_the_model(encoder):
    # int8 weights: half the model's fp16-stored file, one thread (a query is too short for two)
    assert QUERY_ONNX_FILE.is_file() and QUERY_ONNX_FILE.stat().st_size < ONNX_FILE.stat().st_size * 0.55
    assert encoder.threads == 1
    _, session = encoder._load()
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert (encoder.model, encoder.dim, encoder.tokenizer_file) == ("all-MiniLM-L6-v2", 384, TOKENIZER_FILE)


def test_query_vectors_are_normalised_differ_from_the_models_and_stay_in_its_space(base, encoder):
    questions = [q for q, _ in QUESTIONS]
    tuned, plain = encoder.embed(questions), base.embed(questions)
    assert tuned.shape == (len(questions), 384) and np.allclose(np.linalg.norm(tuned, axis=1), 1.0, atol=1e-5)
    agreement = np.sum(tuned * plain, axis=1)
    assert agreement.max() < 0.999  # fine-tuned: not the model's own file
    assert agreement.min() > 0.5  # same space: a query still lands near its plain vector


def test_the_encoders_queries_find_the_turn_that_answers_them_among_the_models_turn_vectors(base, encoder):
    turns = base.embed(TURNS)  # stored vectors: the model's
    queries = encoder.embed([q for q, _ in QUESTIONS])
    assert [int(np.argmax(turns @ q)) for q in queries] == [i for _, i in QUESTIONS]


@pytest.mark.parametrize("on", [True, False])
def test_recall_and_its_fact_search_embed_the_query_with_the_encoder_unless_switched_off(settings_factory, on):
    from chatmem.adapters import mem0_store

    s = settings_factory(recall_query_encoder=on)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        assert c.recall.embedder.inner.model_file == (QUERY_ONNX_FILE if on else ONNX_FILE)
        c.recall.facts.search("what is the name of her dog", user_id="maya")
        # mem0's fact search takes the same embedder (and its cache): the query is embedded once.
        assert mem0_store._shared["query_embedder"] is c.recall.embedder.current()
    finally:
        c.close()


@pytest.mark.skipif(not torch_available(), reason="the optional export extra (torch) is not installed")
def test_fine_tuning_moves_questions_to_their_evidence_and_exports_a_file_the_read_path_runs(base, tmp_path):
    from chatmem.bench import train_query

    turns = base.embed(TURNS)
    items = [
        train_query.Question("s", q, turns, np.arange(len(TURNS)) == i)
        for q, i in [("Which pet did she get?", 0), ("What does the sister do?", 1)]
    ]
    before = [float(turns[q.relevant][0] @ base.embed([q.text])[0]) for q in items]
    bert = train_query.fine_tune(items, epochs=3)
    out, out8 = tmp_path / "query.onnx", tmp_path / "query-int8.onnx"
    train_query.export(bert, out)
    train_query.export(bert, out8, int8=True)  # the shipped form
    assert out8.stat().st_size < out.stat().st_size * 0.55
    tuned, tuned8 = (OnnxMiniLMEmbedder(model_file=f, tokenizer_file=TOKENIZER_FILE) for f in (out, out8))
    for model in (tuned, tuned8):
        after = [float(turns[q.relevant][0] @ model.embed([q.text])[0]) for q in items]
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    texts = [q for q, _ in QUESTIONS] + TURNS
    assert np.sum(tuned.embed(texts) * tuned8.embed(texts), axis=1).min() > 0.97  # int8's rounding only
