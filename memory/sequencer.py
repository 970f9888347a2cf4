"""The doorbell handler: apply a thread's committed events in publish order, one worker at a time.

A lease (not a transaction) guards the thread, so slow work between reading a batch and
applying it never holds a database transaction open; applying checks the lease is still ours
and moves the cursor in the same transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chatmem.memory.ports import Doorbell, LeaseLost, ThreadLog, UnknownThread
from chatmem.schemas.records import LoggedEvent, ThreadLease

log = logging.getLogger(__name__)

# What applying a batch means grows with the memory model; the cursor is always moved by it.
Applier = Callable[[ThreadLease, Sequence[LoggedEvent]], ThreadLease]
# Told when applying a thread's batch raised an error other than a passing outage: the thread,
# the first event of the batch it waits at, the error. Such an error comes back on every try.
ApplyFailed = Callable[[str, LoggedEvent, Exception], None]


@dataclass(frozen=True)
class AdvanceResult:
    thread_id: str
    applied: int
    busy: bool = False
    lost_lease: bool = False
    unknown: bool = False
    more: bool = False  # stopped after max_batches with events still pending
    failed: bool = False  # applying raised (a group pass goes on with its other threads)


def advance_thread(
    threads: ThreadLog,
    doorbell: Doorbell,
    thread_id: str,
    *,
    owner: str,
    lease_s: int,
    batch_size: int,
    apply: Applier | None = None,
    max_batches: int | None = None,
    transient: tuple[type[BaseException], ...] = (),
    on_failure: ApplyFailed | None = None,
) -> AdvanceResult:
    """Apply the thread's pending events, all of them or at most `max_batches` batches (a bulk
    thread yields the worker between slices so live doorbells waiting behind it run first).
    An error applying a batch is raised; unless it is `transient`, `on_failure` is told first."""
    # Clear the dedupe mark first: anything committed from now on rings again.
    doorbell.clear(thread_id)
    try:
        lease = threads.acquire_lease(thread_id, owner, lease_s)
    except UnknownThread:
        log.warning("doorbell for unknown thread %s ignored", thread_id)
        return AdvanceResult(thread_id, 0, unknown=True)
    if lease is None:
        return AdvanceResult(thread_id, 0, busy=True)
    applier = apply or threads.advance_cursor
    applied = 0
    batches = 0
    full = False
    try:
        while True:
            if max_batches is not None and batches >= max_batches:
                # A short last batch means the log had nothing more when it was read.
                return AdvanceResult(thread_id, applied, more=full)
            batch = threads.pending_events(thread_id, lease.cursor_pos, batch_size)
            if not batch:
                break
            batches += 1
            full = len(batch) >= batch_size
            before = lease.cursor_pos
            try:
                lease = applier(lease, batch)
            except LeaseLost:
                raise
            except transient:
                raise
            except Exception as error:
                if on_failure is not None:
                    on_failure(thread_id, batch[0], error)
                raise
            if lease.cursor_pos == before:
                break  # nothing could be applied now (the thread's memory is paused)
            applied += sum(1 for e in batch if e.stream_pos <= lease.cursor_pos)
    except LeaseLost:
        log.warning("thread %s: lease lost after %d events; another worker continues", thread_id, applied)
        return AdvanceResult(thread_id, applied, lost_lease=True)
    finally:
        threads.release_lease(thread_id, owner)
    return AdvanceResult(thread_id, applied)


def sweep(threads: ThreadLog, doorbell: Doorbell, *, limit: int = 1000) -> int:
    """Re-ring threads whose cursor lags the committed log (a lost doorbell, a dead worker)."""
    return doorbell.ring(threads.lagging_threads(limit))


# Embeds ahead the first batches of several threads (one model call), so each thread's apply
# finds its vectors in the shared cache.
Prefetch = Callable[[Sequence[Sequence[LoggedEvent]]], int]


def advance_threads(
    threads: ThreadLog,
    doorbell: Doorbell,
    thread_ids: Sequence[str],
    *,
    owner: str,
    lease_s: int,
    batch_size: int,
    apply: Applier | None = None,
    prefetch: Prefetch | None = None,
    transient: tuple[type[BaseException], ...] = (),
    on_failure: ApplyFailed | None = None,
) -> list[AdvanceResult]:
    """A doorbell pass over several rung threads: one embedding call for all of their next
    batches, then one batch of each thread applied as `advance_thread` does. A thread with more
    (`more`) is for the caller to ring again, so a backlog in one thread never holds up the
    others of its group. The read ahead takes no lease; at worst it embeds texts another worker
    has just embedded. A thread whose batch fails (`on_failure` is told) does not hold up the
    others either: they get their pass, and it is reported `failed`. A `transient` error (an
    outage the others would meet too) is raised, for the whole pass to be tried again."""
    if prefetch is not None and len(thread_ids) > 1:
        prefetch(list(threads.first_pending(thread_ids, batch_size).values()))
    results = []
    for t in thread_ids:
        try:
            result = advance_thread(
                threads,
                doorbell,
                t,
                owner=owner,
                lease_s=lease_s,
                batch_size=batch_size,
                apply=apply,
                max_batches=1,
                transient=transient,
                on_failure=on_failure,
            )
        except transient:
            raise
        except Exception:
            log.exception("thread %s: applying its events failed; the other threads of the pass go on", t)
            result = AdvanceResult(t, 0, failed=True)
        results.append(result)
    return results
