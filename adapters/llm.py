"""LLM adapters: an OpenAI-compatible endpoint (structured outputs), the output cache keyed by
(model, prompt version, input hash), and a per-queue rate limit. Retries live in one place:
transient failures raise TransientError and the task retries with backoff."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import threading
import time
from typing import TypeVar

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, ValidationError

from chatmem.adapters.cache_uses import CacheUses
from chatmem.adapters.metrics import instruments
from chatmem.memory.attachments import BadFile
from chatmem.memory.attachments.filetypes import RECORDING_EXTENSIONS
from chatmem.memory.ports import LLM, LLMRefused, TransientError
from chatmem.memory.prompts import ImageDescription, Prompt, describe_image, describe_video

T = TypeVar("T", bound=BaseModel)


def _outages() -> tuple[type[Exception], ...]:
    """The endpoint's errors a later attempt may not meet: an outage, not a refusal."""
    import openai

    return (openai.RateLimitError, openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError)


class OpenAILLM:
    def __init__(self, model: str, api_key: str | None, base_url: str | None, timeout_s: float = 60.0):
        from openai import OpenAI

        self.model = model
        # The client's own retries handle a blip; longer outages surface as TransientError.
        self.client = OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=2)

    def complete(self, prompt: Prompt, response_model: type[T]) -> T:
        return self.parse(prompt.system, prompt.user_text(), response_model)

    def parse(self, system: str, user: str | list[dict], response_model: type[T]) -> T:
        import openai

        try:
            reply = self.client.chat.completions.parse(
                model=self.model,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],  # type: ignore[misc,list-item]
                response_format=response_model,
                temperature=0,
            )
        except _outages() as error:
            raise TransientError(f"LLM unavailable: {error}") from error
        except (ValidationError, ValueError, openai.LengthFinishReasonError) as error:
            # Output that is not the JSON asked for (a model having a bad moment, a proxy's error
            # page): retried like an outage, so the last attempt falls back to the offline LLM.
            raise TransientError(f"LLM output does not fit {response_model.__name__}: {error}"[:500]) from error
        except openai.APIStatusError as error:
            # Status and type only: a refusal's body may echo part of the key.
            raise LLMRefused(f"LLM refused the request: HTTP {error.status_code} {type(error).__name__}") from error
        if reply.usage is not None:  # what the endpoint bills
            tokens = instruments().llm_tokens
            tokens.labels(self.model, "prompt").inc(reply.usage.prompt_tokens)
            tokens.labels(self.model, "completion").inc(reply.usage.completion_tokens)
        parsed = reply.choices[0].message.parsed
        if parsed is None:
            raise TransientError("LLM returned no parsable output")
        return response_model.model_validate(parsed.model_dump())


# What vision endpoints take (OpenAI's: PNG, JPEG, WebP, non-animated GIF); BMP, TIFF and AVIF
# were refused with HTTP 400, which failed the file's task. HEIC is not among them either.
VISION_FORMATS = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})


def _as_png(data: bytes) -> bytes:
    """An image the reader has already opened within its limits, as PNG."""
    import io

    from PIL import Image

    from chatmem.adapters.images import eight_bit, open_heic_too

    open_heic_too()
    with Image.open(io.BytesIO(data)) as img:
        shown = eight_bit(img)  # Pillow's own conversion of 16-bit grey clips it white
        shown = shown.convert("RGBA" if "A" in shown.getbands() else "RGB")
        out = io.BytesIO()
        shown.save(out, "PNG")
        return out.getvalue()


class OpenAIVision:
    """Image descriptions from an OpenAI-compatible vision model (the image goes inline)."""

    def __init__(self, model: str, api_key: str | None, base_url: str | None, timeout_s: float = 90.0):
        self.model = model
        self._chat = OpenAILLM(model, api_key, base_url, timeout_s)

    def describe(self, data: bytes, mime: str, ocr_text: str, *, of_video: bool = False) -> ImageDescription:
        prompt = describe_video(ocr_text) if of_video else describe_image(ocr_text)
        if mime not in VISION_FORMATS:
            data, mime = _as_png(data), "image/png"
        image = f"data:{mime};base64,{base64.b64encode(data).decode()}"
        content: list[dict] = [
            {"type": "text", "text": prompt.user_text()},
            {"type": "image_url", "image_url": {"url": image}},
        ]
        calls = instruments().llm_calls
        try:
            description = self._chat.parse(prompt.system, content, ImageDescription)
        except Exception:
            calls.labels(self.model, "error").inc()
            raise
        calls.labels(self.model, "ok").inc()
        return description


