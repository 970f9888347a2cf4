"""Can this Postgres hold our vectors? Checked before anything touches a vector.

Two checks. The CPU check runs before the embedded server starts: the package's pgvector executes
x86-64-v3 instructions (AVX2, FMA, ...; SVE on Linux ARM) without a runtime switch, so a CPU
without them would kill the backend on the first vector ("signal 4: Illegal instruction"). Such a
CPU gets a pgvector compiled for it instead (adapters/pgvector_build.py). The self-check runs a
vector round trip (array cast, `<=>`, an HNSW probe) in a transaction that is rolled back,
against the embedded server or any configured one, and turns every way it can fail (backend
crash, extension missing or too old, Postgres too old) into one message naming the cause and
what to do."""

from __future__ import annotations

import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from chatmem.adapters.sql import one, scalar

MIN_SERVER_VERSION_NUM = 160000  # Postgres 16
MIN_VECTOR_VERSION = (0, 8, 0)  # iterative index scans, which the read path uses

# What the shipped pgvector build runs unconditionally on x86-64: x86-64-v3, in /proc/cpuinfo's
# names. tests/unit/test_platform.py reads the library's machine code to keep this list true.
EMBEDDED_X86_FEATURES = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm", "popcnt"})
# On Linux aarch64 the wheel's pgvector was built for the machine that built it (-march=native on an
# SVE machine): its code uses SVE throughout, and the first vector query killed the backend
# (SIGILL) on every emulated ARM without it, Neoverse-N1 (AWS Graviton 2, Ampere Altra),
# Cortex-A76 (Raspberry Pi 5) and A72 (Pi 4) among them; on Neoverse-V1 (Graviton 3) it answered
# as on x86 (docs/platforms.md). The macOS wheel is another build, for Apple's cores, which have no SVE.
EMBEDDED_ARM_FEATURES = frozenset({"sve"})
_NEEDS = {
    "x86_64": "x86-64-v3 instructions",
    "aarch64": "SVE, ARM's scalable vectors (Neoverse V1, AWS Graviton 3, or newer; Graviton 2, Ampere Altra, "
    "Raspberry Pi and Linux on Apple silicon lack them)",
}
_FOR_EXAMPLE = {"x86_64": "AVX-512", "aarch64": "SVE"}

WHAT_TO_DO = (
    "Point CHATMEM_DATABASE_URL at a Postgres 16+ with pgvector 0.8+ (any server, or the "
    "pgvector/pgvector image in infra/docker-compose.yml); see docs/platforms.md."
)

# Dimension of the probe vectors: long enough to reach the unrolled SIMD loops.
_PROBE_DIM = 384

SIGNAL_NAMES = {4: "Illegal instruction", 6: "Aborted", 7: "Bus error", 8: "Floating point exception",
                9: "Killed", 11: "Segmentation fault"}  # fmt: skip


class VectorSupportError(RuntimeError):
    """This Postgres cannot serve chatmem's vectors; the message says why and what to do."""


@dataclass(frozen=True)
class CpuReport:
    arch: str
    name: str  # microarchitecture as archspec names it, e.g. "zen3", "haswell"
    missing: frozenset[str]  # features the embedded pgvector needs that this CPU lacks
    avx512: bool = False  # pgvector picks its AVX-512 functions at run time; benches print it

    def describe(self) -> str:
        return f"{self.name} ({self.arch})"


def cpu_report() -> CpuReport:
    arch = platform.machine().lower()
    linux_arm = arch in ("aarch64", "arm64") and platform.system() == "Linux"
    if arch not in ("x86_64", "amd64") and not linux_arm:
        return CpuReport(arch, arch, frozenset())
    import archspec.cpu

    host = archspec.cpu.host()
    features = set(host.features)
    if linux_arm:
        # The kernel's own list: archspec names only the cores it knows, and gives an unknown one
        # (or one qemu emulates) no features at all.
        return CpuReport("aarch64", host.name, frozenset(EMBEDDED_ARM_FEATURES - _kernel_features()))
    return CpuReport("x86_64", host.name, frozenset(EMBEDDED_X86_FEATURES - features), "avx512f" in features)


