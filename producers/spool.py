"""A disk spool for events that could not reach Redis. One JSON event per line; files are
written whole (write, fsync, rename) and delivered oldest first, so order is kept."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path

from memory.ports import EventSink

_counter = itertools.count()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    def __init__(self, directory: Path):
        self.dir = Path(directory)

    def write(self, payloads: Sequence[bytes]) -> Path | None:
        if not payloads:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"spool-{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}.jsonl"
        tmp = self.dir / f".tmp-{name}"
        with open(tmp, "wb") as fh:
            fh.write(b"\n".join(payloads) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        final = self.dir / name
        os.replace(tmp, final)
        return final

    def pending_files(self) -> list[Path]:
        if not self.dir.exists():
            return []
        files = list(self.dir.glob("spool-*.jsonl"))
        # A file claimed by a process that died mid-delivery is up for delivery again.
        for claimed in self.dir.glob(".claimed-*"):
            pid = int(claimed.name.split("-", 2)[1])
            if not _pid_alive(pid):
                original = self.dir / claimed.name.split("-", 2)[2]
                try:
                    os.replace(claimed, original)
                    files.append(original)
                except FileNotFoundError:
                    pass
        return sorted(files, key=lambda p: p.name)

    def pending_count(self) -> int:
        return sum(len(p.read_bytes().splitlines()) for p in self.pending_files())

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
