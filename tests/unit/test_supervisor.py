"""The supervisor's restart policy (pure) and its loop over real child processes (plain Python
children, no services)."""

import os
import signal
import sys
import time

from chatmem.workers.supervisor import GaveUp, RestartPolicy, Supervisor, read_state


def test_backoff_doubles_up_to_the_cap_and_a_crash_loop_gives_up():
    policy = RestartPolicy(max_restarts=3, window_s=60, base_s=1, max_delay_s=3)
    assert [policy.delay([0] * n, 0) for n in (1, 2, 3)] == [1, 2, 3]
    assert policy.delay([0, 0, 0, 0], 0) is None  # a fourth exit within the window
    assert policy.delay([0, 0, 0, 100], 100) == 1  # older exits have left the window


def python(code: str):
    return lambda cmd: [sys.executable, "-c", code]


def run_until(sup: Supervisor, predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sup.check()
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_killed_child_is_started_again_and_the_state_file_says_so(tmp_path):
    state = tmp_path / "supervisor.json"
    policy = RestartPolicy(max_restarts=3, window_s=60, base_s=0.1)
    sup = Supervisor([["sleeper"]], policy=policy, state_file=state, argv=python("import time; time.sleep(60)"))
    sup.start()
    try:
        first = sup.children[0].proc.pid
        assert [(p.command, p.state, p.pid) for p in read_state(state)] == [("sleeper", "up", first)]
        os.kill(first, signal.SIGKILL)
        assert run_until(sup, lambda: sup.children[0].restarts == 1)
        (proc,) = read_state(state)
        assert (proc.state, proc.restarts, proc.last_exit) == ("up", 1, -signal.SIGKILL) and proc.pid != first
    finally:
        sup.stop()
    assert sup.children[0].proc.poll() is not None
    assert read_state(state) == [] or read_state(state)[0].state == "stopped"


CRASHES = "import sys, time; sys.exit(3) if sys.argv[1] == 'broken' else time.sleep(60)"


def test_a_child_that_keeps_failing_stops_the_stack_with_a_clear_message(tmp_path):
    policy = RestartPolicy(max_restarts=2, window_s=60, base_s=0.05)
    sup = Supervisor([["broken"], ["healthy"]], policy=policy, argv=lambda cmd: [sys.executable, "-c", CRASHES, *cmd])
    sup.start()
    try:
        gave_up = None
        try:
            run_until(sup, lambda: False, timeout=10)
        except GaveUp as error:
            gave_up = str(error)
        assert gave_up == "broken kept failing: 3 exits within 60 s (last exit code 3); giving up"
        assert [p.state for p in sup.states()] == ["failed", "up"]
    finally:
        sup.stop()
    assert all(c.proc.poll() is not None for c in sup.children)


def test_wait_returns_1_after_a_crash_loop_and_stops_the_healthy_children():
    policy = RestartPolicy(max_restarts=1, window_s=60, base_s=0.05)
    sup = Supervisor([["broken"], ["healthy"]], policy=policy, argv=lambda cmd: [sys.executable, "-c", CRASHES, *cmd])
    sup.start()
    assert sup.wait() == 1
    assert "broken kept failing" in (sup.gave_up or "")
    assert all(c.proc.poll() is not None for c in sup.children)
