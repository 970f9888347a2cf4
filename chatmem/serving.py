"""What chatmem's own long-lived servers (`chatmem api`, the MCP server over HTTP) do before their
first request."""

from __future__ import annotations

import gc
import logging
from typing import Protocol

log = logging.getLogger("chatmem.serve")


class WarmsUp(Protocol):
    def warm_up(self) -> None: ...


def ready_to_serve(container: WarmsUp) -> None:
    """Before a long-lived server's first request: warm up, then freeze the heap. Frozen, the
    objects alive by then (models, mem0: some 250,000) are left out of garbage collections.
    Otherwise a full collection walks them all, about 125 ms, once in some 760 recalls
    (docs/benchmarks.md). Only chatmem's own servers do this; a bot's process keeps its collector."""
    try:
        container.warm_up()
    except Exception as error:  # a store down at start must not stop the server: /readyz says so
        log.warning("warm-up failed (%s); the first request loads what it needs", error)
    gc.collect()
    gc.freeze()
