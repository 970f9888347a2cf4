from pathlib import Path

import pytest
import yaml

from chatmem.adapters.celery_queue import TASK_QUEUES, create_celery
from chatmem.schemas.queues import LONGEST_TIME_LIMIT_S, PROFILES, Queue, parse_queues, prefetch_for
from chatmem.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_one_worker_per_queue_with_the_project_commands():
    compose = yaml.safe_load((ROOT / "infra" / "docker-compose.yml").read_text())
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
