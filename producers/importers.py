"""Importers: turn files into events published through the normal publisher."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chatmem.producers.publisher import Publisher
from chatmem.schemas.events import Attachment, AttachmentKind, InvalidEvent, MessageEvent, parse_event
from chatmem.schemas.settings import Settings

LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"


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


def locomo_events(path: Path, samples: set[str] | None = None) -> Iterator[MessageEvent]:
    """LoCoMo conversations as message events, in order: one thread per sample, one event per
    turn (user_id = the speaker, platform message id = dia_id, time = the session's time plus
    the turn's index in seconds, an image's caption as an attachment caption). Event ids are
    derived from the turn, so importing twice stores everything once."""
    data = json.loads(Path(path).read_text())
    for sample in data:
        sample_id = str(sample["sample_id"])
        if samples is not None and sample_id not in samples:
            continue
        conv = sample["conversation"]
        sessions = sorted(
            (k for k, v in conv.items() if re.fullmatch(r"session_\d+", k) and isinstance(v, list)),
            key=lambda k: int(k.split("_")[1]),
        )
        for key in sessions:
            start = datetime.strptime(conv[f"{key}_date_time"], LOCOMO_DATE_FORMAT).replace(tzinfo=UTC)
            for index, turn in enumerate(conv[key]):
                urls = turn.get("img_url") or []
                original = (urls[0] if urls else None) if isinstance(urls, list) else urls
                attachments = []
                if turn.get("blip_caption"):
                    # Only https references are accepted; the dataset has some http ones.
                    url = original if str(original).startswith("https://") else "https://locomo.invalid/image"
                    attachments.append(Attachment(url=url, kind=AttachmentKind.IMAGE, caption=turn["blip_caption"]))
                yield MessageEvent(
                    event_id=f"locomo:{sample_id}:{turn['dia_id']}",
                    thread_id=sample_id,
                    user_id=re.sub(r"[^\w.:@-]", "_", turn["speaker"]),
                    platform="locomo",
                    text=turn["text"],
                    occurred_at=start + timedelta(seconds=index),
                    platform_message_id=turn["dia_id"],
                    attachments=attachments,
                    metadata={"author_name": turn["speaker"], **({"img_url": original} if original else {})},
                )


def publish_locomo(pub: Publisher, path: Path, samples: set[str] | None = None, batch: int = 500) -> ImportResult:
    result = ImportResult()
    pending: list[MessageEvent] = []
    for event in locomo_events(path, samples):
        pending.append(event)
        if len(pending) >= batch:
            result.accepted += len(pub.publish_many(pending))
            pending.clear()
    if pending:
        result.accepted += len(pub.publish_many(pending))
    return result
