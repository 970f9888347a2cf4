"""The shared machinery of the fault matrix: a steady publisher, the real stack under the real
`chatmem up` supervisor, the waits and the invariant checks. A case starts the stack and the
load, injects one fault and calls `finish`, which waits for the pipeline to settle, counts
lost / duplicated / reordered events and dead letters, and records one row of the matrix."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg

from chatmem.bootstrap import Container
from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import MessageEvent
from chatmem.schemas.settings import Settings
from chatmem.workers.supervisor import RestartPolicy, Supervisor
from tests.conftest import ROOT, wait_for

# The settings every case runs with. Recovery after a kill waits for the lease of the dead
# worker to expire and for the doorbell dedupe key to lapse: the defaults (120 s, 60 s) are
# right for production but would make each case minutes long, so the cases shrink them.
CHAOS_SETTINGS = {
    "thread_lease_s": 5,
    "doorbell_dedupe_s": 2,
    "ingest_claim_idle_ms": 1000,
    "ingest_block_ms": 50,
    # One summary per episode plus few running ones: on 2 cores the summarize queue, not the
    # fault, would otherwise set the length of a case.
    "running_summary_every": 50,
    "chunk_summary_every": 50,
    # A final summary lost with a killed summarize worker is queued again within seconds.
    "sweeper_finals_after_s": 3,
    # The loads are people talking, where the segmenter's pair model reads every turn: on 2 cores
    # it would set each case's length (about 13 s per 1,000 messages) without touching what the
    # matrix checks. The case that kills a segment pool process runs with it, so a replacement
    # process loads it too.
    "segment_pair_model": False,
}

# What `chatmem up` runs, less the attachment worker and the API (no attachments, no reads here)
# and with the segment and summarize queues apart, so each can be killed on its own.
BASE = {
    "ingest": ("ingest",),
    "segment": ("worker", "--queues", "segment", "--concurrency", "1"),
    "summarize": ("worker", "--queues", "summarize", "--concurrency", "1"),
    "sweeper": ("sweeper", "--interval", "1"),
}


@dataclass
class Row:
    case: str
    fault: str
    events: int
    lost: int
    duplicated: int
    inversions: int
    dead_letters: int
    seconds: float
    refused: int = 0  # refused by a full publish spool, on purpose (not lost: counted and reported)


ROWS: list[Row] = []  # printed by tests/chaos/conftest.py at the end of the session


def conversation(case: str, n: int, threads: int, start: int = 0) -> list[MessageEvent]:
    """n messages over `threads` threads (from message `start` on, to continue a conversation);
    every 25th message of a thread opens a new topic with a marker, so episodes close and final
    summaries are due while the fault hits."""
    out = []
    for i in range(start, start + n):
        t, k = i % threads, i // threads
        if k and k % 25 == 0:
            text = f"by the way, let's talk about something else: subject {k // 25} of thread {t}"
        else:
            text = f"message {k} in thread {t}, still about subject {k // 25}: details, numbers {i} and plans"
        out.append(MessageEvent(event_id=f"{case}-{i}", thread_id=f"{case}-t{t}", user_id="u", text=text))
    return out


class Load(threading.Thread):
    """Publishes `events` at a steady pace over `seconds` with one fire-and-forget Publisher (one
    publisher keeps its order, so the order here is the publish order per thread)."""

    def __init__(self, settings: Settings, events: list, seconds: float):
        super().__init__(daemon=True)
        self.settings, self.events, self.seconds = settings, events, seconds
        self.order: dict[str, list[str]] = defaultdict(list)
        self.published = 0
        self.flushed = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            pub = Publisher.from_settings(self.settings)
            start, step = time.monotonic(), self.seconds / max(1, len(self.events))
            for i, event in enumerate(self.events):
                pub.publish_nowait(event)
                self.order[event.thread_id].append(event.event_id)
                self.published = i + 1
                delay = start + (i + 1) * step - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.flushed = pub.flush(60)
            pub.close(30)
        except BaseException as error:  # noqa: BLE001 - reported by finish(), not lost in a thread
            self.error = error

    def reached(self, fraction: float, timeout: float = 60) -> None:
        """Block until this share of the events is published (the moment to inject a fault)."""
        assert wait_for(lambda: self.published >= fraction * len(self.events), timeout, 0.02)


class Stack:
    """The real processes under the real Supervisor (`chatmem up`'s), which starts again any
    child that dies; a short backoff keeps the cases quick."""

    def __init__(self, settings: Settings, log: Path, processes: dict[str, tuple[str, ...]] | None = None):
        self.names = list((processes or BASE).keys())
        self.log = log
        self.sup = Supervisor(
            list((processes or BASE).values()),
            env={**settings.as_env(), "PYTHONPATH": str(ROOT)},
            policy=RestartPolicy(max_restarts=20, base_s=0.5, max_delay_s=2.0),
            output=log,
        )
        self._stop = threading.Event()
        self._groups: set[int] = set()
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def __enter__(self) -> Stack:
        self.sup.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sup.stop()
        # Pool children orphaned by a killed worker live in that worker's process group: end them.
        for pgid in self._groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _supervise(self) -> None:
        while not self._stop.is_set():
            for child in self.sup.children:
                if child.proc is not None:
                    self._groups.add(child.proc.pid)  # start_new_session: pgid == pid
            self.sup.check()
            self._stop.wait(0.2)

    def pid(self, name: str) -> int:
        assert wait_for(lambda: self._child(name).state == "up", 30), f"{name} is not up"
        return self._child(name).proc.pid  # type: ignore[union-attr]

    def _child(self, name: str):  # noqa: ANN202
        return self.sup.children[self.names.index(name)]

    def restarts(self, name: str) -> int:
        return self._child(name).restarts

    def kill9(self, name: str, *, group: bool = False) -> int:
        """SIGKILL the main process of `name` (with `group`, its pool processes too, as when its
        host or container dies); the supervisor starts it again."""
        pid = self.pid(name)
        before = self.restarts(name)
        if group:
            os.killpg(pid, signal.SIGKILL)  # start_new_session: pgid == pid
        else:
            os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: self.restarts(name) > before, 30), f"{name} was not restarted"
        return pid

    def kill9_pool_child(self, name: str) -> int:
        """SIGKILL one prefork pool process of a worker (the OOM killer's favourite); Celery's
        main process replaces it and fails its task (`reject_on_worker_lost` re-queues it)."""
        main = psutil.Process(self.pid(name))
        assert wait_for(lambda: bool(_children(main)), 60), f"{name} has no pool children"
        victim = _children(main)[0].pid
        os.kill(victim, signal.SIGKILL)
        return victim

    def wait_ready(self, names: list[str] | None = None, timeout: float = 90) -> None:
        """Wait until every worker's pool processes have loaded the embedding model: until they
        exist and sit idle (on 2 cores loading takes 10-30 s, longer than a case's fault)."""
        for name in names or [n for n in self.names if self.sup.children[self.names.index(n)].command[0] == "worker"]:
            main = psutil.Process(self.pid(name))
            assert wait_for(lambda m=main: bool(_children(m)), timeout), f"{name} did not start its pool"
            assert wait_for(lambda m=main: _idle(m), timeout, 0.1), f"{name} did not settle"

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _children(main: psutil.Process) -> list[psutil.Process]:
    try:
        return main.children()
    except psutil.NoSuchProcess:  # a child came and went while psutil listed them
        return []


def _idle(main: psutil.Process, window: float = 0.5) -> bool:
    try:
        procs = [main, *_children(main)]
        before = sum(sum(p.cpu_times()[:2]) for p in procs)
        time.sleep(window)
        return sum(sum(p.cpu_times()[:2]) for p in procs) - before < 0.1 * window
    except psutil.NoSuchProcess:  # a pool process replaced meanwhile: not settled yet
        return False


@dataclass
class Outcome:
    lost: int
    duplicated: int
    inversions: int
    dead_letters: int
    details: list[str] = field(default_factory=list)


def _rows(c: Container, sql: str, *params: object) -> list[tuple]:
    with c.pool.connection() as conn:
        return conn.execute(sql, params).fetchall()


def settled(c: Container, n: int, prefix: str) -> bool:
    """Every event stored and applied, and every closed episode has its final summary."""
    (stored,) = _rows(c, "SELECT count(*) FROM events WHERE thread_id LIKE %s", prefix + "%")[0]
    (applied,) = _rows(
        c,
        """SELECT count(*) FROM messages m JOIN threads t ON t.thread_id = m.thread_id AND t.generation = m.generation
           WHERE m.thread_id LIKE %s""",
        prefix + "%",
    )[0]
    return stored >= n and applied >= n and not c.summary_store.missing_finals()


def _safe(predicate, *args: object) -> bool:  # noqa: ANN001
    # After a database outage the test's own pool may hand out a cut connection once.
    try:
        return predicate(*args)
    except psycopg.OperationalError:
        return False


def check(c: Container, loads: list[Load], refused: frozenset[str] = frozenset()) -> Outcome:
    """`refused`: events a full spool refused; they are expected nowhere, the rest in order."""
    order: dict[str, list[str]] = defaultdict(list)
    for load in loads:  # loads run one after the other: their concatenation is the publish order
        for thread_id, ids in load.order.items():
            order[thread_id].extend(e for e in ids if e not in refused)
    published = {e for ids in order.values() for e in ids}
    stored = {r[0] for r in _rows(c, "SELECT event_id FROM events")}
    details = []
    lost = len(published - stored)
    if lost:
        details.append(f"lost: {sorted(published - stored)[:10]}")
    duplicated = inversions = 0
    for thread_id, ids in order.items():
        applied = [
            r[0]
            for r in _rows(
                c,
                """SELECT m.event_id FROM messages m JOIN threads t ON t.thread_id = m.thread_id
                   AND t.generation = m.generation WHERE m.thread_id = %s ORDER BY m.seq""",
                thread_id,
            )
        ]
        duplicated += len(applied) - len(set(applied))
        position = {e: i for i, e in enumerate(ids)}
        # An inversion: a message applied right after one that was published later.
        inv = sum(1 for a, b in zip(applied, applied[1:], strict=False) if position.get(a, -1) > position.get(b, -1))
        inversions += inv
        if applied != ids:
            details.append(f"{thread_id}: applied {len(applied)} of {len(ids)}, {inv} inversions")
    # Episodes and final summaries are keyed; a second copy would be a second row per key.
    duplicated += _rows(c, "SELECT count(*) - count(DISTINCT (thread_id, generation, ordinal)) FROM episodes")[0][0]
    duplicated += _rows(
        c, "SELECT count(*) - count(DISTINCT (generation, episode_id)) FROM summaries WHERE kind = 'final'"
    )[0][0]
    dead = _rows(c, "SELECT count(*) FROM dead_letters")[0][0]
    return Outcome(lost, duplicated, inversions, dead, details)


def finish(
    case: str,
    fault: str,
    c: Container,
    loads: Load | list[Load],
    stack: Stack,
    started: float,
    *,
    expected_dead: int = 0,
    timeout: float = 90,
    refused: frozenset[str] = frozenset(),
) -> Outcome:
    """Wait for the pipeline to settle after the fault, check the invariants, record the row."""
    loads = loads if isinstance(loads, list) else [loads]
    for load in loads:
        if load.ident is not None:  # a load may also have been run in the test's own thread
            load.join(timeout)
        assert load.error is None, load.error
        assert load.flushed, "the publisher could not hand every event to Redis"
    n = sum(len(load.events) for load in loads)
    ok = wait_for(lambda: _safe(settled, c, n - len(refused) - expected_dead, case + "-"), timeout, 0.5)
    out = check(c, loads, refused)
    ROWS.append(
        Row(
            case,
            fault,
            n,
            out.lost,
            out.duplicated,
            out.inversions,
            out.dead_letters,
            time.monotonic() - started,
            len(refused),
        )
    )
    assert ok, f"{case} did not settle: {out}\n{stack.tail()}"
    assert (out.lost, out.duplicated, out.inversions, out.dead_letters) == (0, 0, 0, expected_dead), (
        f"{out}\n{stack.tail()}"
    )
    return out
