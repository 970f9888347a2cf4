"""The one place where settings become adapters. Everything is built on first use, never at
import time, so forked worker processes open their own connections."""

from __future__ import annotations

import os
import socket
from functools import cached_property

import psycopg
import redis
from celery import Celery
from psycopg_pool import ConnectionPool

from adapters import services
from adapters.postgres import PostgresStore, PostgresThreadLog, make_pool
from adapters.redis_stream import RedisDoorbell, RedisEventSink, RedisEventStream
from memory.ports import TransientError
from schemas.settings import Settings

# Failures a later attempt can fix; everything else is a bug or bad input and is not retried.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    psycopg.OperationalError,
    redis.ConnectionError,
    redis.TimeoutError,
)


class Container:
    def __init__(self, settings: Settings, urls: services.ServiceUrls | None = None, *, start_services: bool = True):
        self.settings = settings
        self._urls = urls
        self._start_services = start_services

    @cached_property
    def urls(self) -> services.ServiceUrls:
        return self._urls or services.resolve(self.settings, start=self._start_services)

    @cached_property
    def pool(self) -> ConnectionPool:
        return make_pool(self.urls.database_url, self.settings.db_pool_size, timeout_s=self.settings.db_timeout_s)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.urls.redis_url, socket_keepalive=True, health_check_interval=30)

    @cached_property
    def store(self) -> PostgresStore:
        return PostgresStore(self.pool)

    @cached_property
    def thread_log(self) -> PostgresThreadLog:
        return PostgresThreadLog(self.pool, self.settings.stream_key)

    @cached_property
    def stream(self) -> RedisEventStream:
        return RedisEventStream(self.redis, self.settings.stream_key, self.settings.consumer_group)

    @cached_property
    def sink(self) -> RedisEventSink:
        return RedisEventSink(self.redis, self.settings.stream_key)

    @cached_property
    def celery(self) -> Celery:
        from workers.celery_app import create_celery

        return create_celery(self.settings, self.urls.redis_url)

    @cached_property
    def doorbell(self) -> RedisDoorbell:
        from workers.celery_app import ring_thread

        app = self.celery
        return RedisDoorbell(self.redis, lambda tid: ring_thread(app, tid), self.settings.doorbell_dedupe_s)

    @cached_property
    def embedder(self):  # noqa: ANN201
        from adapters.embedders import CachedEmbedder, MiniLMEmbedder, OpenAIEmbedder

        s = self.settings
        inner = (
            OpenAIEmbedder(s.embedding_model, s.embedding_dim, s.llm_api_key, s.llm_base_url)
            if s.embedding_provider == "openai"
            else MiniLMEmbedder()
        )
        return CachedEmbedder(inner, self.pool)

    @cached_property
    def query_embedder(self):  # noqa: ANN201
        from adapters.embedders import QueryEmbedder

        return QueryEmbedder(self.embedder.inner)

    @cached_property
    def offline_llm(self):  # noqa: ANN201
        from memory.offline_llm import OfflineLLM

        llm = OfflineLLM(self.embedder)
        llm.model = f"{OfflineLLM.model}+{self.embedder.model}"  # its output depends on the embedder
        return llm

    def llm(self, queue: str, *, refresh: bool = False, offline: bool = False):  # noqa: ANN201
        """The LLM for a queue: the configured endpoint, or the offline one (no key, or as the
        last resort when the endpoint keeps failing), behind the output cache."""
        from adapters.llm import CachedLLM, OpenAILLM, RateLimiter

        s = self.settings
        if s.llm_api_key and not offline:
            inner = OpenAILLM(s.llm_model, s.llm_api_key, s.llm_base_url)
        else:
            inner = self.offline_llm
        return CachedLLM(
            inner,
            self.pool,
            self._limiters.setdefault(queue, RateLimiter(s.llm_rate_limits.get(queue, 0))),
            refresh=refresh,
        )

    @cached_property
    def _limiters(self) -> dict:
        return {}

    @cached_property
    def projections(self):  # noqa: ANN201
        from adapters.projections import PostgresProjections

        return PostgresProjections(self.pool)

    @cached_property
    def seg_config(self):  # noqa: ANN201
        from memory.segmentation import SegmenterConfig

        return SegmenterConfig(time_gap_hours=self.settings.time_gap_hours)

    @cached_property
    def summary_policy(self):  # noqa: ANN201
        from memory.episodes import SummaryPolicy

        s = self.settings
        return SummaryPolicy(s.running_summary_every, s.running_summary_tokens, s.chunk_summary_every)

    @cached_property
    def processor(self):  # noqa: ANN201
        from memory.pipeline import ThreadProcessor
        from workers.celery_app import enqueue_attachment, enqueue_summary

        app = self.celery
        return ThreadProcessor(
            self.projections,
            self.embedder,
            self.seg_config,
            self.summary_policy,
            lambda thread_id, generation, job: enqueue_summary(app, thread_id, generation, job),
            self.thread_log.advance_cursor_in,
            self.settings.stream_key,
            enqueue_attachment=lambda event_id, position: enqueue_attachment(app, event_id, position),
        )

    # --- attachments ---------------------------------------------------------------------------
    @cached_property
    def attachment_store(self):  # noqa: ANN201
        from adapters.attachments_pg import PostgresAttachmentStore

        return PostgresAttachmentStore(self.pool)

    @cached_property
    def blobs(self):  # noqa: ANN201
        from adapters.blobs import LocalBlobStore

        return LocalBlobStore(self.settings.resolved_blob_dir)

    @cached_property
    def fetcher(self):  # noqa: ANN201
        from adapters.fetch import FetchLimits, UrlFetcher

        s = self.settings
        return UrlFetcher(
            FetchLimits(
                s.attachment_max_bytes,
                s.attachment_fetch_timeout_s,
                s.attachment_allow_private_urls,
                s.attachment_file_root,
                s.attachment_ca_file,
            )
        )

    @cached_property
    def image_reader(self):  # noqa: ANN201
        from adapters.images import PillowImageReader

        return PillowImageReader(self.settings.attachment_max_pixels)

    @cached_property
    def ocr(self):  # noqa: ANN201
        from adapters.images import RapidOcr

        return RapidOcr(self.image_reader, self.settings.ocr_max_side, self.settings.ocr_threads)

    @cached_property
    def vision(self):  # noqa: ANN201
        """The configured vision model, or None (descriptions then come from OCR and metadata)."""
        from adapters.llm import OpenAIVision

        s = self.settings
        if not s.vision_model:
            return None
        return OpenAIVision(s.vision_model, s.vision_api_key or s.llm_api_key, s.vision_base_url or s.llm_base_url)

    def attachment_job(self, *, offline: bool = False):  # noqa: ANN201
        """The attachment handler; `offline` (the last attempt) leaves out the remote models."""
        from adapters.documents import DocumentReader
        from adapters.images import guess_binary
        from memory.attachments import Analyzer, AttachmentJob

        s = self.settings
        analyzer = Analyzer(
            images=self.image_reader,
            ocr=self.ocr,
            documents=DocumentReader(s.attachment_max_pages, s.attachment_max_text_chars),
            llm=self.llm("attachments", offline=offline),
            count=self.token_counter.count,
            chunk_tokens=s.attachment_chunk_tokens,
            vision=None if offline else self.vision,
        )
        return AttachmentJob(self.attachment_store, self.blobs, self.fetcher, analyzer, self.embedder, guess_binary)

    @cached_property
    def fact_store(self):  # noqa: ANN201
        from adapters.facts_pg import PostgresFactStore

        return PostgresFactStore(self.pool)

    @cached_property
    def mem0(self):  # noqa: ANN201
        from adapters.mem0_store import Mem0Store

        s = self.settings
        return Mem0Store(
            self.pool,
            s.data_dir,
            self.embedder,
            llm_api_key=s.llm_api_key,
            llm_base_url=s.llm_base_url,
            llm_model=s.llm_model,
            query_embedder=self.query_embedder,
        )

    @cached_property
    def reader(self):  # noqa: ANN201
        from adapters.read_pg import PostgresReader

        return PostgresReader(self.pool, self.settings.vector_dim)

    @cached_property
    def recall(self):  # noqa: ANN201
        """recall(user_id, query, scope=, limit=, thread_id=) -> RecallResult."""
        from memory.recall import Recall

        return Recall(self.reader, self.query_embedder, self.mem0 if self.settings.recall_mem0 else None)

    @cached_property
    def api_keys(self):  # noqa: ANN201
        from adapters.api_keys import ApiKeys

        return ApiKeys(self.pool)

    @cached_property
    def token_counter(self):  # noqa: ANN201
        from memory.tokens import default_counter

        return default_counter()

    def build_context(self, thread_id: str, user_id: str, query: str | None = None, **kw):  # noqa: ANN003, ANN201
        """The bundle for one turn of a bot: see memory/context.py."""
        from memory.context import build_context
        from schemas.read import Budgets

        s = self.settings
        kw.setdefault(
            "budgets",
            Budgets(
                total=s.context_max_tokens,
                system=s.context_budget_system,
                summaries=s.context_budget_summaries,
                recent_turns=s.context_budget_recent_turns,
                snippets=s.context_budget_snippets,
            ),
        )
        return build_context(
            self.reader, self.recall, self.token_counter, thread_id=thread_id, user_id=user_id, query=query, **kw
        )

    def close(self) -> None:
        if "pool" in self.__dict__:
            self.pool.close()
        if "redis" in self.__dict__:
            self.redis.close()


def process_name(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def open_memory(settings: Settings | None = None) -> Container:
    """The read path for a bot in-process: `memory.build_context(...)`, `memory.recall(...)`.
    Settings from CHATMEM_* / .env; the embedded services when no URL is set."""
    from schemas.settings import load_settings

    return Container(settings or load_settings())
