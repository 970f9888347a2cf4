"""The default embedder: all-MiniLM-L6-v2 on ONNX Runtime from the files shipped in the package.
No services needed; the torch comparison runs only where the optional extra is installed (the
1,000-text check lives in `chatmem bench export-onnx`)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from chatmem.adapters import embedders
from chatmem.adapters.embedders import (
    MINILM,
    ONNX_FILE,
    TOKENIZER_FILE,
    MissingBackendError,
    OnnxMiniLMEmbedder,
    minilm_embedder,
    torch_available,
)
from chatmem.schemas.settings import Settings

pytestmark = pytest.mark.integration

TEXTS = [
    "I booked a flight to Lisbon for the weekend.",
    "My plane to Lisbon leaves on Saturday morning.",
    "The laptop fan is loud when I compile the kernel.",
    "",
    "ok",
    "Caroline went to the LGBTQ support group yesterday and said it was really powerful.",
]


@pytest.fixture(scope="module")
def embedder() -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder()


def test_the_model_and_tokenizer_ship_in_the_package_and_load():
    assert ONNX_FILE.is_file() and TOKENIZER_FILE.is_file()
    assert ONNX_FILE.stat().st_size < 60_000_000  # fp16-stored weights, not a 90 MB fp32 copy
    tokenizer, session = OnnxMiniLMEmbedder()._load()
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
    assert tokenizer.truncation["max_length"] == 256 and tokenizer.padding is None


def test_vectors_are_384_wide_normalised_and_named_like_the_torch_path(embedder):
    vectors = embedder.embed(TEXTS)
    assert (embedder.model, embedder.dim) == (MINILM, 384)
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)


def test_same_text_same_vector_whatever_the_batch(embedder):
    alone = embedder.embed([TEXTS[0]])[0]
    # in a batch with longer texts (padding) and split over several batches
    crowd = [TEXTS[0], *TEXTS[2:], " ".join(TEXTS) * 3]
    together = OnnxMiniLMEmbedder(batch_size=2).embed(crowd)[0]
    again = embedder.embed([TEXTS[0]])[0]
    assert np.array_equal(alone, again)
    assert float(alone @ together) > 0.99999


def test_similar_texts_are_closer_than_unrelated_ones(embedder):
    flight, plane, laptop = embedder.embed(TEXTS[:3])
    assert float(flight @ plane) > float(flight @ laptop) + 0.2


def test_texts_past_256_tokens_are_truncated_like_sentence_transformers(embedder):
    head = "we talked about trains and stations " * 60  # well past 256 tokens
    a, b = embedder.embed([head, head + "and then something else entirely about cooking pasta"])
    assert float(a @ b) > 0.99999


def test_threads_share_one_session(embedder):
    expected = embedder.embed(TEXTS)
    results: list[np.ndarray] = []
    workers = [threading.Thread(target=lambda: results.append(embedder.embed(TEXTS))) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(results) == 4 and all(np.allclose(r, expected, atol=1e-6) for r in results)


def test_onnx_is_the_default_backend():
    assert Settings().embedding_backend == "onnx"
    assert isinstance(minilm_embedder(Settings().embedding_backend), OnnxMiniLMEmbedder)
    with pytest.raises(ValueError):
        Settings(embedding_backend="tensorflow")


def test_the_torch_backend_without_its_extra_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(embedders, "torch_available", lambda: False)
    with pytest.raises(MissingBackendError, match=r"chatmem\[torch\]"):
        minilm_embedder("torch")


@pytest.mark.skipif(not torch_available(), reason="the optional torch extra is not installed")
def test_onnx_vectors_match_the_torch_path():
    onnx_vectors = OnnxMiniLMEmbedder().embed(TEXTS)
    torch_vectors = embedders.MiniLMEmbedder().embed(TEXTS)
    assert np.min(np.sum(onnx_vectors * torch_vectors, axis=1)) >= 0.999
