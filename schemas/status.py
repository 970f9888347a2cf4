"""What `chatmem status` reports (and `--json` prints)."""

from __future__ import annotations

from pydantic import BaseModel


class ServiceState(BaseModel):
    name: str
    running: bool
    url: str | None
    detail: str


class StreamState(BaseModel):
    key: str
    length: int
    pending: int
    watermark: int
    spooled: int


class Lag(BaseModel):
    max_events: int
    thread_id: str | None


class StatusReport(BaseModel):
    services: list[ServiceState]
    counts: dict[str, int]
    queues: dict[str, int]
    stream: StreamState
    lag: Lag
