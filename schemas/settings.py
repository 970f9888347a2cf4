"""The one typed settings object. Every knob is a `CHATMEM_*` environment variable (or a line
in `.env`); `.env.example` documents each one and a test keeps the two in step."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "CHATMEM_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="forbid",
        frozen=True,
    )

    # --- services -------------------------------------------------------------------------
    data_dir: Path = Field(
        Path(".chatmem"),
        description="Folder for the embedded Postgres and Redis data, the publish spool and logs.",
    )
    database_url: str | None = Field(
        None, description="Postgres (with pgvector) URL. Unset: the embedded Postgres under data_dir."
    )
    redis_url: str | None = Field(
        None, description="Redis URL (broker and events stream). Unset: the embedded Redis under data_dir."
    )
    embedded_redis_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the embedded Redis on 127.0.0.1; 0 picks a free one once. It asks for "
        "a password, made at its first start and kept in data_dir/redis/redis.conf.",
    )
    embedded_skip_cpu_check: bool = Field(
        False,
        description="Load the package's pgvector in the embedded Postgres even when the CPU seems to lack "
        "what it needs (x86-64-v3; SVE on Linux ARM), for VMs that hide CPU flags; the vector self-check still runs.",
    )
    embedded_pgvector: Literal["auto", "package", "build"] = Field(
        "auto",
        description="Which pgvector the embedded Postgres loads. auto: the package's where this CPU runs it, "
        "else one compiled here once (a C compiler and make are needed; docs/platforms.md); package: always "
        "the package's (refused on a CPU without what it needs); build: always one compiled here.",
    )
    embedded_pgvector_source: str | None = Field(
        None,
        description="A path or URL of pgvector's source tarball to compile from, for a machine without "
        "internet: the same file chatmem pins (its SHA-256 is checked). Unset: Debian's copy, fetched once.",
    )
    db_pool_size: int = Field(4, ge=1, description="Postgres connections per process.")
    db_timeout_s: float = Field(
        30.0, gt=0, description="How long to wait for a Postgres connection before the work is retried."
    )

    # --- events stream & ingest -----------------------------------------------------------
    stream_key: str = Field("chatmem:events", description="Redis stream that bots publish events to.")
    consumer_group: str = Field("chatmem-ingest", description="Consumer group of the ingest consumers.")
    ingest_batch_size: int = Field(1000, ge=1, le=10000, description="Stream entries read per batch.")
    ingest_block_ms: int = Field(500, ge=1, description="How long one read waits for new entries.")
    ingest_claim_idle_ms: int = Field(
        30_000, ge=100, description="Pending entries idle this long are reclaimed from a dead consumer."
    )
    ingest_trim_every_s: float = Field(
        5.0, gt=0, description="How often the stream is trimmed below the committed watermark."
    )
    max_text_chars: int = Field(
        32_000, ge=1, description="Longest accepted message text; longer events are dead-lettered."
    )
    max_data_uri_bytes: int = Field(
        65_536, ge=0, description="Largest inline data: URI accepted as an attachment reference."
    )
    max_future_skew_s: float = Field(
        600.0,
        ge=0,
        description="An event dated further ahead of ingest than this is logged at ingest time (original kept).",
    )
    min_occurred_at: datetime = Field(
        datetime(1980, 1, 1, tzinfo=UTC),
        description="An event dated before this is logged at ingest time (original kept).",
    )

    # --- privacy ---------------------------------------------------------------------------
    encrypt_events: bool = Field(
        True,
        description="Seal the content of logged events with a data key per user and thread, so erasure "
        "can destroy it (crypto-shredding). Events logged before stay readable as they are.",
    )
    kek: SecretStr | None = Field(
        None,
        description="Key-encryption key (base64 of 32 bytes) that wraps the data keys; every process needs "
        "the same one. Unset: read from kek_file, created there on first use.",
    )
    kek_file: Path | None = Field(
        None, description="File holding the key-encryption key. Unset: data_dir/keys/kek. Back it up."
    )

    retention_days: float | None = Field(
        None,
        gt=0,
        description="Events older than this many days (by occurred_at) are shredded and their projections "
        "rebuilt. Unset: kept until erased.",
    )
    retention_days_by: dict[str, float] = Field(
        default_factory=dict,
        description='Retention per platform or thread, over the global one: {"platform:telegram": 30, '
        '"thread:support-1": 365}; 0 keeps that platform or thread forever. A thread entry wins over its platform.',
    )
    retention_every_s: float = Field(
        3600.0, gt=0, description="How often the sweeper queues the retention job (when any retention is set)."
    )

    # --- publisher ------------------------------------------------------------------------
    publish_buffer_bytes: int = Field(
        1 << 20,
        ge=4096,
        description="Fire-and-forget buffer (the flusher pipe); past it events go straight to the disk spool.",
    )
    spool_dir: Path | None = Field(None, description="Where unsendable events are spooled. Unset: data_dir/spool.")
    spool_max_bytes: int = Field(
        256 << 20,
        ge=4096,
        description="Size limit of each publish spool folder (256 MiB: about 500,000 typical messages). When it "
        "is full, what is spooled is kept and newer events are refused: counted (`chatmem status`, "
        "chatmem_spool_refused) and logged without content; publish_nowait never blocks.",
    )

    # --- workers --------------------------------------------------------------------------
    doorbell_dedupe_s: int = Field(
        60, ge=1, description="A thread's doorbell is rung at most once per this window while pending."
    )
    doorbell_group_size: int = Field(
        8,
        ge=1,
        description="Live threads rung together are handed to one doorbell task in groups of up to this many, "
        "whose new messages are embedded in one model call (larger calls cost less per text). 1: a task per thread.",
    )
    thread_lease_s: int = Field(
        120, ge=5, description="How long a worker may hold a thread before another may take it over."
    )
    apply_batch_size: int = Field(500, ge=1, description="Events applied per step of a doorbell drain.")
    bulk_batches_per_task: int = Field(
        2, ge=1, description="Batches a doorbell task applies to an imported (bulk) thread before it yields the worker."
    )
    task_max_retries: int = Field(8, ge=0, description="Retries of a task after a transient error.")
    log_level: str = Field("INFO", description="Log level of every chatmem process.")
    log_format: str = Field(
        "text",
        pattern="^(text|json)$",
        description="Log format of every chatmem process: text, or json (one object a line, with thread_id, "
        "episode_id and event_id when known).",
    )
    metrics_dir: Path | None = Field(
        None,
        description="Folder where each process writes its Prometheus metrics for /metrics to add up (multiprocess "
        "mode). Unset: data_dir/metrics. Local to the machine or container: never shared between machines.",
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port on which ingest, workers and the sweeper serve their own /metrics (compose: one per "
        "container); 0: none, the API's /metrics covers them through metrics_dir.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address the metrics_port listens on.")
    supervisor_max_restarts: int = Field(
        5, ge=0, description="`chatmem up` gives up on a process that exits more often than this within the window."
    )
    supervisor_restart_window_s: float = Field(
        300.0, gt=0, description="The window (seconds) in which `supervisor_max_restarts` exits count as a crash loop."
    )
    sweeper_facts_after_s: float = Field(
        1800.0,
        gt=0,
        description="The sweeper re-queues an episode's facts job when its final summary is this old (seconds) and "
        "the job has not finished (its worker was killed holding it); longer than one job with all its retries.",
    )
    sweeper_finals_after_s: float = Field(
        300.0,
        gt=0,
        description="The sweeper re-queues a closed episode's final summary once it has been missing this long "
        "(seconds): a job being written must not run twice; longer than one job with a stalled LLM and its retries.",
    )

    # --- models ---------------------------------------------------------------------------
    llm_base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint; unset with no key: the offline LLM."
    )
    llm_api_key: str | None = Field(None, description="Key for the LLM endpoint. Unset: the offline deterministic LLM.")
    llm_model: str = Field("gpt-4o-mini", description="Model name at the LLM endpoint.")
    llm_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest wait for one LLM or vision request; a stalled endpoint then counts as down "
        "(retried with backoff, the last attempt falls back to the offline model).",
    )
    llm_rate_limits: dict[str, int] = Field(
        default_factory=dict,
        description='LLM calls per minute per queue, as JSON, e.g. {"summarize": 60}; missing or 0: no limit.',
    )
    segment_pair_model: bool = Field(
        True,
        description="Among people (no assistant in view), stack the segmenter's pair model, a fine-tuned "
        "all-MiniLM-L6-v2 that reads the words of the turns before a candidate and of the candidate, with the "
        "bag of MLPs; off: the bag alone (no words kept in the segmenter's state unless the LLM assist is on).",
    )
    segment_llm_assist: bool = Field(
        False,
        description="Let the LLM (llm_api_key set) confirm or reject the topic-shift decisions the segmenter's "
        "scorer is unsure of (see segment_llm_band), at the moment it decides; off, or with no key: the offline "
        "segmenter alone.",
    )
    segment_llm_band: float = Field(
        0.1,
        ge=0,
        le=1,
        description="With segment_llm_assist: a decision is unsure, and asked, when the scorer's probability that "
        "the topic continues lies strictly within this distance of the threshold in force (shift_threshold, or the "
        "closed-thread bar after a thanks); 0 asks nothing.",
    )
    segment_llm_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Longest wait for one topic-shift question (the client tries three times); after a failure the "
        "scorer decides alone for a minute. At most thread_lease_s / 6, so a question ends within the lease.",
    )
    embedding_provider: str = Field(
        "minilm",
        pattern="^(minilm|openai|hashing)$",
        description="minilm (offline, 384-d), openai, or hashing (feature hashing of words, embedding_dim wide: "
        "tiny and deterministic, for tests).",
    )
    embedding_backend: str = Field(
        "onnx",
        pattern="^(onnx|torch)$",
        description="How minilm runs: onnx (ONNX Runtime, the file shipped in the package) or torch "
        "(sentence-transformers, the optional `torch` extra). Same model, same vectors (cosine >= 0.999).",
    )
    embedding_model: str = Field("text-embedding-3-small", description="Model name when embedding_provider=openai.")
    embedding_dim: int = Field(1536, ge=1, description="Dimensions when embedding_provider=openai or hashing.")

    # --- episodes and summaries (a thread's `configure` command overrides these) -----------
    time_gap_hours: float = Field(8.0, gt=0, description="A pause longer than this starts a new episode.")
    running_summary_every: int = Field(10, ge=1, description="Messages between running summaries of an episode.")
    running_summary_tokens: int = Field(
        1500, ge=100, description="Unsummarised tokens in an episode that trigger a running summary early."
    )
    chunk_summary_every: int = Field(40, ge=30, le=50, description="Messages per chunk summary (30-50).")
    rollup_fanin: int = Field(4, ge=2, description="Summaries merged into one summary of the next level.")
    rollup_keep: int = Field(4, ge=1, description="Newest summaries of a level that stay unmerged.")

    # --- read path -----------------------------------------------------------------------
    context_max_tokens: int = Field(
        8000,
        ge=1,
        description="Default token budget of build_context. Section budgets that add up to more are fitted to it: "
        "the system text takes what it needs, the largest share the rest.",
    )
    context_budget_system: int = Field(1500, ge=0, description="Tokens for the system/persona text.")
    context_budget_summaries: int = Field(
        2000, ge=0, description="Tokens for the running summary, open loops and higher-level summaries."
    )
    context_budget_recent_turns: int = Field(3000, ge=0, description="Tokens for the most recent turns.")
    context_budget_snippets: int = Field(
        1500, ge=0, description="Tokens for facts, attachment snippets and retrieved earlier messages."
    )
    recall_mem0: bool = Field(True, description="Also search mem0 (semantic fact search) when recalling facts.")
    recall_query_encoder: bool = Field(
        True,
        description="Embed recall queries (for every search, mem0's included) with the fine-tuned query encoder "
        "shipped with all-MiniLM-L6-v2 (only while that model is in use); false: with the model itself.",
    )
    recall_parallel: bool = Field(
        True,
        description="Start recall's turn search on a second pooled connection, beside the summary and fact "
        "searches, and a large scope's nearest turns on a third, when one is free at once; false: one "
        "connection, the searches one after another.",
    )
    api_host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    api_port: int = Field(8765, ge=1, le=65535, description="Port of the HTTP API.")
    mcp_user: str | None = Field(
        None, description="The user `chatmem mcp` serves on stdio (`--user` overrides); HTTP takes it from the API key."
    )
    mcp_host: str = Field("127.0.0.1", description="Address `chatmem mcp --transport http` listens on.")
    mcp_port: int = Field(8766, ge=1, le=65535, description="Port of `chatmem mcp --transport http` (path /mcp).")

    # --- attachments -----------------------------------------------------------------------
    blob_dir: Path | None = Field(
        None, description="Where attachment bytes are stored, by sha256. Unset: data_dir/blobs."
    )
    attachment_max_bytes: int = Field(25_000_000, ge=1, description="Largest attachment fetched or stored.")
    attachment_fetch_timeout_s: float = Field(20.0, gt=0, description="Time limit of one https:// download.")
    attachment_allow_private_urls: bool = Field(
        False, description="Allow https:// URLs that resolve to private, loopback or link-local addresses."
    )
    attachment_file_root: Path | None = Field(
        None, description="If set, file:// attachments must lie under this folder. Unset: any path the worker can read."
    )
    attachment_ca_file: Path | None = Field(
        None, description="Extra CA bundle for https:// downloads (a private CA). Unset: the system's."
    )
    attachment_max_pixels: int = Field(40_000_000, ge=1, description="Largest image (width x height) decoded.")
    attachment_max_pages: int = Field(300, ge=1, description="Most PDF pages (or presentation slides) read.")
    attachment_max_text_chars: int = Field(2_000_000, ge=1, description="Most characters of text kept per document.")
    attachment_max_pdf_pages: int = Field(
        10_000,
        ge=1,
        description="A PDF with more pages is refused before its pages are walked (a page-tree bomb); "
        "of a smaller one, the first attachment_max_pages are read.",
    )
    attachment_max_decoded_bytes: int = Field(
        100_000_000,
        ge=1_000_000,
        description="Largest size one compressed PDF stream or embedded image, or all the parts of a Word "
        "document or spreadsheet together, may inflate to (a decompression bomb).",
    )
    attachment_analysis_timeout_s: float = Field(
        120.0,
        gt=0,
        le=600,
        description="Time limit of reading one attachment (decoding, OCR, PDF text). The reading runs in a helper "
        "process that is killed past the limit; the file then fails with that reason.",
    )
    attachment_chunk_tokens: int = Field(250, ge=50, le=2000, description="Target size of a document chunk.")
    attachment_max_retries: int = Field(
        5, ge=0, description="Retries of an attachment after a transient error (an unreachable URL, a model down)."
    )
    attachment_retry_backoff_s: float = Field(
        5.0, ge=0, description="First retry delay of an attachment job; doubles on each retry (at most 10 minutes)."
    )
    ocr_threads: int = Field(
        1, ge=1, le=64, description="CPU threads one OCR call uses (one leaves cores to messages)."
    )
    attachment_worker_nice: int = Field(
        10, ge=0, le=19, description="CPU niceness of a worker that serves only the attachments queue (0: none)."
    )
    ocr_max_side: int = Field(
        960, ge=320, le=4000, description="Images are scaled so their longer side is at most this for OCR."
    )
    vision_model: str | None = Field(
        None, description="OpenAI-compatible vision model for image descriptions. Unset: caption + OCR + metadata."
    )
    vision_base_url: str | None = Field(None, description="Endpoint of the vision model. Unset: llm_base_url.")
    vision_api_key: str | None = Field(None, description="Key for the vision endpoint. Unset: llm_api_key.")
    transcription_model: str | None = Field(
        None,
        description="OpenAI-compatible speech-to-text model (whisper-1, gpt-4o-mini-transcribe, a local "
        "whisper server's) for voice notes and audio files. Unset: recordings are not read.",
    )
    transcription_base_url: str | None = Field(
        None, description="Endpoint of the speech-to-text model. Unset: llm_base_url."
    )
    transcription_api_key: str | None = Field(
        None, description="Key for the speech-to-text endpoint. Unset: llm_api_key."
    )

    # --- chat platforms ---------------------------------------------------------------------
    telegram_bot_token: SecretStr | None = Field(
        None,
        description="Token of the Telegram bot whose files (telegram:file/<file_id> attachments) the attachments "
        "worker fetches through the Bot API. Never stored in events, logs or the database.",
    )
    telegram_api_url: str = Field(
        "https://api.telegram.org",
        description="Base URL of the Telegram Bot API (a self-hosted Bot API server, say); trusted configuration.",
    )

    def as_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment (based on `base`, minus other CHATMEM_* keys) that reproduces these settings
        in a child process."""
        import json

        env = {
            k: v for k, v in (base if base is not None else os.environ).items() if not k.upper().startswith(ENV_PREFIX)
        }
        for name, value in self.model_dump(mode="json").items():
            secret = getattr(self, name)
            if isinstance(secret, SecretStr):  # the JSON dump masks it; a child needs the value
                value = secret.get_secret_value()
            if value is not None:
                env[ENV_PREFIX + name.upper()] = json.dumps(value) if isinstance(value, dict | list) else str(value)
        return env

    @property
    def vector_dim(self) -> int:
        return 384 if self.embedding_provider == "minilm" else self.embedding_dim

    @property
    def resolved_blob_dir(self) -> Path:
        return self.blob_dir or self.data_dir / "blobs"

    @property
    def resolved_spool_dir(self) -> Path:
        return self.spool_dir or self.data_dir / "spool"

    @property
    def resolved_metrics_dir(self) -> Path:
        return self.metrics_dir or self.data_dir / "metrics"

    @property
    def supervisor_state_file(self) -> Path:
        """Where `chatmem up` keeps the state of its processes for `chatmem status`."""
        return self.data_dir / "supervisor.json"

    @field_validator("retention_days_by")
    @classmethod
    def _retention_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key, days in value.items():
            kind, _, name = key.partition(":")
            if kind not in ("platform", "thread") or not name:
                raise ValueError(f"{key!r}: keys are platform:<name> or thread:<id>")
            if days < 0:
                raise ValueError(f"{key!r}: days must be 0 (keep forever) or more")
        return value

    @property
    def retention_set(self) -> bool:
        return self.retention_days is not None or any(d > 0 for d in self.retention_days_by.values())

    @model_validator(mode="after")
    def _segment_question_within_lease(self) -> Settings:
        # The segment worker waits for the answer under the thread's lease, renewed every quarter
        # of it: three tries must end before the lease runs out, or another worker takes over.
        if self.segment_llm_assist and self.segment_llm_timeout_s > self.thread_lease_s / 6:
            raise ValueError("segment_llm_timeout_s must be at most thread_lease_s / 6")
        return self

    @model_validator(mode="after")
    def _reject_unknown_env(self) -> Settings:
        # pydantic-settings silently ignores unknown prefixed variables; a typo such as
        # CHATMEM_DATABSE_URL would then fall back to the embedded database without a word.
        known = {ENV_PREFIX + name.upper() for name in type(self).model_fields}
        unknown = sorted(k for k in os.environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in known)
        if unknown:
            raise ValueError(f"unknown settings in the environment: {', '.join(unknown)}")
        return self


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]
