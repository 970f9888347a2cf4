"""What a message's history text says of its attachments (`[image#a1b2c3d4] short description`),
and what can be said of an image or a video without a vision model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from chatmem.memory.attachments.ports import ImageInfo, VideoInfo
from chatmem.memory.prompts import ImageDescription

SHORT_ID_CHARS = 8
SURROGATE_CHARS = 160
# A line `attachment_line` writes, as it starts (readers tell messages that carry a file).
ATTACHMENT_LINE = re.compile(r"^\[(image|file)(#[0-9a-f]+)?\]", re.MULTILINE)


def clip(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def offline_description(ocr_lines: Sequence[str], info: ImageInfo) -> ImageDescription:
    """What can be said of an image without a vision model: its text and its metadata."""
    shape = f"{info.format} image, {info.width}×{info.height}"
    facts = [f"{k.replace('_', ' ')} {v}" for k, v in sorted(info.meta.items())]
    text = " ".join(ocr_lines)
    short = f'{shape} with the text "{clip(text, 100)}"' if text else shape
    detail = (
        shape
        + (f" ({', '.join(facts)})" if facts else "")
        + (f'. Text in the image: "{text}"' if text else ". No text in it")
    )
    return ImageDescription(short=clip(short, SURROGATE_CHARS), detail=detail)


def video_description(info: VideoInfo | None, ocr_lines: Sequence[str], words: str) -> str:
    """What can be said of a video without a vision model: its length and size, then what is said
    in it, else the text its pictures show."""
    shape = "video"
    if info is not None:
        length = f" {clock(info.seconds)}" if info.seconds is not None else ""
        shape = f"video{length}, {info.width}×{info.height}"
    text = " ".join(ocr_lines)
    if words:
        return clip(f'{shape}: "{words}"', SURROGATE_CHARS)
    return clip(f'{shape} with the text "{clip(text, 100)}"', SURROGATE_CHARS) if text else shape


def clock(seconds: float) -> str:
    """A length as a player shows it: 0:07, 12:30, 1:02:05."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def short_id(sha256: str) -> str:
    return sha256[:SHORT_ID_CHARS]


def label(kind: str | None) -> str:
    return "image" if kind == "image" else "file"


@dataclass(frozen=True)
class RefState:
    """What a message's surrogate is made from: the reference's state and its artifact's."""

    position: int
    status: str  # pending | done | failed
    kind: str | None = None  # image | document, once the bytes are known
    sha256: str | None = None
    description: str | None = None
    reason: str | None = None


def attachment_line(attachment: dict, state: RefState | None) -> str:
    """The line a message's history text gets for one attachment."""
    kind = state.kind if state and state.kind else attachment.get("kind")
    tag = label(kind) + (f"#{short_id(state.sha256)}" if state and state.sha256 else "")
    # One line per attachment, always: a message's text ends with exactly that many lines.
    name = " ".join(" ".join(x for x in (attachment.get("filename"), attachment.get("caption")) if x).split())
    if state is not None and state.status == "done" and state.description:
        return f"[{tag}] " + " — ".join(x for x in (name, clip(state.description, SURROGATE_CHARS)) if x)
    if state is not None and state.status == "failed":
        # The reason stays on the attachment (`chatmem status`, the artifacts tables): in the
        # history it would only add noise to summaries and search.
        return f"[{tag}] {name} (not readable)".replace("]  (", "] (")
    return f"[{tag}] {name}".rstrip()


def attachment_lines(payload: dict, states: dict[int, RefState] | None = None) -> list[str]:
    states = states or {}
    return [attachment_line(a, states.get(i)) for i, a in enumerate(payload.get("attachments") or [])]