class OpenAITranscriber:
    """Speech to text from an OpenAI-compatible endpoint (`/audio/transcriptions`: whisper-1,
    gpt-4o-mini-transcribe, or a local server such as faster-whisper-server)."""

    def __init__(self, model: str, api_key: str | None, base_url: str | None, timeout_s: float = 120.0):
        from openai import OpenAI

        self.model = model
        self.client = OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=2)

    def transcribe(self, data: bytes, mime: str) -> str:
        import openai

        # The endpoint reads the format from the upload's name.
        extension = RECORDING_EXTENSIONS.get(mime, "ogg")
        name = f"recording.{extension}"
        if extension == "mp4":  # a QuickTime file or an .m4v travels as the MP4 it is named
            mime = "video/mp4"
        calls = instruments().llm_calls
        try:
            reply = self.client.audio.transcriptions.create(model=self.model, file=(name, data, mime))
        except _outages() as error:
            calls.labels(self.model, "error").inc()
            raise TransientError(f"speech-to-text unavailable: {type(error).__name__}") from error
        except openai.APIStatusError as error:
            calls.labels(self.model, "error").inc()
            # Status and type only: a refusal's body may echo part of the key.
            if error.status_code in (400, 413, 415, 422):  # the recording itself: a verdict on the file
                raise BadFile(f"the speech-to-text endpoint refused the recording: HTTP {error.status_code}") from None
            refused = f"HTTP {error.status_code} {type(error).__name__}"
            raise LLMRefused(f"speech-to-text refused the request: {refused}") from error
        calls.labels(self.model, "ok").inc()
        return reply.text


class RateLimiter:
    """At most `per_minute` calls, spread evenly; 0 means no limit."""

    def __init__(self, per_minute: int, clock=time.monotonic, sleep=time.sleep):  # noqa: ANN001
        self.interval = 60.0 / per_minute if per_minute > 0 else 0.0
        self._next = 0.0
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self._sleep(start - now)


def input_hash(prompt: Prompt) -> bytes:
    return hashlib.sha256(json.dumps(prompt.input, sort_keys=True, ensure_ascii=False).encode()).digest()


class _Count:
    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.n += 1


class CachedLLM:
    """Replays cost no tokens: an output is reused for the same (model, prompt version, input)."""

    def __init__(
        self,
        inner: LLM,
        pool: ConnectionPool,
        limiter: RateLimiter | None = None,
        refresh: bool = False,
        thread_id: str | None = None,
        uses: CacheUses | None = None,
    ):
        self.inner = inner
        self.pool = pool
        self.model = inner.model
        self.limiter = limiter or RateLimiter(0)
        self.refresh = refresh
        # Outputs are tagged with the thread whose content they were made from: erasing the
        # thread's content removes them (chatmem erase).
        self.thread_id = thread_id
        self._calls = _Count()  # shared with the per-thread copies, which do the asking
        self.uses = uses  # told of each key read or written, for the rebuilds it watches

    @property
    def calls(self) -> int:
        """Requests that reached the endpoint (not answered by the cache), this one's and its copies'."""
        return self._calls.n

    def for_thread(self, thread_id: str) -> CachedLLM:
        scoped = copy.copy(self)
        scoped.thread_id = thread_id
        return scoped

    def complete(self, prompt: Prompt, response_model: type[T]) -> T:
        key = (self.model, prompt.version, input_hash(prompt))
        if self.uses is not None:
            self.uses.llm(self.thread_id, key)
        calls = instruments().llm_calls
        if not self.refresh:
            with self.pool.connection() as conn:
                row = conn.execute(
                    "SELECT output FROM llm_cache WHERE model = %s AND prompt_version = %s AND input_hash = %s", key
                ).fetchone()
            if row is not None:
                try:
                    cached = response_model.model_validate(row[0])
                except ValidationError:
                    pass  # the response model changed: ask again
                else:
                    calls.labels(self.model, "cached").inc()
                    return cached
        self.limiter.wait()
        self._calls.add()
        try:
            result = self.inner.complete(prompt, response_model)
        except Exception:
            calls.labels(self.model, "error").inc()
            raise
        calls.labels(self.model, "ok").inc()
        with self.pool.connection() as conn:
            conn.execute(
                "INSERT INTO llm_cache (model, prompt_version, input_hash, output, thread_id)"
                " VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (model, prompt_version, input_hash)"
                " DO UPDATE SET output = EXCLUDED.output, thread_id = EXCLUDED.thread_id",
                (*key, Jsonb(result.model_dump(mode="json")), self.thread_id),
            )
        return result
