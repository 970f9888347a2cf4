"""The locale a new embedded Postgres folder is created with: the first the machine has, whatever
LANG and LC_* say, and the process's environment as it was once initdb has run."""

from __future__ import annotations

import os

import pytest

from chatmem.adapters import pglocale


def test_the_first_locale_the_machine_has_is_taken():
    assert pglocale.choose(lambda name: True) == "C.UTF-8"
    assert pglocale.choose(lambda name: name == "en_US.UTF-8") == "en_US.UTF-8"  # a system without C.UTF-8


def test_without_any_the_folder_gets_c_and_says_what_that_costs(caplog):
    assert pglocale.choose(lambda name: False) == "C"
    assert "only ASCII letters" in caplog.text


def test_the_c_library_is_asked(monkeypatch):
    assert pglocale.available("C")
    assert not pglocale.available("xx_NOWHERE.UTF-8")
    monkeypatch.setattr(pglocale.sys, "executable", "")  # an embedding host: nothing to ask
    assert not pglocale.available("C")


@pytest.mark.parametrize("before", [None, "de_DE.UTF-8"])
def test_lc_all_is_set_for_initdb_and_put_back(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("LC_ALL", raising=False)
    else:
        monkeypatch.setenv("LC_ALL", before)
    with pytest.raises(RuntimeError), pglocale.for_initdb("C.UTF-8"):
        assert os.environ["LC_ALL"] == "C.UTF-8"
        raise RuntimeError("initdb failed")
    assert os.environ.get("LC_ALL") == before


def test_a_folder_made_with_a_locale_this_machine_lacks_is_named(tmp_path):
    assert pglocale.missing(tmp_path) is None  # a new folder: initdb has not run
    (tmp_path / "postgresql.conf").write_text(
        "# lc_messages = 'commented'\nlc_messages = 'C.UTF-8'\nlc_monetary = 'de_DE.UTF-8'\nlc_time = 'C'\n"
    )
    assert pglocale.missing(tmp_path, has=lambda name: name == "C.UTF-8") == "de_DE.UTF-8"
    assert pglocale.missing(tmp_path, has=lambda name: True) is None
    asked: list[str] = []
    pglocale.missing(tmp_path, has=lambda name: asked.append(name) or True)
    assert asked == ["C.UTF-8", "de_DE.UTF-8"]  # C is always there and never asked about
