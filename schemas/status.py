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
    spooled: int  # events in this host's publish spool (the main one and the importers' bulk one)
    spool_refused: int = 0  # events refused because a spool was full (CHATMEM_SPOOL_MAX_BYTES), ever


class Lag(BaseModel):
    max_events: int
    thread_id: str | None


class PostgresState(BaseModel):
    """What the vector self-check found: versions, and the problem in words when it failed."""

    server_version: str | None
    vector_version: str | None
    self_check: str  # "ok", or why the server cannot hold vectors
    cpu: str
    shared_buffers: int | None = None  # bytes of the server's buffer cache
    vector_graph: int | None = None  # bytes of the messages' HNSW index, which inserts and graph searches read
    vector_library: str | None = None  # the folder of a pgvector compiled here, when the embedded server loads it


class ModelState(BaseModel):
    """A shipped ONNX model in use, run here on fixed probes against the outputs recorded with it."""

    model: str
    deviation: float | None  # the largest difference from the recorded outputs, when it ran
    problem: str | None  # None: it answers here as it did where it was made


class ProcessState(BaseModel):
    """One child of `chatmem up`."""

    command: str
    state: str  # up | restarting | failed | stopped
    pid: int | None
    restarts: int
    last_exit: int | None = None


class StatusReport(BaseModel):
    services: list[ServiceState]
    postgres: PostgresState
    counts: dict[str, int]
    queues: dict[str, int]
    stream: StreamState
    lag: Lag
    migrated: bool = True  # False: the schema is not there yet (`chatmem migrate`)
    processes: list[ProcessState] = []  # the children of a running `chatmem up`
    models: list[ModelState] = []  # the shipped ONNX models this configuration runs
