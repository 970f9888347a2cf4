"""Which failures a later attempt can fix. Everything else is a bug or bad input: not retried."""

from __future__ import annotations

import psycopg
import redis

from chatmem.memory.ports import TransientError

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    psycopg.OperationalError,
    redis.ConnectionError,
    redis.TimeoutError,
)
