"""The shipped ONNX models answer on this machine as they answered where they were made
(adapters/model_check.py). The suite runs on every machine it is installed on, so the first test
is the check itself: another CPU's kernels, another ONNX Runtime or tokenizers release, or a file
that does not match its recorded outputs fails it. The others show what the check says when a
model answers otherwise, that a pass is kept under a key of what it depends on, and that `chatmem
status` reports the models a configuration runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest

from chatmem.adapters.embedders import ONNX_FILE, PAIR_ONNX_FILE, QUERY_ONNX_FILE
from chatmem.adapters.model_check import (
    MODELS,
    REFERENCE_FILE,
    TEXT_PROBES,
    TOLERANCE,
    TOLERANCES,
    check_models,
    write_reference,
)
from tests import emulator
from tests.conftest import status_json

pytestmark = pytest.mark.integration


def _recorded() -> dict:
    return json.loads(REFERENCE_FILE.read_text(encoding="utf-8"))


def test_every_shipped_model_answers_here_as_recorded():
    checks = check_models()
    assert [c.model for c in checks] == [ONNX_FILE.name, QUERY_ONNX_FILE.name, PAIR_ONNX_FILE.name] == list(MODELS)
    assert [c.problem for c in checks] == [None, None, None]
    assert all(c.deviation is not None and c.deviation <= TOLERANCES.get(c.model, TOLERANCE) for c in checks)


def assert_as_recorded(printed: str) -> None:
    checks = json.loads(printed.splitlines()[-1])
    assert [model for model, _, _ in checks] == list(MODELS)
    assert [problem for _, _, problem in checks] == [None, None, None], checks
    assert all(deviation <= TOLERANCES.get(model, TOLERANCE) for model, deviation, _ in checks)


# Under the emulator a CPU's floating point is done in software, most slowly its fused
# multiply-adds (AVX2, FMA, NEON): on one machine here the fp32 embedder's 256-token probe alone took
# some 200 s as a Haswell. That probe checks the tokenizer's cut at 256 tokens, which no CPU
# changes and the check above makes natively; the short probes run the same kernels. So the
# emulated checks read the probes without it, against the reference's rows for them.
SHORT_CHECK = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from chatmem.adapters import model_check\n"
    "model_check.TEXT_PROBES = model_check.TEXT_PROBES[:-1]\n"
    "checks = model_check.check_models(reference=Path(sys.argv[1]))\n"
    "print(json.dumps([[c.model, c.deviation, c.problem] for c in checks]))\n"
)


def short_reference(folder) -> str:
    """The recorded reference without the long probe's row of each text model."""
    recorded = _recorded()
    assert len(TEXT_PROBES[-1].split()) > 256  # the probe left out is the one past the cut
    for name in (ONNX_FILE.name, QUERY_ONNX_FILE.name):
        recorded["models"][name]["outputs"] = recorded["models"][name]["outputs"][: len(TEXT_PROBES) - 1]
    path = folder / "reference.json"
    path.write_text(json.dumps(recorded))
    return str(path)


# The emulator's pace differs by machine (a check took 25 s on one, 300 s on another): the bound is
# the subprocess's own, with the test's a little above it so that a hang is reported as one.
@pytest.mark.emulated
@pytest.mark.timeout(960)
@pytest.mark.parametrize("cpu", [emulator.HASWELL, emulator.NEHALEM])
def test_every_shipped_model_answers_as_recorded_on_cpus_without_avx512_or_avx2(cpu, tmp_path):
    # ONNX Runtime picks its kernels (AVX-512 VNNI, AVX2, SSE) by cpuid; this machine may run only
    # the first. The check on its short probes, under an emulated Haswell (AVX2) and Nehalem (SSE4.2).
    script = [sys.executable, "-c", SHORT_CHECK, short_reference(tmp_path)]
    command, env = emulator.emulated(cpu, script)
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True, env=env)
    assert_as_recorded(done.stdout)


