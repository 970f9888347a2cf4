"""The pgvector chatmem compiles for CPUs the package's build does not run on: when it is used,
the release it pins, the server setting that loads it, and the ways a build is refused."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from chatmem.adapters import pgvector_build, services
from chatmem.adapters.pgvector_build import SOURCE, BuildError, Source
from chatmem.schemas.settings import Settings


def _package() -> Path:
    return services._bin_paths()[18].parent


@pytest.mark.parametrize(
    ("choice", "missing", "expected"),
    [
        ("auto", frozenset(), False),
        ("auto", frozenset({"sve"}), True),
        ("auto", frozenset({"avx2", "fma"}), True),
        ("package", frozenset({"sve"}), False),  # the CPU check then refuses, as before
        ("build", frozenset(), True),
    ],
)
def test_a_build_is_used_where_the_package_cannot_run_or_where_it_is_asked_for(choice, missing, expected):
    assert pgvector_build.wanted(choice, missing) is expected


def test_an_unknown_choice_is_named():
    with pytest.raises(ValueError, match="auto, package, build"):
        pgvector_build.wanted("native", frozenset())


def test_the_pinned_source_is_the_release_the_package_ships():
    """The package's control and SQL files serve the library built here: a newer package with
    another pgvector release needs the pin to follow (a Debian pool URL and its hash)."""
    assert pgvector_build.package_version(_package() / "share" / "postgresql" / "extension") == SOURCE.version
    assert SOURCE.url.endswith(f"pgvector_{SOURCE.version}.orig.tar.gz")


def test_the_setting_puts_the_built_library_first_and_quotes_the_path():
    line = pgvector_build.conf_line(Path("/srv/it's/pgvector/0.8.5"))
    assert line == "dynamic_library_path = '/srv/it''s/pgvector/0.8.5:$libdir'\n"
    with pytest.raises(BuildError, match="colon"):
        pgvector_build.conf_line(Path("/srv/a:b"))


def test_status_names_the_folder_searched_before_the_server_s_own():
    folder = "/data/pgvector/0.8.5-pg18.4-aarch64"
    assert pgvector_build.loaded_from(f"{folder}:$libdir") == folder
    assert pgvector_build.loaded_from("$libdir") is None
    assert pgvector_build.loaded_from("") is None


def test_settings_reach_the_embedded_server(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATMEM_EMBEDDED_PGVECTOR", "build")
    monkeypatch.setenv("CHATMEM_EMBEDDED_PGVECTOR_SOURCE", "/mirror/pgvector.tar.gz")
    pg, _ = services.embedded(Settings(data_dir=tmp_path, _env_file=None))
    assert pg.pgvector == "build"
    assert pg.pgvector_source == Source(SOURCE.version, "/mirror/pgvector.tar.gz", SOURCE.sha256)
    monkeypatch.setenv("CHATMEM_EMBEDDED_PGVECTOR", "native")
    with pytest.raises(ValueError, match="auto"):
        Settings(data_dir=tmp_path, _env_file=None)


def _ensure(root: Path, source: Source = SOURCE, **kwargs) -> Path:
    package = _package()
    return pgvector_build.ensure(
        package / "bin" / "pg_config", root, source, extension_dir=package / "share/postgresql/extension", **kwargs
    )


def test_another_release_than_the_package_ships_is_refused_before_anything_is_fetched(tmp_path):
    with pytest.raises(BuildError, match=r"ships pgvector 0\.8\.5, and chatmem builds 0\.9\.0"):
        _ensure(tmp_path / "lib", Source("0.9.0", "https://example.invalid/never-fetched.tar.gz", "0" * 64))
    assert not (tmp_path / "lib").exists()


def test_a_source_that_is_not_the_pinned_file_is_not_built(tmp_path):
    other = tmp_path / "pgvector.tar.gz"
    with tarfile.open(other, "w:gz") as tar:
        info = tarfile.TarInfo("pgvector-0.8.5/Makefile")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"all:\n\n"))
    with pytest.raises(BuildError, match="not the pinned 66bbef55") as error:
        _ensure(tmp_path / "lib", pgvector_build.source(str(other)))
    assert "nothing was built" in str(error.value)
    assert list((tmp_path / "lib").iterdir()) == []  # the work folder went with the error


def test_a_missing_source_file_says_how_to_bring_one(tmp_path):
    with pytest.raises(BuildError, match="without internet.*CHATMEM_EMBEDDED_PGVECTOR_SOURCE"):
        _ensure(tmp_path / "lib", pgvector_build.source(str(tmp_path / "absent.tar.gz")))


def test_a_data_folder_whose_path_the_setting_cannot_hold_is_refused_before_a_build(tmp_path):
    with pytest.raises(BuildError, match="colon"):
        _ensure(tmp_path / "a:b" / "lib")
    assert not (tmp_path / "a:b").exists()


def test_a_machine_without_a_compiler_is_told_what_to_install(tmp_path):
    with pytest.raises(BuildError, match=r"no C compiler on PATH.*apt install gcc make"):
        _ensure(tmp_path / "lib", cc="no-such-compiler-here")
