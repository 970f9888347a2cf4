"""The segmenter's pair model answers kept in Postgres (`pair_cache`, migrations/0014), as the
embedder's vectors are kept in `embedding_cache`: a rebuild reads the logits live processing
computed instead of running the model again, so it places the same boundaries on another CPU or
ONNX Runtime (DESIGN.md, "Replay is deterministic"), and costs no model time.

An answer is keyed by the model (the file's sha256 and its head) and a hash of the pair's texts,
and kept under the thread it was asked for: an erasure deletes a thread's answers
(adapters/erase_pg.py), since the turns of a pair are no single message's. Unbound to a thread
(the worker's warm-up), the model is asked directly and nothing is kept."""

from __future__ import annotations

import hashlib
import json

from psycopg_pool import ConnectionPool

from chatmem.adapters.boundary_pair import OnnxPairEncoder
from chatmem.adapters.cache_uses import CacheUses


def pair_hash(context: str, candidate: str) -> bytes:
    return hashlib.sha256(json.dumps([context, candidate], ensure_ascii=False).encode("utf-8")).digest()


def model_key(encoder: OnnxPairEncoder) -> str:
    """The file and the head it answers with: either changing gives other logits."""
    head = encoder.head
    tail = b"" if head is None else head.head.tobytes() + repr(head.bias).encode()
    return f"pair:{encoder.sha256()[:16]}:{hashlib.sha256(tail).hexdigest()[:16]}"


class CachedPairEncoder:
    """The `PairEncoder` port over the ONNX model, with its answers in `pair_cache`. Each ask is
    its own short statement, outside any transaction of the caller's. The ask when a window closes
    repeats the one when it opened and reads the row again: an answer kept in the process as well
    would outlive an erasure's deletion of the thread's rows, and the rebuild would not write them
    back."""

    def __init__(
        self, inner: OnnxPairEncoder, pool: ConnectionPool, thread_id: str | None = None, uses: CacheUses | None = None
    ):
        self.inner = inner
        self.pool = pool
        self.thread_id = thread_id
        self.model = model_key(inner)
        self.uses = uses  # told of each key read or written, for the rebuilds it watches

    def for_thread(self, thread_id: str) -> CachedPairEncoder:
        return CachedPairEncoder(self.inner, self.pool, thread_id, self.uses)

    def logit(self, context: str, candidate: str) -> float:
        if self.thread_id is None:
            return self.inner.logit(context, candidate)
        key = pair_hash(context, candidate)
        if self.uses is not None:
            self.uses.pair(self.thread_id, (self.model, key))
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT logit FROM pair_cache WHERE model = %s AND input_hash = %s", (self.model, key)
            ).fetchone()
        if row is not None:
            return float(row[0])
        z = self.inner.logit(context, candidate)
        with self.pool.connection() as conn:
            conn.execute(
                """INSERT INTO pair_cache (model, input_hash, thread_id, logit) VALUES (%s, %s, %s, %s)
                   ON CONFLICT (model, input_hash) DO NOTHING""",
                (self.model, key, self.thread_id, z),
            )
        return z
