"""Case 2: two ingest consumers and two workers per queue (segment, summarize) under load, one
of each killed mid-way: the survivors race on the same threads, the killed ones come back."""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import BASE, Load, Stack, conversation, finish

pytestmark = pytest.mark.chaos


def test_two_of_each_one_of_each_killed(chaos_settings, chaos_container, tmp_path):
    started = time.monotonic()
    case = "scale-out"
    processes = {
        "ingest-a": ("ingest", "--consumer", "ingest-a"),
        "ingest-b": ("ingest", "--consumer", "ingest-b"),
        "segment-a": BASE["segment"],
        "segment-b": BASE["segment"],
        "summarize-a": BASE["summarize"],
        "summarize-b": BASE["summarize"],
        "sweeper": BASE["sweeper"],
    }
    load = Load(chaos_settings, conversation(case, 1000, 20), 10)
    with Stack(chaos_settings, tmp_path / "stack.log", processes) as stack:
        stack.wait_ready()
        load.start()
        load.reached(0.3)
        stack.kill9("ingest-a")
        stack.kill9("segment-a")
        load.reached(0.6)
        stack.kill9("summarize-a")
        finish(case, "2x ingest/segment/summarize, kill -9 one of each", chaos_container, load, stack, started)
