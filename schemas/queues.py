"""The queue catalogue: one Enum used by task routing, the worker command, the Makefile and
infra/docker-compose.yml (a test keeps compose in step with it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Queue(StrEnum):
    SEGMENT = "segment"
    SUMMARIZE = "summarize"
    FACTS = "facts"
    ATTACHMENTS = "attachments"
    MAINTENANCE = "maintenance"


@dataclass(frozen=True)
class QueueProfile:
    slow: bool  # slow tasks take one message at a time (prefetch 1)
    soft_time_limit_s: int
    time_limit_s: int


PROFILES: dict[Queue, QueueProfile] = {
    Queue.SEGMENT: QueueProfile(slow=False, soft_time_limit_s=240, time_limit_s=300),
    Queue.SUMMARIZE: QueueProfile(slow=True, soft_time_limit_s=540, time_limit_s=600),
    Queue.FACTS: QueueProfile(slow=True, soft_time_limit_s=540, time_limit_s=600),
    Queue.ATTACHMENTS: QueueProfile(slow=True, soft_time_limit_s=840, time_limit_s=900),
    Queue.MAINTENANCE: QueueProfile(slow=False, soft_time_limit_s=3000, time_limit_s=3600),
}

LONGEST_TIME_LIMIT_S = max(p.time_limit_s for p in PROFILES.values())
# Redis re-delivers an unacked task after the visibility timeout; it must exceed every time
# limit or a slow task still running would be handed to a second worker.
VISIBILITY_TIMEOUT_S = LONGEST_TIME_LIMIT_S * 2


def parse_queues(spec: str) -> list[Queue]:
    if spec.strip() in ("", "all"):
        return list(Queue)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in Queue._value2member_map_]
    if unknown:
        raise ValueError(f"unknown queue(s): {', '.join(unknown)}; known: {', '.join(q.value for q in Queue)}")
    return [Queue(n) for n in names]


def prefetch_for(queues: list[Queue]) -> int:
    return 1 if any(PROFILES[q].slow for q in queues) else 4


# A worker process that loads the models holds about 340 MiB (docs/platforms.md, "How much memory
# the whole stack takes"), and the stack with two of them peaks near 1.9 GiB. Below this much
# memory, on the machine or in its container, a second one leaves too little for the bot and the
# system, so a worker started without --concurrency runs one.
TWO_PROCESSES_FROM = 3 << 30


def default_concurrency(memory: int) -> int:
    """Processes of a worker started without --concurrency where `memory` bytes are available."""
    return 2 if memory >= TWO_PROCESSES_FROM else 1
