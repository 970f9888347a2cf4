"""How the ONNX embedder cuts a call into batches: by token count, so little of a batch is padding."""

import numpy as np

from chatmem.adapters.embedders import PAD_RATIO, length_batches


def test_batches_cover_every_text_once_and_pad_little():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 200, size=500)
    order = np.argsort(lengths, kind="stable")
    batches = length_batches(order, lengths, 16)
    assert np.array_equal(np.concatenate(batches), order)
    for rows in batches:
        assert 1 <= len(rows) <= 16
        assert lengths[rows].max() <= PAD_RATIO * lengths[rows].min() + 4


def test_texts_of_one_length_fill_whole_batches():
    lengths = np.full(40, 12)
    batches = length_batches(np.arange(40), lengths, 16)
    assert [len(b) for b in batches] == [16, 16, 8]


def test_a_much_longer_text_gets_a_batch_of_its_own():
    lengths = np.array([5, 6, 7, 120])
    assert [b.tolist() for b in length_batches(np.arange(4), lengths, 16)] == [[0, 1, 2], [3]]
