"""A worker's log carries what an operator needs: loading and running the embedding model at
log level INFO writes no progress bars and no warnings."""

import logging

import pytest

from chatmem.adapters.embedders import MiniLMEmbedder, OnnxMiniLMEmbedder, torch_available

pytestmark = pytest.mark.integration

BACKENDS = [
    pytest.param(OnnxMiniLMEmbedder, id="onnx"),
    pytest.param(
        MiniLMEmbedder,
        id="torch",
        marks=pytest.mark.skipif(not torch_available(), reason="the optional torch extra is not installed"),
    ),
]


@pytest.mark.parametrize("embedder", BACKENDS)
def test_embedding_at_info_level_writes_no_progress_bars_or_warnings(capfd, caplog, embedder):
    caplog.set_level(logging.INFO)
    vectors = embedder(batch_size=16).embed([f"message number {i} about trains" for i in range(100)])
    assert vectors.shape == (100, 384)
    out, err = capfd.readouterr()
    assert "it/s" not in err + out and "Batches" not in err + out, (out + err)[-500:]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
