"""A worker's log carries what an operator needs: loading and running the embedding model at
log level INFO writes no progress bars and no warnings."""

import logging

import pytest

from chatmem.adapters.embedders import MiniLMEmbedder

pytestmark = pytest.mark.integration


def test_embedding_at_info_level_writes_no_progress_bars_or_warnings(capfd, caplog):
    caplog.set_level(logging.INFO)
    vectors = MiniLMEmbedder(batch_size=16).embed([f"message number {i} about trains" for i in range(100)])
    assert vectors.shape == (100, 384)
    out, err = capfd.readouterr()
    assert "it/s" not in err + out and "Batches" not in err + out, (out + err)[-500:]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
