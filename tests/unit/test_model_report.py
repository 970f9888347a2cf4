"""How the model check reaches people: which shipped models a configuration runs (what `chatmem
status` checks), and the demo's line, which fails `make run` when one answers otherwise."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from chatmem.adapters.embedders import ONNX_FILE, PAIR_ONNX_FILE, QUERY_ONNX_FILE
from chatmem.api.demo import _print_models
from chatmem.schemas.settings import Settings
from chatmem.schemas.status import ModelState
from chatmem.status import models_in_use


def test_the_models_checked_are_those_the_configuration_runs():
    assert models_in_use(Settings()) == [ONNX_FILE.name, QUERY_ONNX_FILE.name, PAIR_ONNX_FILE.name]
    assert models_in_use(Settings(embedding_backend="torch")) == [QUERY_ONNX_FILE.name, PAIR_ONNX_FILE.name]
    assert models_in_use(Settings(recall_query_encoder=False, segment_pair_model=False)) == [ONNX_FILE.name]
    assert models_in_use(Settings(embedding_provider="openai")) == [PAIR_ONNX_FILE.name]


def _shown(models: list[ModelState]) -> tuple[int, str]:
    out = StringIO()
    code = _print_models(Console(file=out, width=200), models)
    return code, out.getvalue()


def test_the_demo_fails_when_a_model_answers_otherwise_and_says_why():
    fine = ModelState(model="a.onnx", deviation=5e-8, problem=None)
    code, text = _shown([fine, fine])
    assert code == 0 and "models: 2 of 2 answer here as recorded" in text
    off = ModelState(model="b.onnx", deviation=0.05, problem="its outputs differ from those recorded by 0.05")
    code, text = _shown([fine, off])
    assert code == 1
    assert "model b.onnx: its outputs differ from those recorded by 0.05" in text
    assert "models: 1 of 2 answer here as recorded" in text
