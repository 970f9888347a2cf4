"""The segmenter's pair model as shipped: the ONNX file the weights were trained with, on ONNX
Runtime, attached by the composition root, and the streaming contract with it on real vectors.
Fine-tuning and export run where the `export` extra is installed."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from chatmem.adapters import boundary_pair
from chatmem.adapters.boundary_pair import OnnxPairEncoder, with_pair_model, word_pieces
from chatmem.adapters.embedders import PAIR_ONNX_FILE, QUERY_ONNX_FILE, OnnxMiniLMEmbedder, torch_available
from chatmem.adapters.pair_cache_pg import CachedPairEncoder
from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.memory.boundary_pair import context_text
from chatmem.memory.boundary_scorer import TurnInfo, shipped_scorer
from chatmem.memory.segmentation import SegmenterConfig, SegmenterState, SegTurn, feed, segment
from chatmem.workers import tasks

pytestmark = pytest.mark.integration

# Two people chatting, as in TIAGE: pets, then work, then a trip.
PEOPLE = [
    "hi there! do you have any pets?",
    "yes, i have two cats and a very lazy dog.",
    "that sounds fun. my dog loves running on the beach.",
    "mine only sleeps on the couch all day haha",
    "what do you do for a living?",
    "i am a nurse at the children's hospital, long shifts.",
    "that must be hard but rewarding. i work in a bank.",
    "do you like your job at the bank?",
    "it pays the bills. have you travelled anywhere this year?",
    "we went to japan in april, the cherry blossoms were amazing.",
    "i would love to see kyoto one day.",
    "kyoto was my favourite, so many temples.",
]


@pytest.fixture(scope="module")
def turns() -> list[SegTurn]:
    vectors = OnnxMiniLMEmbedder().embed(PEOPLE)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        SegTurn(i, "user", t, t0 + timedelta(minutes=i), v)
        for i, (t, v) in enumerate(zip(PEOPLE, vectors, strict=True))
    ]


def test_the_shipped_weights_carry_the_pair_model_file_they_were_trained_with():
    scorer = shipped_scorer()
    assert scorer.pair is not None and PAIR_ONNX_FILE.is_file() and PAIR_ONNX_FILE.stat().st_size < 60_000_000
    attached = with_pair_model(scorer)
    assert attached.reads_text and attached.pair == scorer.pair
    assert with_pair_model(scorer, on=False) is scorer


def test_a_pair_model_file_other_than_the_weights_one_is_refused(monkeypatch):
    monkeypatch.setattr(boundary_pair, "PAIR_ONNX_FILE", QUERY_ONNX_FILE)
    with pytest.raises(RuntimeError, match="not the pair model"):
        with_pair_model(shipped_scorer())


def test_the_encoder_reads_the_pair_and_answers_a_repeated_pair_from_memory():
    encoder = OnnxPairEncoder()
    context, candidate = context_text(PEOPLE[:4]), PEOPLE[4]
    first = encoder.pooled(context, candidate)
    assert first.shape == (384,) and np.isfinite(first).all()
    assert encoder.pooled(context, candidate) is first  # the closed window asks again: no second run
    other = encoder.pooled(context, PEOPLE[3])
    assert not np.allclose(first, other)
    scorer = shipped_scorer()
    assert scorer.pair is not None
    # the shipped head separates a new question on another subject from a reply on the same one
    assert scorer.pair.logit(first) > scorer.pair.logit(encoder.pooled(context_text(PEOPLE[:2]), PEOPLE[2]))
    assert word_pieces("Hello, world") == [7592, 1010, 2088]


def test_streaming_with_the_shipped_pair_model_equals_one_pass(turns):
    scorer = with_pair_model(shipped_scorer())
    cfg = SegmenterConfig()
    whole = segment(turns, cfg, scorer=scorer)
    state, streamed = SegmenterState(), []
    for t in turns:
        state, bounds = feed(state, t, cfg, scorer)
        streamed += [(b, t.seq) for b in bounds]
        state = SegmenterState.from_json(json.loads(json.dumps(state.to_json())))
        assert all(r.text == PEOPLE[r.seq] for r in state.recent)
    assert [b for b, _ in streamed] == whole
    assert all(at - b.seq <= 1 for b, at in streamed)  # every turn is a user's: decided within two
    infos = [TurnInfo.of(t.seq, t.role, t.text, t.vector) for t in turns]
    texts = [TurnInfo(i.seq, i.role, i.vector, i.words, i.question, i.cues, PEOPLE[i.seq]) for i in infos]
    # the stacked probability differs from the bag's where the words are read
    assert scorer.boundary_probability(texts[:4], texts[4:5]) != shipped_scorer().boundary_probability(
        texts[:4], texts[4:5]
    )


@pytest.mark.parametrize("on", [True, False])
def test_the_workers_segment_with_the_pair_model_unless_switched_off(settings_factory, on):
    s = settings_factory(segment_pair_model=on)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    try:
        scorer = c.processor.scorer
        assert scorer is c.boundary_scorer and scorer is not None and scorer.reads_text == on
    finally:
        c.close()


@pytest.mark.parametrize("queue", ["segment", "summarize"])
def test_a_segment_pool_process_loads_the_pair_model_when_it_starts(settings_factory, monkeypatch, queue):
    asked: list[tuple[str, str]] = []
    real = OnnxPairEncoder.pooled
    monkeypatch.setattr(OnnxPairEncoder, "pooled", lambda self, a, b: asked.append((a, b)) or real(self, a, b))
    s = settings_factory()
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))
    app = c.celery
    app.conf.chatmem_preload_model = True
    app.conf.chatmem_preload_segmenter = queue == "segment"
    app.set_current()
    try:
        tasks._preload_model()
        assert asked == ([("warm up", "warm up")] if queue == "segment" else [])
    finally:
        tasks._wirings.pop(os.getpid()).close()
        c.close()


class OtherMachine(OnnxPairEncoder):
    """The same model answering otherwise, as on another CPU or ONNX Runtime, by far more."""

    def logit(self, context: str, candidate: str) -> float:
        self.asked = getattr(self, "asked", 0) + 1
        return super().logit(context, candidate) + 6.0


def test_a_rebuild_reads_the_pair_models_answers_kept_for_its_thread(container, turns):
    scorer = container.boundary_scorer
    live = segment(turns, SegmenterConfig(), scorer=scorer.for_thread("t-live"))
    kept = "SELECT count(*) FROM pair_cache WHERE thread_id = %s"
    with container.pool.connection() as conn:
        assert conn.execute(kept, ("t-live",)).fetchone()[0] == len(turns) - 1  # every turn after the first
    other = OtherMachine(head=scorer.pair)
    elsewhere = scorer.with_encoder(CachedPairEncoder(other, container.pool))
    assert segment(turns, SegmenterConfig(), scorer=elsewhere.for_thread("t-live")) == live
    assert getattr(other, "asked", 0) == 0  # every answer came from the cache
    # With nothing kept (here: the thread erased), the model is asked, and answers otherwise.
    with container.pool.connection() as conn:
        conn.execute("DELETE FROM pair_cache WHERE thread_id = %s", ("t-live",))
    assert segment(turns, SegmenterConfig(), scorer=elsewhere.for_thread("t-live")) != live and other.asked
    # Unbound (the worker's warm-up), the model is asked and nothing is kept.
    with container.pool.connection() as conn:
        before = conn.execute("SELECT count(*) FROM pair_cache").fetchone()[0]
    scorer.encoder.logit("warm up", "warm up")
    with container.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pair_cache").fetchone()[0] == before


@pytest.mark.skipif(not torch_available(), reason="the optional export extra (torch) is not installed")
def test_fine_tuning_exports_a_file_whose_logits_match_torch(tmp_path):
    from chatmem.bench import train_pair
    from chatmem.bench.topicseg import Dialogue
    from chatmem.memory.boundary_pair import PairStack

    dialogue = Dialogue("d", ["user"] * len(PEOPLE), PEOPLE, [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0])
    items = train_pair.candidates([dialogue], word_pieces)
    model = train_pair.fit(items, epochs=1)
    out = tmp_path / "pair.onnx"
    train_pair.export(model.bert, out)
    encoder = OnnxPairEncoder(model_file=out)
    head = PairStack(
        model.head.weight.detach().numpy().ravel().astype(np.float64),
        float(model.head.bias.detach().numpy()[0]),
        (0.0,) * 6,
        0.5,
        0.0,
        0.0,
        "",
    )
    onnx = [head.logit(encoder.pooled(context_text(PEOPLE[: c.seq]), PEOPLE[c.seq])) for c in items]
    torch_logits = train_pair.predict(model, items)
    assert np.allclose(onnx, torch_logits, atol=0.05), (onnx, torch_logits)
