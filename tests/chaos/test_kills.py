"""Case 1: `kill -9` of each process of the stack while events flow; the supervisor of
`chatmem up` starts it again and nothing is lost, duplicated or reordered."""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import Load, Stack, conversation, finish

pytestmark = pytest.mark.chaos

N, THREADS, SECONDS = 1000, 20, 10


def _kill(stack: Stack, target: str) -> None:
    if target == "segment-pool-child":
        stack.kill9_pool_child("segment")
    else:
        stack.kill9(target.removesuffix("-main"))


@pytest.mark.parametrize(
    "target",
    # segment-pool-child found a bug: a replacement pool process loading the model outlasted
    # Celery's 4 s start-up limit and was killed forever (now worker_proc_alive_timeout=120).
    [
        "ingest",
        "segment-pool-child",
        # The same recovery paths again for other process kinds: `make chaos` runs them.
        pytest.param("segment-main", marks=pytest.mark.heavy),
        pytest.param("summarize", marks=pytest.mark.heavy),
        pytest.param("sweeper", marks=pytest.mark.heavy),
    ],
)
def test_kill9_mid_flow(target, chaos_settings, chaos_container, tmp_path):
    started = time.monotonic()
    case = f"kill-{target}"
    s = chaos_settings
    if target == "segment-pool-child":  # the replacement process loads every model the segmenter has
        s = s.model_copy(update={"segment_pair_model": True})
    load = Load(s, conversation(case, N, THREADS), SECONDS)
    with Stack(s, tmp_path / "stack.log") as stack:
        stack.wait_ready()
        load.start()
        load.reached(0.4)
        _kill(stack, target)
        finish(case, f"kill -9 {target}", chaos_container, load, stack, started)
