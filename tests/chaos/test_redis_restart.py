"""Case 5: Redis restarted while events wait in the stream and bots keep publishing. The
publishers spool to disk while it is down and drain in order once it is back; the stream, the
consumer group and the queued tasks come back from the AOF (the embedded Redis writes it with
appendfsync everysec and saves on a clean shutdown)."""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import Load, Stack, conversation, finish

pytestmark = [pytest.mark.chaos, pytest.mark.heavy]

OUTAGE_S = 8


def test_redis_restarted_while_events_wait_and_bots_publish(chaos_settings, chaos_container, embedded, tmp_path):
    started = time.monotonic()
    case = "redis-restart"
    load = Load(chaos_settings, conversation(case, 1000, 20), 10)
    with Stack(chaos_settings, tmp_path / "stack.log") as stack:
        stack.wait_ready()
        load.start()
        load.reached(0.3)
        redis_server = embedded["redis"]
        assert redis_server.stop()  # a clean shutdown: what a restart or an upgrade does
        time.sleep(OUTAGE_S)  # the bots go on publishing: their publishers spool
        redis_server.start()
        load.join(90)
        out = finish(case, f"Redis restarted ({OUTAGE_S} s down)", chaos_container, load, stack, started)
    print(out, {n: stack.restarts(n) for n in stack.names})
