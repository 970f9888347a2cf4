"""A disk spool for events that could not reach Redis. One JSON event per line; files are
written whole (write, fsync, rename) and delivered oldest first, so order is kept.

The spool has a size limit (`max_bytes`, CHATMEM_SPOOL_MAX_BYTES). When it is full, what is
already spooled is kept and new events are refused: they are not stored anywhere, the caller is
not blocked, and the refusals are counted in a small file next to the spool (`refused`, read by
`chatmem status` and /metrics) and logged without content (docs/operations.md, fault matrix).

The spool's folder and files are its user's alone (0700, 0600): they hold events in clear."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from chatmem.adapters.procs import pid_alive
from chatmem.memory.ports import EventSink

log = logging.getLogger(__name__)

_counter = itertools.count()
RENAME_LOCK = ".renaming"  # held while a file changes its name, and while the folder is listed
REFUSED_FILE = "refused"  # {"events": n, "last_at": unix time}: events refused because the spool was full
_SPOOL_PREFIXES = ("spool-", ".tmp-", ".claimed-")
_LOG_EVERY_S = 10.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class SpoolAppender:
    """One spool file written an event at a time (the publisher's overflow path: a single
    write per event, no fsync); it becomes deliverable when closed. A process crash leaves the
    .tmp file, which pending_files() recovers once the writer is gone."""

    def __init__(self, spool: Spool, name: str):
        self.spool = spool
        self.final = spool.dir / name
        self.tmp = spool.dir / f".tmp-{os.getpid()}-{name}"
        # The room left when the episode starts: one directory scan, not one per event.
        self.budget = None if spool.max_bytes is None else max(0, spool.max_bytes - spool.used_bytes())
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.count = 0
        self.written = 0
        self.refused = 0
        self.opened = time.monotonic()

    def append(self, payload: bytes) -> bool:
        """False when the spool is full: the event is refused (counted when the file is closed)."""
        self.count += 1
        line = payload + b"\n"
        if self.budget is not None and self.written + len(line) > self.budget:
            self.refused += 1
            return False
        try:
            written = os.write(self.fd, line)
        except OSError as error:
            if error.errno not in _DISK_FULL:
                raise
            written = 0
        if written < len(line):  # the disk is full: no more appends, the torn line is cut off
            os.ftruncate(self.fd, self.written)
            self.budget = self.written
            self.refused += 1
            return False
        self.written += len(line)
        return True

    def close(self) -> None:
        os.close(self.fd)
        if self.written:
            self.spool.rename(self.tmp, self.final)
        else:
            self.tmp.unlink(missing_ok=True)
        if self.refused:
            self.spool.refuse(self.refused)


class Spool:
    def __init__(self, directory: Path, max_bytes: int | None = None):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self._logged_at = -_LOG_EVERY_S
        self._unlogged = 0

    def _name(self) -> str:
        return f"spool-{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}.jsonl"

    def write(self, payloads: Sequence[bytes]) -> Path | None:
        """Spool the payloads, in one file. When they do not all fit under the limit, the
        longest prefix that fits is written and the rest is refused (counted, not stored)."""
        if not payloads:
            return None
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        refused = 0
        if self.max_bytes is not None:
            room = self.max_bytes - self.used_bytes()
            fits = 0
            for payload in payloads:
                room -= len(payload) + 1
                if room < 0:
                    break
                fits += 1
            refused, payloads = len(payloads) - fits, payloads[:fits]
        if not payloads:
            self.refuse(refused)
            return None
        name = self._name()
        tmp = self.dir / f".tmp-{os.getpid()}-{name}"
        try:
            with open(tmp, "wb", opener=_private) as fh:
                fh.write(b"\n".join(payloads) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as error:
            if error.errno not in _DISK_FULL:
                raise
            tmp.unlink(missing_ok=True)  # the disk filled before the limit did: refused as well
            self.refuse(refused + len(payloads))
            return None
        final = self.dir / name
        self.rename(tmp, final)
        if refused:
            self.refuse(refused)
        return final

    def fits(self, payloads: Sequence[bytes]) -> bool:
        """True when all of these would be spooled now."""
        if self.max_bytes is None:
            return True
        return self.used_bytes() + sum(len(p) + 1 for p in payloads) <= self.max_bytes

    def appender(self) -> SpoolAppender:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return SpoolAppender(self, self._name())

    def used_bytes(self) -> int:
        """What the spool holds on disk: files waiting, being written and being delivered."""
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return 0
        used = 0
        for entry in entries:
            if entry.name.startswith(_SPOOL_PREFIXES):
                try:
                    used += entry.stat().st_size
                except FileNotFoundError:
                    pass  # delivered meanwhile
        return used

    def refuse(self, n: int) -> None:
        """Count `n` events refused because the spool is full, and say so in the log (no content;
        at most one line every 10 s per writer, with the running total)."""
        try:
            total = self._count_refused(n)
        except OSError as error:  # a full disk may not take the counter either: the log still says it
            log.error("spool: could not record %d refused events in %s: %s", n, self.dir / REFUSED_FILE, error)
            total = -1
        self._unlogged += n
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            log.error(
                "spool full (%d bytes used, limit %d, CHATMEM_SPOOL_MAX_BYTES): %d new events refused and not "
                "stored, %d refused in total; the events already spooled are kept and delivered when Redis answers",
                self.used_bytes(),
                self.max_bytes or 0,
                self._unlogged,
                total,
            )
            self._logged_at, self._unlogged = now, 0

    def _count_refused(self, n: int) -> int:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.dir / REFUSED_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the bot and its flusher may both refuse
            total = _refused_events(os.pread(fd, 4096, 0)) + n
            data = json.dumps({"events": total, "last_at": time.time()}).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return total
        finally:
            os.close(fd)

    def refused_count(self) -> int:
        """Events refused since the spool folder was made (a counter: it only grows)."""
        try:
            return _refused_events((self.dir / REFUSED_FILE).read_bytes())
        except FileNotFoundError:
            return 0

    def pending_files(self) -> list[Path]:
        if not self.dir.exists():
            return []
        files = list(self.dir.glob("spool-*.jsonl"))
        # Files of a process that died while writing or delivering them are up for delivery.
        for prefix in (".claimed-", ".tmp-"):
            for orphan in self.dir.glob(prefix + "*"):
                _, pid, original = orphan.name.split("-", 2)
                if not pid_alive(int(pid)):
                    try:
                        self.rename(orphan, self.dir / original)
                        files.append(self.dir / original)
                    except FileNotFoundError:
                        pass
        return sorted(files, key=lambda p: p.name)

    def holds_events(self) -> bool:
        """Events are on disk: waiting, or in a file a process is writing or delivering (a failed
        delivery puts its file back). One listing, taken while no file is being renamed, so a file
        between two names is not missed."""
        if not self.dir.exists():
            return False
        with self._renaming():
            names = os.listdir(self.dir)
        return any(n.startswith(_SPOOL_PREFIXES) for n in names)

    def rename(self, src: Path, dst: Path) -> None:
        with self._renaming():
            os.replace(src, dst)

    @contextmanager
    def _renaming(self) -> Iterator[None]:
        fd = os.open(self.dir / RENAME_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the bot and its flusher rename in one folder
            yield
        finally:
            os.close(fd)

    def pending_count(self) -> int:
        return sum(len(p.read_bytes().splitlines()) for p in self.pending_files())

    def erase(self, matches: Callable[[bytes], bool]) -> int:
        """Drop the spooled events `matches` selects (erasure): each file is claimed, rewritten
        whole without them, and put back. Returns how many were dropped."""
        dropped = 0
        for path in self.pending_files():
            claimed = path.with_name(f".claimed-{os.getpid()}-{path.name}")
            try:
                self.rename(path, claimed)
            except FileNotFoundError:
                continue
            lines = [line for line in claimed.read_bytes().splitlines() if line]
            kept = [line for line in lines if not matches(line)]
            dropped += len(lines) - len(kept)
            if kept and len(kept) < len(lines):
                with open(claimed, "wb") as fh:
                    fh.write(b"\n".join(kept) + b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
            if kept:
                self.rename(claimed, path)
            else:
                claimed.unlink()
        return dropped

    def deliver(self, sink: EventSink) -> int:
        """Send spooled events oldest first; stop at the first failure (the error propagates)."""
        sent = 0
        for path in self.pending_files():
            claimed = path.with_name(f".claimed-{os.getpid()}-{path.name}")
            try:
                self.rename(path, claimed)  # another process may be delivering it
            except FileNotFoundError:
                continue
            payloads = [line for line in claimed.read_bytes().splitlines() if line]
            try:
                sink.add_many(payloads)
            except BaseException:
                self.rename(claimed, path)
                raise
            claimed.unlink()
            sent += len(payloads)
        return sent


def _refused_events(raw: bytes) -> int:
    if not raw.strip():
        return 0
    return int(json.loads(raw)["events"])
