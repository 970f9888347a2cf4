"""A disk spool for events that could not reach Redis. One JSON event per line; files are
written whole (write, fsync, rename) and delivered oldest first, so order is kept."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from chatmem.adapters.procs import pid_alive
from chatmem.memory.ports import EventSink

_counter = itertools.count()


class SpoolAppender:
    """One spool file written an event at a time (the publisher's overflow path: a single
    write per event, no fsync); it becomes deliverable when closed. A process crash leaves the
    .tmp file, which pending_files() recovers once the writer is gone."""

    def __init__(self, directory: Path, name: str):
        self.final = directory / name
        self.tmp = directory / f".tmp-{os.getpid()}-{name}"
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.count = 0
        self.opened = time.monotonic()

    def append(self, payload: bytes) -> None:
        os.write(self.fd, payload + b"\n")
        self.count += 1

    def close(self) -> None:
        os.close(self.fd)
        os.replace(self.tmp, self.final)


class Spool:
    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def _name(self) -> str:
        return f"spool-{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}.jsonl"

    def write(self, payloads: Sequence[bytes]) -> Path | None:
        if not payloads:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        name = self._name()
        tmp = self.dir / f".tmp-{os.getpid()}-{name}"
        with open(tmp, "wb") as fh:
            fh.write(b"\n".join(payloads) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        final = self.dir / name
        os.replace(tmp, final)
        return final

    def appender(self) -> SpoolAppender:
        self.dir.mkdir(parents=True, exist_ok=True)
        return SpoolAppender(self.dir, self._name())

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
                        os.replace(orphan, self.dir / original)
                        files.append(self.dir / original)
                    except FileNotFoundError:
                        pass
        return sorted(files, key=lambda p: p.name)

    def pending_count(self) -> int:
        return sum(len(p.read_bytes().splitlines()) for p in self.pending_files())

    def erase(self, matches: Callable[[bytes], bool]) -> int:
        """Drop the spooled events `matches` selects (erasure): each file is claimed, rewritten
        whole without them, and put back. Returns how many were dropped."""
        dropped = 0
        for path in self.pending_files():
            claimed = path.with_name(f".claimed-{os.getpid()}-{path.name}")
            try:
                os.replace(path, claimed)
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
                os.replace(claimed, path)
            else:
                claimed.unlink()
        return dropped

    def deliver(self, sink: EventSink) -> int:
        """Send spooled events oldest first; stop at the first failure (the error propagates)."""
        sent = 0
        for path in self.pending_files():
            claimed = path.with_name(f".claimed-{os.getpid()}-{path.name}")
            try:
                os.replace(path, claimed)  # another process may be delivering it
            except FileNotFoundError:
                continue
            payloads = [line for line in claimed.read_bytes().splitlines() if line]
            try:
                sink.add_many(payloads)
            except BaseException:
                os.replace(claimed, path)
                raise
            claimed.unlink()
            sent += len(payloads)
        return sent
