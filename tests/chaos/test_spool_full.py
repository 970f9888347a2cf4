"""Case: Redis is down while a bot publishes, and the publish spool fills up (a small
CHATMEM_SPOOL_MAX_BYTES). The spool keeps what it holds and refuses newer events without blocking
the bot; once Redis is back the spool drains once, in order, before anything newer, and the
refused count (`chatmem status`) is exactly the number of events that were not stored."""

from __future__ import annotations

import time

import pytest

from chatmem.adapters.services import ServiceUrls
from chatmem.bootstrap import Container
from chatmem.producers.spool import Spool
from tests.chaos.harness import CHAOS_SETTINGS, Load, Stack, conversation, finish, settled
from tests.conftest import status_json, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.heavy]

SPOOL_MAX_BYTES = 16 * 1024  # about 70 of these messages


def test_spool_full_while_redis_is_down(settings_factory, embedded, tmp_path):
    started = time.monotonic()
    case = "spool-full"
    s = settings_factory(**CHAOS_SETTINGS, spool_max_bytes=SPOOL_MAX_BYTES)
    c = Container(s, ServiceUrls(s.database_url, s.redis_url, False, False))  # type: ignore[arg-type]
    spool = Spool(s.resolved_spool_dir)
    load = Load(s, conversation(case, 400, 10), 4)
    try:
        with Stack(s, tmp_path / "stack.log") as stack:
            stack.wait_ready()
            redis_server = embedded["redis"]
            assert redis_server.stop()
            try:
                load.start()
                assert wait_for(lambda: spool.refused_count() > 0, 30), "the spool never filled"
                load.reached(0.6)
                assert spool.used_bytes() <= SPOOL_MAX_BYTES
            finally:
                redis_server.start()
            load.join(90)
            refused = spool.refused_count()
            published = [e.event_id for e in load.events]
            assert wait_for(lambda: settled(c, len(published) - refused, case + "-"), 90, 0.5), stack.tail()
            with c.pool.connection() as conn:
                rows = conn.execute("SELECT event_id FROM events WHERE thread_id LIKE %s", (case + "-%",))
                stored = {r[0] for r in rows}
            missing = [i for i, e in enumerate(published) if e not in stored]
            # The refused count is exactly what was not stored...
            assert len(missing) == refused > 0
            # ...and it is one run in publish order: everything spooled before the spool was full
            # was kept, and once Redis was back nothing more was refused.
            assert missing == list(range(missing[0], missing[0] + refused)) and missing[0] > 0
            out = finish(
                case,
                f"spool full ({SPOOL_MAX_BYTES // 1024} KiB) while Redis is down",
                c,
                load,
                stack,
                started,
                refused=frozenset(published[i] for i in missing),
            )
            report = status_json(s)
            assert report["stream"]["spool_refused"] == refused and report["stream"]["spooled"] == 0
        print(out, f"refused {refused} of {len(published)}")
    finally:
        c.close()
