"""Runs the whole pipeline in the foreground for `chatmem up` and the demo: the ingest
consumer, a Celery worker for every queue and the sweeper, each its own process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from chatmem.schemas.queues import Queue

log = logging.getLogger(__name__)

# The same commands compose runs, one process each.
# Attachments get a worker of their own: OCR takes about a second per image, and messages must
# never queue behind it.
DEFAULT_PROCESSES: tuple[tuple[str, ...], ...] = (
    ("ingest",),
    ("worker", "--queues", ",".join(q.value for q in Queue if q is not Queue.ATTACHMENTS)),
    ("worker", "--queues", Queue.ATTACHMENTS.value, "--concurrency", "1"),
    ("sweeper",),
)
# `chatmem up` serves the HTTP read path too.
UP_PROCESSES: tuple[tuple[str, ...], ...] = (*DEFAULT_PROCESSES, ("api",))


class Supervisor:
    def __init__(self, commands: Sequence[Sequence[str]] = DEFAULT_PROCESSES, env: dict[str, str] | None = None):
        self.commands = [list(c) for c in commands]
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        for cmd in self.commands:
            argv = [sys.executable, "-m", "chatmem.api.cli", *cmd]
            # Own process group: a Ctrl-C reaches us once and we stop the children in order.
            self.procs.append(subprocess.Popen(argv, env=self.env, start_new_session=True))
            log.info("started %s (pid %d)", " ".join(cmd), self.procs[-1].pid)

    def failed(self) -> list[str]:
        return [" ".join(cmd) for cmd, p in zip(self.commands, self.procs, strict=True) if p.poll() not in (None, 0)]

    def wait(self) -> int:
        """Block until a child exits or we are interrupted (SIGINT or SIGTERM); then stop the rest."""
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a service manager, `kill`) must stop the children too, and SIGINT may be
            # ignored when started in the background: both interrupt the wait.
            signal.signal(signal.SIGTERM, _interrupt)
            signal.signal(signal.SIGINT, _interrupt)
        try:
            while all(p.poll() is None for p in self.procs):
                time.sleep(0.2)
            bad = self.failed()
            if bad:
                log.error("stopped because a process failed: %s", ", ".join(bad))
                return 1
            return 0
        except KeyboardInterrupt:
            return 0
        finally:
            self.stop()

    def stop(self, timeout: float = 20.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not stop in time; killing it", p.pid)
                p.kill()
                p.wait()
        self.procs.clear()

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
