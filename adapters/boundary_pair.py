"""The segmenter's pair model on ONNX Runtime (the `PairEncoder` port): the shipped fine-tuned
all-MiniLM-L6-v2 file (bench/train_pair.py) over `[CLS] context [SEP] candidate [SEP]` as
memory/boundary_pair.py builds it, mean-pooled, and the trained head from the segmenter's weights.

The segmenter asks about a candidate when it arrives and again when its window closes, with the
same words: the last few answers are kept, so the second ask costs nothing."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from chatmem.adapters.embedders import PAIR_ONNX_FILE, TOKENIZER_FILE, OnnxMiniLMEmbedder, file_sha256
from chatmem.memory.boundary_pair import PairStack, pair_ids
from chatmem.memory.boundary_scorer import BoundaryScorer
from chatmem.memory.ports import PairEncoder

REMEMBERED = 64  # pairs: a worker's threads each have one window open at a time


class OnnxPairEncoder:
    def __init__(
        self, model_file: Path | None = None, threads: int | None = None, head: PairStack | None = None
    ) -> None:
        self.model_file = Path(model_file) if model_file is not None else PAIR_ONNX_FILE
        self.head = head  # the trained head `logit` applies (the segmenter's weights)
        self._runner = OnnxMiniLMEmbedder(threads=threads, model_file=self.model_file)
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    def sha256(self) -> str:
        return file_sha256(self.model_file)

    def logit(self, context: str, candidate: str) -> float:
        if self.head is None:
            raise ValueError("no head: build the encoder with the segmenter weights' `pair` section")
        return self.head.logit(self.pooled(context, candidate))

    def for_thread(self, thread_id: str) -> OnnxPairEncoder:  # noqa: ARG002 - nothing is kept by thread
        return self

    def pooled(self, context: str, candidate: str) -> np.ndarray:
        key = (context, candidate)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return self._seen[key]
        ids, types = pair_ids(word_pieces(context), word_pieces(candidate))
        (hidden,) = self._runner.session().run(
            ["last_hidden_state"],
            {
                "input_ids": np.asarray([ids], dtype=np.int64),
                "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
                "token_type_ids": np.asarray([types], dtype=np.int64),
            },
        )
        vector = hidden[0].mean(axis=0).astype(np.float64)
        with self._lock:
            self._seen[key] = vector
            while len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
        return vector


def with_pair_model(
    scorer: BoundaryScorer, on: bool = True, cache: Callable[[OnnxPairEncoder], PairEncoder] | None = None
) -> BoundaryScorer:
    """`scorer` with the shipped pair model attached where its weights have a stacker for it (and
    `on`: `segment_pair_model`); otherwise as it is, the bag alone. `cache` wraps the model (the
    composition root keeps its answers in Postgres, adapters/pair_cache_pg.py)."""
    if not on or scorer.pair is None:
        return scorer
    encoder = OnnxPairEncoder(head=scorer.pair)
    if encoder.sha256() != scorer.pair.model_sha256:
        raise RuntimeError(
            f"{encoder.model_file}: not the pair model the segmenter's weights were trained with; "
            "retrain with `make train-segmenter`, or set CHATMEM_SEGMENT_PAIR_MODEL=false"
        )
    return scorer.with_encoder(cache(encoder) if cache is not None else encoder)


def word_pieces(text: str) -> list[int]:
    """The shipped tokenizer's word pieces of a text: no special tokens, no truncation (pair_ids
    cuts the pair), as the trainer reads them too."""
    return list(_tokenizer().encode(text.strip(), add_special_tokens=False).ids)


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_FILE))
    tok.no_truncation()
    tok.no_padding()
    return tok