@pytest.mark.emulated
def test_below_x86_64_v2_numpy_stops_at_its_import_as_the_install_says():
    """The floor the preflight checks (chatmem/preflight.py, X86_64_V2) is NumPy's: under an
    emulated Core 2 its import stops; under a Nehalem, the next CPU up, everything above runs."""
    script = [sys.executable, "-c", "import numpy"]
    command, env = emulator.emulated(emulator.PENRYN, script)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0 and "X86_V2" in done.stderr, done.stderr[-2000:]
    command, env = emulator.emulated(emulator.NEHALEM, script)
    subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True)


@pytest.mark.emulated
@pytest.mark.timeout(960)
def test_every_shipped_model_answers_as_recorded_on_linux_on_arm(tmp_path):
    # Linux aarch64 is a platform chatmem runs on, where ONNX Runtime runs NEON, SVE or SME
    # kernels. Under qemu's most capable ARM (SME: the int8 query encoder moves furthest there,
    # 0.023 of its 0.05) with Debian's arm64 Python and the aarch64 wheels.
    command, env = emulator.arm_python(emulator.ARM_MAX, SHORT_CHECK, short_reference(tmp_path))
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True, env=env)
    assert_as_recorded(done.stdout)


def test_a_model_that_answers_otherwise_is_named_with_how_far_off_it_is(tmp_path):
    recorded = _recorded()
    outputs = np.asarray(recorded["models"][ONNX_FILE.name]["outputs"])
    outputs[1, 7] += 0.05  # what a wrong kernel or tokenization does to a vector, and more
    recorded["models"][ONNX_FILE.name]["outputs"] = outputs.tolist()
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(recorded))

    off, fine = check_models([ONNX_FILE.name, PAIR_ONNX_FILE.name], reference)
    assert off.model == ONNX_FILE.name and off.deviation == pytest.approx(0.05, abs=1e-4)
    assert off.problem is not None and "differ from those recorded by 0.05" in off.problem
    assert "ONNX Runtime" in off.problem and "tokenizers" in off.problem
    assert fine.model == PAIR_ONNX_FILE.name and fine.problem is None


def test_the_int8_query_encoder_may_drift_by_hundredths_and_the_fp16_models_may_not(tmp_path):
    # Run-time quantisation of its activations rounds otherwise on other kernels (0.023 seen with
    # ARM's SME kernels, emulated); the fp16-stored models compute in fp32 and move by 1e-7.
    recorded = _recorded()
    for name in (ONNX_FILE.name, QUERY_ONNX_FILE.name):
        outputs = np.asarray(recorded["models"][name]["outputs"])
        outputs[3, 11] += 0.025
        recorded["models"][name]["outputs"] = outputs.tolist()
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(recorded))

    model, query = check_models([ONNX_FILE.name, QUERY_ONNX_FILE.name], reference)
    assert query.problem is None and query.deviation == pytest.approx(0.025, abs=1e-4)
    assert model.problem is not None and "allows 0.001" in model.problem
    outputs = np.asarray(recorded["models"][QUERY_ONNX_FILE.name]["outputs"])
    outputs[3, 11] += 0.1  # a broken kernel (0.26 under a faulty emulator)
    recorded["models"][QUERY_ONNX_FILE.name]["outputs"] = outputs.tolist()
    reference.write_text(json.dumps(recorded))
    (query,) = check_models([QUERY_ONNX_FILE.name], reference)
    assert query.problem is not None and "allows 0.05" in query.problem and "hundredths" in query.problem


def test_a_reference_recorded_for_another_file_says_how_to_record_it(tmp_path):
    recorded = _recorded()
    entry = recorded["models"][QUERY_ONNX_FILE.name]
    entry["sha256"] = "0" * 64  # as after a retrain: another file, which answers otherwise
    entry["outputs"] = (np.asarray(entry["outputs"]) * 0.2).tolist()
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(recorded))

    (check,) = check_models([QUERY_ONNX_FILE.name], reference)
    assert check.problem is not None and "chatmem bench model-reference" in check.problem
    assert "differ" not in check.problem  # the reference is out of date, not the machine
    entry["outputs"] = _recorded()["models"][QUERY_ONNX_FILE.name]["outputs"]
    reference.write_text(json.dumps(recorded))
    (same,) = check_models([QUERY_ONNX_FILE.name], reference)
    assert same.problem is None  # a file that answers as recorded passes whatever its digest
    (missing,) = check_models([QUERY_ONNX_FILE.name], tmp_path / "nowhere.json")
    assert missing.problem is not None and "chatmem bench model-reference" in missing.problem


