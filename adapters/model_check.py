"""The shipped ONNX models checked on the machine they run on: each reads fixed probes, and its
outputs are compared with those recorded where the file was made (`models/reference.json`,
written by `chatmem bench model-reference`).

ONNX Runtime picks its kernels by the CPU's instructions (AVX-512, AVX2, NEON or none), and the
tokenizer's rules come from the installed `tokenizers`. On another CPU the outputs differ in their
last bits (the int8 query encoder's by up to a few hundredths), which the tolerance allows. A
wrong kernel, tokenizer release or file gives vectors far off, and every vector stored with them
would be useless without an error anywhere. So `chatmem status` reports this check, and the suite
runs it on every machine it runs on.

A check that passed is kept in the user's cache folder under a key of everything its outcome
depends on (the files' sizes and times, the releases, the CPU and its features), so an operator who
polls `chatmem status` pays the second of running the models once per machine and release."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import platformdirs

from chatmem.adapters.boundary_pair import OnnxPairEncoder
from chatmem.adapters.embedders import (
    MODELS_DIR,
    ONNX_FILE,
    PAIR_ONNX_FILE,
    QUERY_ONNX_FILE,
    OnnxMiniLMEmbedder,
    file_sha256,
)
from chatmem.adapters.pgcheck import cpu_report

REFERENCE_FILE = MODELS_DIR / "reference.json"
CACHE_FILE = platformdirs.user_cache_path("chatmem") / "model-check.json"
# On any component of the outputs (unit vectors; the pair model's pooled vector, which its head
# reads). Other kernels moved one by at most 2e-7 here, a tokenizer cutting at 128 tokens by 0.05.
TOLERANCE = 1e-3
# The query encoder runs in int8, its activations quantised at run time, so other kernels move it
# further: emulated CPUs by up to 4e-3 (SSE4.2, NEON, SVE), and ARM's SME kernels, which quantise
# them more finely, by 0.023, nearer the fp32 encoder. Int8 itself moves the fp32 encoder's vector
# by 0.031 here at no loss of recall, and its vectors are never stored, so the bar is a broken
# kernel (0.26 under a faulty emulator). The tokenizer, which it shares, is held to 1e-3 above.
TOLERANCES = {QUERY_ONNX_FILE.name: 0.05}
TEXT_PROBES = (
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "What did Melanie paint last month?",
    "Привет! Как прошли выходные? 🙂 Мы ездили на дачу, было здорово.",
    " ".join(["The booking for two nights at the hotel near the station is confirmed."] * 30),  # past 256 tokens
)
PAIR_PROBES = (
    ("Do you have any pets? I have a cat named Luna. Oh nice, what breed?", "She's a Maine Coon, very fluffy."),
    ("I just got back from Paris. How was it? Amazing food.", "By the way, did you watch the game last night?"),
)


@dataclass(frozen=True)
class ModelCheck:
    model: str  # the file's name
    deviation: float | None  # the largest difference from the reference, when it ran
    problem: str | None  # None when the model answers as recorded


def _text_outputs(path: Path) -> np.ndarray:
    return OnnxMiniLMEmbedder(model_file=path).embed(list(TEXT_PROBES))


def _pair_outputs(path: Path) -> np.ndarray:
    encoder = OnnxPairEncoder(model_file=path)
    return np.stack([encoder.pooled(context, candidate) for context, candidate in PAIR_PROBES])


MODELS: dict[str, tuple[Path, Callable[[Path], np.ndarray]]] = {
    p.name: (p, run)
    for p, run in ((ONNX_FILE, _text_outputs), (QUERY_ONNX_FILE, _text_outputs), (PAIR_ONNX_FILE, _pair_outputs))
}


def write_reference(out: Path = REFERENCE_FILE) -> Path:
    """Record every shipped model's outputs on the probes, with the file's sha256 and this machine."""
    import onnxruntime
    import tokenizers

    models = {
        name: {"sha256": file_sha256(path), "outputs": np.round(run(path).astype(np.float64), 7).tolist()}
        for name, (path, run) in MODELS.items()
    }
    out.write_text(
        json.dumps(
            {
                "written": datetime.now(UTC).date().isoformat(),
                "machine": cpu_report().describe(),
                "onnxruntime": onnxruntime.__version__,
                "tokenizers": tokenizers.__version__,
                "models": models,
            },
            separators=(",", ":"),
        )
        + "\n",
        encoding="utf-8",
    )
    return out


def check_models(
    names: Sequence[str] | None = None, reference: Path = REFERENCE_FILE, cache: Path | None = None
) -> list[ModelCheck]:
    """The shipped models `names` (default: all) run on the probes here against the reference;
    a problem in words. With `cache`, a check that passed here before under the same key is not
    run again."""
    chosen = {n: MODELS[n] for n in (MODELS if names is None else names)}
    if not reference.is_file():
        return [ModelCheck(n, None, f"{reference} is missing: `chatmem bench model-reference`") for n in chosen]
    key = _cache_key([path for path, _ in chosen.values()], reference) if cache is not None else None
    if cache is not None and key is not None and (kept := _read_cache(cache, key)) is not None:
        return kept
    recorded = json.loads(reference.read_text(encoding="utf-8"))
    checks = [_check(name, path, run, recorded) for name, (path, run) in chosen.items()]
    if cache is not None and key is not None and all(c.problem is None for c in checks):
        _write_cache(cache, key, checks)  # only a pass: a problem is looked at again each time
    return checks


def _cache_key(files: list[Path], reference: Path) -> str | None:
    """What the outcome depends on; None when the CPU cannot be told (then nothing is kept). A
    file's size and time stand for its bytes: reading them would cost as much as the check."""
    import archspec.cpu
    import onnxruntime
    import tokenizers

    try:
        host = archspec.cpu.host()  # ONNX Runtime picks its kernels by these features
    except Exception:  # noqa: BLE001 - a CPU archspec cannot read: no cache, the check runs
        return None
    parts = {
        "files": [[str(f), *((st.st_size, st.st_mtime_ns) if (st := _stat(f)) else ())] for f in [*files, reference]],
        "cpu": [platform.machine(), host.name, sorted(host.features)],
        "releases": [onnxruntime.__version__, tokenizers.__version__, np.__version__, platform.python_version()],
        "tolerance": [TOLERANCE, TOLERANCES],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _read_cache(cache: Path, key: str) -> list[ModelCheck] | None:
    try:
        kept = json.loads(cache.read_text(encoding="utf-8"))
        if kept.get("key") != key:
            return None
        return [ModelCheck(c["model"], c["deviation"], None) for c in kept["checks"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None  # none yet, or not ours: the check runs


def _write_cache(cache: Path, key: str, checks: list[ModelCheck]) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        kept = [{"model": c.model, "deviation": c.deviation} for c in checks]
        tmp.write_text(json.dumps({"key": key, "checks": kept}), encoding="utf-8")
        tmp.replace(cache)  # atomic: two `chatmem status` at once never read half a file
    except OSError:
        pass  # a read-only home: the check runs each time, as without a cache


def _check(name: str, path: Path, run: Callable[[Path], np.ndarray], recorded: dict) -> ModelCheck:
    entry = recorded["models"].get(name)
    if not path.is_file():
        return ModelCheck(name, None, f"{path} is missing from the package")
    again = "the reference was recorded for another file: run `chatmem bench model-reference`"
    if entry is None:
        return ModelCheck(name, None, again)
    try:
        deviation = float(np.abs(run(path) - np.asarray(entry["outputs"])).max())
    except Exception as error:  # noqa: BLE001 - the report says why the model could not run
        return ModelCheck(name, None, f"it does not run here: {type(error).__name__}: {error}")
    allowed = TOLERANCES.get(name, TOLERANCE)
    if deviation <= allowed:
        return ModelCheck(name, deviation, None)
    # Only now the file's digest (a second on a slow disk for the three files): a retrained file
    # answers otherwise too, and then it is the reference that is out of date, not the machine.
    if entry["sha256"] != file_sha256(path):
        return ModelCheck(name, deviation, again)
    import onnxruntime
    import tokenizers

    usual = "up to a few hundredths" if name in TOLERANCES else "about 1e-7"
    return ModelCheck(
        name,
        deviation,
        f"its outputs differ from those recorded by {deviation:.3g} (the check allows {allowed}; other kernels "
        f"move them by {usual}), with ONNX Runtime {onnxruntime.__version__} and tokenizers "
        f"{tokenizers.__version__} here against {recorded.get('onnxruntime')} and {recorded.get('tokenizers')} "
        "where it was recorded: vectors written here would not match those written elsewhere (docs/platforms.md)",
    )
