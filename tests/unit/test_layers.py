"""The house rules of the import graph: one namespace, and no arrow that runs upward.

Floors, from the bottom: contracts (schemas), the domain (memory), adapters, then producers and
workers side by side, the composition root (chatmem/bootstrap.py, chatmem/status.py), the
benchmarks, and the entry points (api: the CLI and the HTTP API). A module may import from its
own room or from a lower floor only. Every import is read, including those inside functions and
under TYPE_CHECKING."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = {
    "schemas": 1,
    "memory": 2,
    "adapters": 3,
    "producers": 4,
    "workers": 4,
    "chatmem": 5,  # the composition root, at the top of the package
    "bench": 6,  # benchmarks: driven by `chatmem bench ...`
    "api": 7,
}
SUBPACKAGES = [r for r in ROOMS if r != "chatmem"] + ["migrations"]


def _room(module: str) -> str | None:
    """`chatmem.adapters.x` -> 'adapters'; `chatmem.bootstrap` -> 'chatmem'; others None."""
    parts = module.split(".")
    if parts[0] != "chatmem":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "chatmem"


def _source_files() -> list[tuple[str, Path]]:
    files = []
    for room in ROOMS:
        files += [(room, p) for p in sorted((ROOT / room).rglob("*.py"))]
    return files


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_every_project_import_goes_through_the_chatmem_namespace():
    bare = {r for r in ROOMS if r != "chatmem"} | {"migrations"}
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for _, path in _source_files()
        for line, name in _imports(path)
        if name.split(".")[0] in bare
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_runs_up_a_floor_or_sideways():
    wrong = []
    for room, path in _source_files():
        for line, name in _imports(path):
            target = _room(name)
            if target is None or target == room:
                continue
            if ROOMS[target] >= ROOMS[room]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({room}, floor {ROOMS[room]}) imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_domain_imports_only_contracts_and_libraries():
    allowed_rooms = {"memory", "schemas"}
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for room, path in _source_files()
        if room == "memory"
        for line, name in _imports(path)
        if _room(name) is not None and _room(name) not in allowed_rooms
    ]
    assert not wrong, "\n".join(wrong)


def test_pyproject_maps_every_folder_into_the_namespace_and_nothing_else():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    packages, dirs = config["packages"], config["package-dir"]
    assert {p.split(".")[0] for p in packages} == {"chatmem"}, "one top-level name in site-packages"
    for folder in SUBPACKAGES:
        assert dirs[f"chatmem.{folder}"] == folder
        assert f"chatmem.{folder}" in packages
    # A subpackage folder that is not listed would be left out of a built wheel.
    for room in SUBPACKAGES:
        for init in (ROOT / room).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            name = "chatmem." + ".".join(rel.parts)
            assert name in packages or len(rel.parts) == 1, f"{rel} is not listed in pyproject packages"


@pytest.mark.parametrize("role", ["fakes"])
def test_test_doubles_do_not_ship(role):
    assert not list(ROOT.glob(f"*/{role}.py")) or all(p.parent.name == "tests" for p in ROOT.glob(f"*/{role}.py"))
