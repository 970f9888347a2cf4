"""The HNSW bench's synthetic vectors: unit length, and `clustered` ones bunch by topic (a
vector's nearest other vector is much closer than under `random`)."""

from __future__ import annotations

import numpy as np

from chatmem.bench.hnsw import DIM, vectors


def _nearest_cosines(kind: str) -> np.ndarray:
    x = np.vstack(list(vectors(2_000, kind)))
    assert x.shape == (2_000, DIM)
    assert np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
    sims = x @ x.T
    np.fill_diagonal(sims, -1)
    return sims.max(axis=1)


def test_clustered_vectors_have_close_neighbours_and_random_ones_do_not():
    clustered, uniform = _nearest_cosines("clustered"), _nearest_cosines("random")
    assert np.median(clustered) > 0.4 > 0.25 > np.median(uniform)