def test_a_reference_written_here_reads_back_within_its_rounding(tmp_path):
    reference = write_reference(tmp_path / "reference.json")
    assert {name: m["sha256"] for name, m in json.loads(reference.read_text(encoding="utf-8"))["models"].items()} == {
        name: m["sha256"] for name, m in _recorded()["models"].items()
    }
    checks = check_models(reference=reference)
    assert all(c.problem is None and c.deviation is not None and c.deviation <= 1e-7 for c in checks)


def test_a_pass_is_kept_and_anything_it_depends_on_runs_the_models_again(tmp_path, monkeypatch):
    reference, cache = tmp_path / "reference.json", tmp_path / "cache" / "model-check.json"
    reference.write_text(REFERENCE_FILE.read_text(encoding="utf-8"))
    runs: list[str] = []
    for name, (path, run) in list(MODELS.items()):
        monkeypatch.setitem(MODELS, name, (path, lambda p, run=run: runs.append(p.name) or run(p)))
    names = [ONNX_FILE.name, PAIR_ONNX_FILE.name]

    first = check_models(names, reference, cache)
    assert runs == names and [c.problem for c in first] == [None, None] and cache.is_file()
    assert check_models(names, reference, cache) == first and runs == names  # kept: nothing ran
    check_models([ONNX_FILE.name], reference, cache)  # another set of files: another key
    assert runs == [*names, ONNX_FILE.name]

    check_models(names, reference, cache)
    runs.clear()
    os.utime(reference, ns=(0, 0))  # a reference recorded again
    check_models(names, reference, cache)
    assert runs == names
    runs.clear()
    monkeypatch.setattr(onnxruntime, "__version__", "0.0.0")  # another ONNX Runtime release
    check_models(names, reference, cache)
    assert runs == names

    # A problem is never kept: the next look runs the models again and says it again.
    recorded = _recorded()
    entry = recorded["models"][ONNX_FILE.name]
    entry["outputs"] = (np.asarray(entry["outputs"]) + 0.01).tolist()
    reference.write_text(json.dumps(recorded))
    runs.clear()
    assert check_models(names, reference, cache)[0].problem is not None
    assert check_models(names, reference, cache)[0].problem is not None and runs == names * 2
    import archspec.cpu

    def unreadable() -> None:
        raise ValueError("no such CPU")

    runs.clear()
    reference.write_text(REFERENCE_FILE.read_text(encoding="utf-8"))
    with monkeypatch.context() as m:
        m.setattr(archspec.cpu, "host", unreadable)  # a CPU that cannot be told: nothing is kept
        check_models(names, reference, cache)
        check_models(names, reference, cache)
    assert runs == names * 2
    cache.write_text("{not json")  # damaged: the check runs
    runs.clear()
    reference.write_text(REFERENCE_FILE.read_text(encoding="utf-8"))
    assert [c.problem for c in check_models(names, reference, cache)] == [None, None] and runs == names


def test_status_reports_the_models_the_configuration_runs(settings_factory):
    shown = status_json(settings_factory())["models"]
    assert [(m["model"], m["problem"]) for m in shown] == [
        (ONNX_FILE.name, None),
        (QUERY_ONNX_FILE.name, None),
        (PAIR_ONNX_FILE.name, None),
    ]
    only_pair = status_json(settings_factory(embedding_provider="hashing", embedding_dim=384))["models"]
    assert [m["model"] for m in only_pair] == [PAIR_ONNX_FILE.name]
    none = status_json(settings_factory(embedding_provider="hashing", embedding_dim=384, segment_pair_model=False))
    assert none["models"] == []