def _kernel_features(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The features Linux lists for the first CPU (on ARM its "Features" line). chatmem/preflight.py
    reads the same before the install, where nothing of chatmem's may be imported (a floor above)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("features", "flags"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def check_cpu_for_embedded(report: CpuReport | None = None) -> None:
    report = report or cpu_report()
    if report.missing:
        raise VectorSupportError(
            f"The embedded Postgres cannot run on this CPU ({report.describe()}): its pgvector needs "
            f"{_NEEDS.get(report.arch, 'instructions')}, and this CPU lacks {', '.join(sorted(report.missing))}. "
            "Nothing was started. Unset CHATMEM_EMBEDDED_PGVECTOR (or set it to auto) to compile pgvector here "
            f"once (a C compiler and make are needed), or: {WHAT_TO_DO} If a virtual machine hides flags the CPU "
            "really has, set CHATMEM_EMBEDDED_SKIP_CPU_CHECK=true: the vector self-check still runs."
        )


@dataclass(frozen=True)
class VectorCheck:
    server_version: str  # e.g. "18.4"
    vector_version: str  # the version a query runs with (installed, else the one CREATE EXTENSION gives)


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def diagnose_versions(server_version_num: int, available: str | None, installed: str | None) -> str | None:
    """What is wrong with these versions, in words, or None. Pure: unit-tested."""
    if server_version_num < MIN_SERVER_VERSION_NUM:
        major = server_version_num // 10000
        return f"Postgres {major} is too old: chatmem needs Postgres 16 or newer."
    want = ".".join(map(str, MIN_VECTOR_VERSION))
    if available is None and installed is None:
        return f"the pgvector extension is not installed on this server: chatmem needs pgvector {want} or newer."
    best = max((v for v in (available, installed) if v), key=parse_version)
    if parse_version(best) < MIN_VECTOR_VERSION:
        return f"pgvector {best} is too old: chatmem needs pgvector {want} or newer (iterative index scans)."
    return None


_PROBE = f"""
CREATE TEMP TABLE chatmem_selfcheck (id int, v vector({_PROBE_DIM})) ON COMMIT DROP;
INSERT INTO chatmem_selfcheck
    SELECT i, ARRAY(SELECT sin(i * d) FROM generate_series(1, {_PROBE_DIM}) d)::vector({_PROBE_DIM})
    FROM generate_series(1, 8) i;
CREATE INDEX ON chatmem_selfcheck USING hnsw (v vector_cosine_ops);
SET LOCAL enable_seqscan = off;
SET LOCAL hnsw.iterative_scan = relaxed_order;
"""
_PROBE_QUERY = """
SELECT id, v <=> (SELECT v FROM chatmem_selfcheck WHERE id = 3) AS d
FROM chatmem_selfcheck ORDER BY v <=> (SELECT v FROM chatmem_selfcheck WHERE id = 3) LIMIT 1
"""


def self_check(
    url: str, *, server_log: Path | None = None, probe: str = _PROBE, recovery_timeout: float = 60
) -> VectorCheck:
    """Run the vector round trip in a rolled-back transaction; raise VectorSupportError with the
    cause when it cannot run. `server_log` (the embedded server's) lets a crash be named."""
    log_offset = server_log.stat().st_size if server_log and server_log.exists() else 0
    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.OperationalError as error:
        raise VectorSupportError(f"cannot connect to Postgres for the vector self-check: {error}") from None
    with conn:
        num = int(scalar(conn, "SHOW server_version_num"))
        server_version = scalar(conn, "SHOW server_version").split()[0]
        row = conn.execute(
            "SELECT default_version, installed_version FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
        available, installed = (row[0], row[1]) if row else (None, None)
        problem = diagnose_versions(num, available, installed)
        if problem:
            raise VectorSupportError(f"{problem} {WHAT_TO_DO}")
        try:
            if installed is None:
                conn.execute("CREATE EXTENSION vector")  # rolled back below: only to probe
            conn.execute(probe)
            found, distance = one(conn, _PROBE_QUERY)
            version = scalar(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            conn.rollback()
        except psycopg.errors.InsufficientPrivilege:
            raise VectorSupportError(
                "pgvector is on the server but not installed in this database, and this role may not "
                "install it: run `CREATE EXTENSION vector` there as a superuser."
            ) from None
        except psycopg.OperationalError as error:
            if not conn.broken:
                raise
            raise VectorSupportError(_crash_message(url, server_log, log_offset, error, recovery_timeout)) from None
    if found != 3 or abs(distance) > 1e-6:
        raise VectorSupportError(
            f"pgvector on this server returned a wrong answer in the self-check (nearest {found}, distance "
            f"{distance}; expected 3 and 0). {WHAT_TO_DO}"
        )
    return VectorCheck(server_version, version)


def _crash_message(url: str, server_log: Path | None, offset: int, error: Exception, timeout: float) -> str:
    recovered = wait_until_ready(url, timeout, server_log, offset)
    signal = _crash_signal(server_log, offset) if server_log else None
    cpu = cpu_report()
    if signal is not None:
        cause = f"the Postgres backend was killed by signal {signal} ({SIGNAL_NAMES.get(signal, 'unknown')})"
    else:
        cause = f"the connection to Postgres broke ({str(error).strip().splitlines()[0]})"
    text = f"The vector self-check failed: {cause} while running pgvector. Nothing was written. "
    if signal == 4 or signal is None:
        text += (
            f"The usual cause is a pgvector built for CPU instructions this CPU ({cpu.describe()}) lacks, "
            f"for example {_FOR_EXAMPLE.get(cpu.arch, 'AVX-512')}: for the embedded server, "
            "CHATMEM_EMBEDDED_PGVECTOR=build compiles one for this CPU. "
        )
    if not recovered:
        text += "The server had not finished recovering when this check gave up. "
    return text + WHAT_TO_DO


def _crash_signal(server_log: Path, offset: int) -> int | None:
    """The signal a backend died of, from the lines the server logged since `offset`."""
    match = re.search(r"terminated by signal (\d+)", log_since(server_log, offset) or "")
    return int(match.group(1)) if match else None


def log_since(server_log: Path, offset: int) -> str | None:
    """What the server logged after byte `offset` of its log; None when the log cannot be read."""
    try:
        with server_log.open("rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


# What the postmaster logs once it has seen a backend die, and once it is ready again after the
# reset and the recovery that follow.
_CRASH_SEEN = re.compile(r"terminated by signal|exited with exit code|all server processes terminated")
_READY_AGAIN = "database system is ready to accept connections"
CRASH_SEEN_WAIT = 5.0  # seconds: a postmaster reaps a dead backend at once; past this the log says nothing


def recovery_logged(tail: str) -> bool | None:
    """From the server's lines since before a crash: True when it logged the crash and then that
    it is ready again, False when only the crash so far, None when not even the crash."""
    crash = _CRASH_SEEN.search(tail)
    if crash is None:
        return None
    return _READY_AGAIN in tail[crash.end() :]


def wait_until_ready(url: str, timeout: float, server_log: Path | None = None, offset: int = 0) -> bool:
    """After a backend crash Postgres resets every session and recovers: wait until it answers
    again, so the next command meets a working server instead of 'in recovery mode'. A connection
    may still reach the server in the moment before the postmaster has seen the crash, so with the
    server's log the wait first reads there that the reset is over."""
    started = time.monotonic()
    deadline = started + timeout
    while server_log is not None and time.monotonic() < deadline:
        state = recovery_logged(log_since(server_log, offset) or "")
        if state or (state is None and time.monotonic() - started > CRASH_SEEN_WAIT):
            break  # recovered, or a log that does not tell (then the connections must)
        time.sleep(0.1)
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                if not scalar(conn, "SELECT pg_is_in_recovery()"):
                    return True
        except psycopg.OperationalError:
            pass
        time.sleep(0.2)
    return False
