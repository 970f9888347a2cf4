from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from chatmem.adapters.celery_queue import POOL_EXIT_WAIT_POLLS, TASK_QUEUES, bound_pool_exit_wait, create_celery
from chatmem.schemas.queues import (
    LONGEST_TIME_LIMIT_S,
    PROFILES,
    Queue,
    default_concurrency,
    parse_queues,
    prefetch_for,
)
from chatmem.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_one_worker_per_queue_with_the_project_commands():
    compose = yaml.safe_load((ROOT / "infra" / "docker-compose.yml").read_text(encoding="utf-8"))
    services = compose["services"]
    worker_queues = sorted(
        s["command"][s["command"].index("--queues") + 1]
        for s in services.values()
        if isinstance(s.get("command"), list) and s["command"][:1] == ["worker"]
    )
    assert worker_queues == sorted(q.value for q in Queue)
    assert services["ingest"]["command"] == ["ingest"]
    assert "--appendonly" in services["redis"]["command"]
    assert services["postgres"]["image"].startswith("pgvector/pgvector")


def test_celery_config_is_json_only_and_late_ack():
    app = create_celery(Settings(), "redis://127.0.0.1:1/0")
    conf = app.conf
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.broker_transport_options["visibility_timeout"] > LONGEST_TIME_LIMIT_S
    for name, queue in TASK_QUEUES.items():
        assert conf.task_routes[name]["queue"] == queue.value
        assert conf.task_annotations[name]["time_limit"] == PROFILES[queue].time_limit_s


def test_parse_queues_and_prefetch():
    assert parse_queues("all") == list(Queue)
    assert parse_queues("segment") == [Queue.SEGMENT]
    with pytest.raises(ValueError, match="unknown queue"):
        parse_queues("segment,nope")
    assert prefetch_for([Queue.SEGMENT]) > 1
    assert prefetch_for([Queue.SEGMENT, Queue.SUMMARIZE]) == 1


def test_an_exiting_pool_process_waits_at_most_3_s_for_its_last_result_to_be_read(monkeypatch):
    """billiard's own wait, run as a pool process runs it when its last result is never read (the
    main process stopped reading at a warm shutdown): it gives up after our bound."""
    import billiard.pool

    monkeypatch.setattr(billiard.pool, "GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT", 300)  # billiard's default
    bound_pool_exit_wait()
    polls = []
    monkeypatch.setattr(billiard.pool.time, "sleep", polls.append)
    unread = SimpleNamespace(on_ready_counter=SimpleNamespace(value=4))  # 4 of 5 results read
    assert billiard.pool.Worker._ensure_messages_consumed(unread, completed=5) is False
    assert len(polls) == POOL_EXIT_WAIT_POLLS and sum(polls) == pytest.approx(3.0)
    read = SimpleNamespace(on_ready_counter=SimpleNamespace(value=5))
    assert billiard.pool.Worker._ensure_messages_consumed(read, completed=5) is True

    monkeypatch.delattr(billiard.pool, "GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT")
    with pytest.raises(RuntimeError, match="pinned billiard"):
        bound_pool_exit_wait()


def test_a_worker_runs_one_process_where_memory_is_short_and_two_from_three_gib():
    gib = 1 << 30
    assert [default_concurrency(n) for n in (gib, 2 * gib, 3 * gib - 1)] == [1, 1, 1]
    assert [default_concurrency(n) for n in (3 * gib, 24 * gib, 512 * gib)] == [2, 2, 2]
