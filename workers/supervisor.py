"""Runs the whole pipeline in the foreground for `chatmem up` and the demo: the ingest
consumer, a Celery worker for every queue and the sweeper, each its own process.

A child that exits is started again after an exponential backoff; a child that keeps failing
(`max_restarts` exits within `window_s`) stops the stack with a message saying which one and
how often. The state of every child is written to a small JSON file that `chatmem status`
reads. SIGTERM or Ctrl-C stops everything."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chatmem.schemas.queues import Queue
from chatmem.schemas.status import ProcessState

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


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential backoff (`base_s`, doubling, at most `max_delay_s`); give up after
    `max_restarts` exits within `window_s`."""

    max_restarts: int = 5
    window_s: float = 300.0
    base_s: float = 1.0
    max_delay_s: float = 30.0

    def delay(self, exits: Sequence[float], now: float) -> float | None:
        """Seconds to wait before the next start, given the times of past exits (this one
        included); None when the child keeps failing."""
        recent = [t for t in exits if now - t <= self.window_s]
        if len(recent) > self.max_restarts:
            return None
        return min(self.max_delay_s, self.base_s * 2 ** (len(recent) - 1))


@dataclass
class _Child:
    command: list[str]
    proc: subprocess.Popen | None = None
    state: str = "starting"  # up | restarting | failed | stopped
    restarts: int = 0
    exits: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    start_at: float = 0.0
    last_exit: int | None = None

    @property
    def name(self) -> str:
        return " ".join(self.command)


class GaveUp(RuntimeError):
    """A child kept failing; the message says which one and how often."""


class Supervisor:
    def __init__(
        self,
        commands: Sequence[Sequence[str]] = DEFAULT_PROCESSES,
        env: dict[str, str] | None = None,
        *,
        policy: RestartPolicy | None = None,
        state_file: Path | None = None,
        argv: Callable[[list[str]], list[str]] | None = None,
        output: Path | None = None,
    ):
        self.children = [_Child(list(c)) for c in commands]
        self.env = {**os.environ, **(env or {})}
        self.policy = policy or RestartPolicy()
        self.state_file = state_file
        self._argv = argv or (lambda cmd: [sys.executable, "-m", "chatmem.api.cli", *cmd])
        self.gave_up: str | None = None
        self.output = output  # the children's stdout and stderr (default: ours)

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [c.proc for c in self.children if c.proc is not None]

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)
        self._write_state()

    def _spawn(self, child: _Child) -> None:
        # Own process group: a Ctrl-C reaches us once and we stop the children in order.
        out = open(self.output, "ab") if self.output else None  # noqa: SIM115 - the child owns it
        try:
            child.proc = subprocess.Popen(
                self._argv(child.command), env=self.env, start_new_session=True, stdout=out, stderr=out
            )
        finally:
            if out is not None:
                out.close()
        child.state = "up"
        log.info("started %s (pid %d)", child.name, child.proc.pid)

    def failed(self) -> list[str]:
        """Children that exited with an error and are not running now."""
        return [c.name for c in self.children if c.state in ("restarting", "failed") and c.last_exit not in (None, 0)]

    def states(self) -> list[ProcessState]:
        return [
            ProcessState(
                command=c.name,
                state=c.state,
                pid=c.proc.pid if c.proc is not None and c.state == "up" else None,
                restarts=c.restarts,
                last_exit=c.last_exit,
            )
            for c in self.children
        ]

    def check(self, now: float | None = None) -> None:
        """One supervision step: note exits, start again the children whose backoff is over.
        Raises GaveUp when a child keeps failing."""
        now = time.monotonic() if now is None else now
        changed = False
        for child in self.children:
            if child.state == "up" and child.proc is not None and child.proc.poll() is not None:
                child.last_exit = child.proc.returncode
                child.exits.append(now)
                delay = self.policy.delay(child.exits, now)
                changed = True
                if delay is None:
                    child.state = "failed"
                    recent = sum(1 for t in child.exits if now - t <= self.policy.window_s)
                    self.gave_up = (
                        f"{child.name} kept failing: {recent} exits within {self.policy.window_s:.0f} s "
                        f"(last exit code {child.last_exit}); giving up"
                    )
                    self._write_state()
                    raise GaveUp(self.gave_up)
                child.state, child.start_at = "restarting", now + delay
                log.warning("%s exited with %s; starting it again in %.1f s", child.name, child.last_exit, delay)
            elif child.state == "restarting" and now >= child.start_at:
                child.restarts += 1
                self._spawn(child)
                changed = True
        if changed:
            self._write_state()

    def wait(self) -> int:
        """Supervise until interrupted (SIGINT or SIGTERM: 0) or until a child keeps failing
        (1); then stop every child."""
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a service manager, `kill`) must stop the children too, and SIGINT may be
            # ignored when started in the background: both interrupt the wait.
            signal.signal(signal.SIGTERM, _interrupt)
            signal.signal(signal.SIGINT, _interrupt)
        try:
            while True:
                self.check()
                time.sleep(0.2)
        except GaveUp as error:
            log.error("stopped: %s", error)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            self.stop()

    def stop(self, timeout: float = 20.0) -> None:
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for p in running:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in running:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not stop in time; killing it", p.pid)
                p.kill()
                p.wait()
        for child in self.children:
            if child.state in ("up", "restarting"):
                child.state = "stopped"
        self._write_state()

    def _write_state(self) -> None:
        if self.state_file is None:
            return
        data = {
            "pid": os.getpid(),
            "gave_up": self.gave_up,
            "processes": [s.model_dump() for s in self.states()],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.state_file)  # atomic: a reader never sees half a file

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_state(state_file: Path) -> list[ProcessState]:
    """The processes of a running `chatmem up`, or [] when none runs (no file, or its
    supervisor is gone)."""
    try:
        data = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    pid = data.get("pid")
    if not isinstance(pid, int) or not _alive(pid):
        return []
    return [ProcessState.model_validate(p) for p in data.get("processes", [])]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
