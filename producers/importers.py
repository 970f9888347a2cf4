"""Importers: turn files into events published through the normal publisher."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from producers.publisher import Publisher
from schemas.events import InvalidEvent, parse_event
from schemas.settings import Settings


@dataclass
class ImportResult:
    accepted: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)


def publish_jsonl(pub: Publisher, path: Path, settings: Settings, batch: int = 500) -> ImportResult:
    """Validate each line as a wire event; publish the valid ones in order, report the rest."""
    result = ImportResult()
    pending = []
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                pending.append(
                    parse_event(
                        line,
                        max_text_chars=settings.max_text_chars,
                        max_data_uri_bytes=settings.max_data_uri_bytes,
                    )
                )
            except InvalidEvent as error:
                result.rejected.append((line_no, error.reason))
            if len(pending) >= batch:
                result.accepted += len(pub.publish_many(pending))
                pending.clear()
    if pending:
        result.accepted += len(pub.publish_many(pending))
    return result
