"""A server's start: warm up, then freeze the heap, and a failed warm-up does not stop the server."""

import gc
import logging

import pytest

from chatmem.serving import ready_to_serve


class Warming:
    """Container.warm_up's interface, counting calls or failing as a store that is down."""

    def __init__(self, error: Exception | None = None):
        self.calls = 0
        self.error = error

    def warm_up(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the suite runs with the collector as it was


def test_ready_to_serve_warms_up_then_freezes_what_is_alive(unfrozen):
    c = Warming()
    before = gc.get_freeze_count()
    ready_to_serve(c)
    assert c.calls == 1
    assert before == 0 and gc.get_freeze_count() > 0


def test_a_failed_warm_up_is_a_warning_and_the_heap_is_still_frozen(unfrozen, caplog):
    c = Warming(ConnectionError("postgres at 127.0.0.1:5432 refused the connection"))
    with caplog.at_level(logging.WARNING, logger="chatmem.serve"):
        ready_to_serve(c)
    assert c.calls == 1
    assert any("warm-up failed" in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)
    assert gc.get_freeze_count() > 0
