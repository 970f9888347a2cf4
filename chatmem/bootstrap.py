"""The composition root: the one place where settings become adapters and adapters are handed to
the domain. It sits above adapters, producers and workers; entry points (api/, bench/) call it.
Everything is built on first use, never at import time, so forked worker processes open their
own connections."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery

from chatmem.adapters import datadir, services
from chatmem.adapters.celery_queue import (
    create_celery,
    enqueue_attachment,
    enqueue_episode_facts,
    enqueue_summary,
    queue_depths,
    ring_thread,
    ring_threads,
)
from chatmem.adapters.crypto import kek_from_setting, load_or_create_kek
from chatmem.adapters.keys_pg import EventKeys
from chatmem.adapters.postgres import PinningPool, PostgresStore, PostgresThreadLog, make_pool
from chatmem.adapters.redis_stream import RedisDoorbell, RedisEventSink, RedisEventStream
from chatmem.schemas.settings import Settings

if TYPE_CHECKING:  # types only: the modules behind them load models or big libraries
    from chatmem.adapters.analysis_runner import IsolatedReader
    from chatmem.adapters.api_keys import ApiKeys
    from chatmem.adapters.attachments_pg import PostgresAttachmentStore
    from chatmem.adapters.blobs import LocalBlobStore
    from chatmem.adapters.browse_pg import PostgresBrowser
    from chatmem.adapters.cache_uses import CacheUses
    from chatmem.adapters.context_pg import PostgresContextReader
    from chatmem.adapters.embedders import CachedEmbedder, QueryEmbedder, SwitchingEmbedder
    from chatmem.adapters.embedding_state_pg import EmbedderSpec, EmbeddingState
    from chatmem.adapters.erase_pg import ErasurePlan, PostgresErasure
    from chatmem.adapters.export_pg import PostgresExport
    from chatmem.adapters.facts_pg import PostgresFactStore
    from chatmem.adapters.fetch import UrlFetcher
    from chatmem.adapters.images import PillowImageReader, RapidOcr
    from chatmem.adapters.llm import CachedLLM, OpenAITranscriber, OpenAIVision, RateLimiter
    from chatmem.adapters.mem0_store import Mem0Store
    from chatmem.adapters.notices_pg import PostgresNotices
    from chatmem.adapters.progress_pg import PostgresProgress
    from chatmem.adapters.projections import PostgresProjections
    from chatmem.adapters.read_pg import ReadConnections
    from chatmem.adapters.recall_pg import PostgresRecallReader
    from chatmem.adapters.summaries_pg import PostgresSummaryStore
    from chatmem.memory.attachments import AttachmentJob
    from chatmem.memory.boundary_llm import AssistFactory, Cooldown
    from chatmem.memory.boundary_scorer import BoundaryScorer
    from chatmem.memory.episodes import Job, SummaryPolicy
    from chatmem.memory.jobs import Jobs
    from chatmem.memory.offline_llm import OfflineLLM
    from chatmem.memory.pipeline import ThreadProcessor
    from chatmem.memory.ports import LLM, Embedder
    from chatmem.memory.recall import Recall
    from chatmem.memory.replay import ReplayFailed, ReplayResult
    from chatmem.memory.segmentation import SegmenterConfig
    from chatmem.memory.sweeper import Sweeper
    from chatmem.memory.tokens import TokenCounter
    from chatmem.schemas.read import ContextBundle, KnownAbout, SummaryView
    from chatmem.schemas.records import LoggedEvent

log = logging.getLogger(__name__)

# The module Celery loads in a worker to register the tasks.
TASK_MODULES = ("chatmem.workers.tasks",)
# Rebuilds in flight per replay process (Container.replay_many).
REPLAY_OVERLAP = 2
# The user Container.warm_up reads as: no one's memory, so the read loads everything and finds nothing.
WARM_UP_USER = "chatmem-warm-up"


class _RecordingProjections:
    """The projections, noting the attachment references each applied plan holds (what the log
    says the thread's attachments are, for `check_replay`)."""

    def __init__(self, inner: PostgresProjections):
        self.inner = inner
        self.attachments: list[tuple[str, int, str, dict]] = []

    def apply(self, plan: Any, **kw: Any) -> Any:
        self.attachments += plan.attachments
        return self.inner.apply(plan, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Deferred:
    """mem0 for the jobs, built on its first use: a summarize or segment worker never writes facts,
    and building mem0 (its imports, its client, its tables) took a quarter of a summarize worker's
    first seconds."""

    def __init__(self, build: Callable[[], Any]):
        self._make = build
        self._built: Any = None
        self._lock = threading.Lock()  # overlapping rebuilds (replay_many) share it

    def _build(self) -> Any:
        with self._lock:
            if self._built is None:
                self._built = self._make()
            return self._built

    def add(self, text: str, *, user_id: str, run_id: str, metadata: dict[str, Any]) -> list[str]:
        return self._build().add(text, user_id=user_id, run_id=run_id, metadata=metadata)

    def find(self, *, user_id: str, fact_id: int) -> list[str]:
        return self._build().find(user_id=user_id, fact_id=fact_id)

    def delete(self, memory_id: str) -> None:
        self._build().delete(memory_id)


class Container:
    def __init__(self, settings: Settings, urls: services.ServiceUrls | None = None, *, start_services: bool = True):
        self.settings = settings
        datadir.private(settings.data_dir)
        self._urls = urls
        self._start_services = start_services
        self._query_embedders: dict[EmbedderSpec, QueryEmbedder] = {}
        self._encoder: QueryEmbedder | None = None  # recall's query encoder, once loaded
        self._query_lock = threading.Lock()

    @cached_property
    def urls(self) -> services.ServiceUrls:
        return self._urls or services.resolve(self.settings, start=self._start_services)

    @cached_property
    def pool(self) -> PinningPool:
        return make_pool(self.urls.database_url, self.settings.db_pool_size, timeout_s=self.settings.db_timeout_s)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.urls.redis_url, socket_keepalive=True, health_check_interval=30)

    @cached_property
    def event_keys(self) -> EventKeys:
        s = self.settings

        def load_kek() -> bytes:
            if s.kek is not None:
                return kek_from_setting(s.kek.get_secret_value())
            return load_or_create_kek(s.kek_file or s.data_dir / "keys" / "kek")

        return EventKeys(load_kek, seal=s.encrypt_events)

    @cached_property
    def store(self) -> PostgresStore:
        return PostgresStore(self.pool, self.event_keys)

    @cached_property
    def thread_log(self) -> PostgresThreadLog:
        return PostgresThreadLog(self.pool, self.settings.stream_key, self.event_keys)

    @cached_property
    def stream(self) -> RedisEventStream:
        return RedisEventStream(self.redis, self.settings.stream_key, self.settings.consumer_group)

    @cached_property
    def sink(self) -> RedisEventSink:
        return RedisEventSink(self.redis, self.settings.stream_key)

    @cached_property
    def celery(self) -> Celery:
        app = create_celery(self.settings, self.urls.redis_url, include=TASK_MODULES)
        settings = self.settings
        # Each worker process builds its own container (its own connections) from the same settings.
        app.conf.chatmem_wiring = lambda: Container(settings, start_services=False)
        return app

    @cached_property
    def doorbell(self) -> RedisDoorbell:
        app = self.celery
        return RedisDoorbell(
            self.redis,
            lambda tid, bulk: ring_thread(app, tid, bulk),
            self.settings.doorbell_dedupe_s,
            send_group=lambda tids: ring_threads(app, tids),
            group_size=self.settings.doorbell_group_size,
        )

    @cached_property
    def embedding_state(self) -> EmbeddingState:
        from chatmem.adapters.embedding_state_pg import EmbedderSpec, EmbeddingState

        s = self.settings
        if s.embedding_provider == "openai":
            spec = EmbedderSpec("openai", s.embedding_model, s.embedding_dim)
        elif s.embedding_provider == "hashing":
            spec = EmbedderSpec("hashing", f"hashing-{s.embedding_dim}", s.embedding_dim)
        else:
            from chatmem.adapters.embedders import MINILM

            spec = EmbedderSpec("minilm", MINILM, 384)
        return EmbeddingState(self.pool, spec)

    def inner_embedder(self, spec: EmbedderSpec) -> Embedder:
        """The model behind a spec, loaded once per process."""
        from chatmem.adapters.embedders import HashingEmbedder, OpenAIEmbedder, minilm_embedder

        if spec not in self._inner_embedders:
            s = self.settings
            self._inner_embedders[spec] = (
                OpenAIEmbedder(spec.model, spec.dim, s.llm_api_key, s.llm_base_url)
                if spec.provider == "openai"
                else HashingEmbedder(spec.dim)
                if spec.provider == "hashing"
                else minilm_embedder(s.embedding_backend)
            )
        return self._inner_embedders[spec]

    @cached_property
    def _inner_embedders(self) -> dict[EmbedderSpec, Embedder]:
        return {}

    @cached_property
    def embedder(self) -> SwitchingEmbedder:
        """The pipeline's embedder: the model in use (it changes when `chatmem reembed`
        switches), behind the shared vector cache."""
        from chatmem.adapters.embedders import CachedEmbedder, SwitchingEmbedder

        state = self.embedding_state
        # Read on every use (one small query a batch): a batch after a switch must not be embedded
        # with the old model, or its vectors would not match the generation it lands in.
        return SwitchingEmbedder(state.spec, lambda spec: CachedEmbedder(self.inner_embedder(spec), self.pool), 0.0)

    @cached_property
    def query_embedder(self) -> SwitchingEmbedder:
        from chatmem.adapters.embedders import SwitchingEmbedder

        return SwitchingEmbedder(self.embedding_state.spec, self.query_embedder_for, 2.0)

    def query_embedder_for(self, spec: EmbedderSpec) -> QueryEmbedder:
        """One query embedder (and LRU) per model, shared by recall and mem0's search: a recall
        that also searches facts embeds its query once, not twice."""
        from chatmem.adapters.embedders import QueryEmbedder

        with self._query_lock:
            if spec not in self._query_embedders:
                self._query_embedders[spec] = QueryEmbedder(self.inner_embedder(spec))
            return self._query_embedders[spec]

    @cached_property
    def recall_query_embedder(self) -> SwitchingEmbedder:
        """Recall's query vector, for every search it makes: the fine-tuned query encoder while the
        model in use is all-MiniLM-L6-v2 (its vectors live in that model's space), else the model."""
        from chatmem.adapters.embedders import SwitchingEmbedder

        return SwitchingEmbedder(self.embedding_state.spec, self.recall_query_embedder_for, 2.0)

    def recall_query_embedder_for(self, spec: EmbedderSpec) -> Embedder:
        """One per model, shared by recall and mem0's fact search, so a recall embeds its query once."""
        from chatmem.adapters.embedders import QUERY_ONNX_FILE, QueryEmbedder, recall_query_encoder

        # A source checkout without the file (it is written by `make train-ranker`) still recalls.
        if spec.provider == "minilm" and self.settings.recall_query_encoder and QUERY_ONNX_FILE.is_file():
            with self._query_lock:
                if self._encoder is None:
                    self._encoder = QueryEmbedder(recall_query_encoder())
                return self._encoder
        return self.query_embedder_for(spec)

    @cached_property
    def configured_embedder(self) -> CachedEmbedder:
        """mem0 keeps the model its collection was made with (a re-embedding does not move it)."""
        from chatmem.adapters.embedders import CachedEmbedder

        return CachedEmbedder(self.inner_embedder(self.embedding_state.configured), self.pool)

    @cached_property
    def offline_llm(self) -> OfflineLLM:
        from chatmem.memory.offline_llm import OfflineLLM

        llm = OfflineLLM(self.embedder)
        llm.model = f"{OfflineLLM.model}+{self.embedder.model}"  # its output depends on the embedder
        return llm

    def llm(
        self,
        queue: str,
        *,
        refresh: bool = False,
        offline: bool = False,
        thread_id: str | None = None,
        timeout_s: float | None = None,
    ) -> CachedLLM:
        """The LLM for a queue: the configured endpoint, or the offline one (no key, or as the
        last resort when the endpoint keeps failing), behind the output cache."""
        from chatmem.adapters.llm import CachedLLM, OpenAILLM, RateLimiter

        s = self.settings
        inner: LLM = (
            OpenAILLM(s.llm_model, s.llm_api_key, s.llm_base_url, timeout_s or s.llm_timeout_s)
            if s.llm_api_key and not offline
            else self.offline_llm
        )
        return CachedLLM(
            inner,
            self.pool,
            self._limiters.setdefault(queue, RateLimiter(s.llm_rate_limits.get(queue, 0))),
            refresh=refresh,
            thread_id=thread_id,
            uses=self.cache_uses,
        )

    @cached_property
    def _limiters(self) -> dict[str, RateLimiter]:
        return {}

    @cached_property
    def cache_uses(self) -> CacheUses:
        """Which cached model answers this process's rebuilds use (erasure, retention and
        deletions keep the rest of a thread's answers through its rebuild: adapters/cache_uses.py)."""
        from chatmem.adapters.cache_uses import CacheUses

        return CacheUses()

    def boundary_assist(self, *, refresh: bool = False) -> AssistFactory | None:
        """The segmenter's LLM assist (memory/boundary_llm.py), per thread, or None: off by
        default, and never over the offline LLM, which has nothing to add to the scorer."""
        from chatmem.memory.boundary_llm import LLMBoundaryAssist

        s = self.settings
        if not self._segment_assist_on:
            return None
        llm = self.llm("segment", refresh=refresh, timeout_s=s.segment_llm_timeout_s)
        cooldown = self._assist_cooldown
        return lambda thread_id: LLMBoundaryAssist(llm.for_thread(thread_id), s.segment_llm_band, cooldown)

    @cached_property
    def _segment_assist_on(self) -> bool:
        s = self.settings
        if s.segment_llm_assist and not s.llm_api_key:
            log.warning("segment_llm_assist is on but no LLM endpoint is configured: segmentation stays offline")
        return s.segment_llm_assist and bool(s.llm_api_key)

    @cached_property
    def _assist_cooldown(self) -> Cooldown:
        # One per process: an endpoint found down is down for every thread.
        from chatmem.memory.boundary_llm import Cooldown

        return Cooldown()

    @cached_property
    def projections(self) -> PostgresProjections:
        from chatmem.adapters.projections import PostgresProjections

        return PostgresProjections(self.pool)

    @cached_property
    def summary_store(self) -> PostgresSummaryStore:
        from chatmem.adapters.summaries_pg import PostgresSummaryStore

        return PostgresSummaryStore(self.pool, self.event_keys)

    @cached_property
    def seg_config(self) -> SegmenterConfig:
        from chatmem.memory.segmentation import SegmenterConfig

        return SegmenterConfig(time_gap_hours=self.settings.time_gap_hours)

    @cached_property
    def boundary_scorer(self) -> BoundaryScorer:
        """The shipped scorer; among people with the pair model stacked on the bag unless
        `segment_pair_model` is off (memory/boundary_scorer.py)."""
        from chatmem.adapters.boundary_pair import with_pair_model
        from chatmem.adapters.pair_cache_pg import CachedPairEncoder
        from chatmem.memory.boundary_scorer import shipped_scorer

        pool, uses = self.pool, self.cache_uses
        return with_pair_model(
            shipped_scorer(),
            self.settings.segment_pair_model,
            cache=lambda model: CachedPairEncoder(model, pool, uses=uses),
        )

    @cached_property
    def summary_policy(self) -> SummaryPolicy:
        from chatmem.memory.episodes import SummaryPolicy

        s = self.settings
        return SummaryPolicy(s.running_summary_every, s.running_summary_tokens, s.chunk_summary_every)

    @cached_property
    def processor(self) -> ThreadProcessor:
        from chatmem.memory.pipeline import ThreadProcessor

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
            assist=self.boundary_assist(),
            renew_lease=self.thread_log.renew_lease,
            scorer=self.boundary_scorer,
        )

    # --- attachments ---------------------------------------------------------------------------
    @cached_property
    def attachment_store(self) -> PostgresAttachmentStore:
        from chatmem.adapters.attachments_pg import PostgresAttachmentStore

        return PostgresAttachmentStore(self.pool)

    @cached_property
    def blobs(self) -> LocalBlobStore:
        from chatmem.adapters.blobs import LocalBlobStore

        return LocalBlobStore(self.settings.resolved_blob_dir)

    @cached_property
    def fetcher(self) -> UrlFetcher:
        from pathlib import Path

        from chatmem.adapters.fetch import FetchLimits, TelegramFiles, UrlFetcher

        s = self.settings
        own = (
            s.data_dir,
            s.resolved_blob_dir,
            s.resolved_spool_dir,
            *([s.kek_file] if s.kek_file else []),
            Path(".env"),
        )
        return UrlFetcher(
            FetchLimits(
                s.attachment_max_bytes,
                s.attachment_fetch_timeout_s,
                s.attachment_allow_private_urls,
                s.attachment_file_root,
                s.attachment_ca_file,
                refused=own,
            ),
            telegram=TelegramFiles(s.telegram_api_url, s.telegram_bot_token),
        )

    @cached_property
    def image_reader(self) -> PillowImageReader:
        from chatmem.adapters.images import PillowImageReader

        return PillowImageReader(self.settings.attachment_max_pixels)

    @cached_property
    def ocr(self) -> RapidOcr:
        from chatmem.adapters.images import RapidOcr

        return RapidOcr(self.image_reader, self.settings.ocr_max_side, self.settings.ocr_threads)

    @cached_property
    def vision(self) -> OpenAIVision | None:
        """The configured vision model, or None (descriptions then come from OCR and metadata)."""
        from chatmem.adapters.llm import OpenAIVision

        s = self.settings
        if not s.vision_model:
            return None
        return OpenAIVision(
            s.vision_model,
            s.vision_api_key or s.llm_api_key,
            s.vision_base_url or s.llm_base_url,
            timeout_s=1.5 * s.llm_timeout_s,  # an image takes longer than text
        )

    @cached_property
    def transcriber(self) -> OpenAITranscriber | None:
        """The configured speech-to-text model, or None (recordings then fail, saying so)."""
        from chatmem.adapters.llm import OpenAITranscriber

        s = self.settings
        if not s.transcription_model:
            return None
        return OpenAITranscriber(
            s.transcription_model,
            s.transcription_api_key or s.llm_api_key,
            s.transcription_base_url or s.llm_base_url,
            timeout_s=2 * s.llm_timeout_s,  # a recording takes longer than text
        )

    @cached_property
    def analysis_reader(self) -> IsolatedReader:
        """Decoding, OCR and PDF reading, in a helper process killed past the time limit."""
        from chatmem.adapters.analysis_runner import IsolatedReader, ReaderSpec

        s = self.settings
        spec = ReaderSpec(
            max_pixels=s.attachment_max_pixels,
            ocr_max_side=s.ocr_max_side,
            ocr_threads=s.ocr_threads,
            max_pages=s.attachment_max_pages,
            max_chars=s.attachment_max_text_chars,
            max_pdf_pages=s.attachment_max_pdf_pages,
            max_decoded_bytes=s.attachment_max_decoded_bytes,
            log_format=s.log_format,
        )
        return IsolatedReader(spec, s.attachment_analysis_timeout_s)

    def attachment_job(self, *, offline: bool = False) -> AttachmentJob:
        """The attachment handler; `offline` (the last attempt) leaves out the remote models."""
        from chatmem.adapters.documents import DocumentReader
        from chatmem.adapters.images import guess_binary
        from chatmem.memory.attachments import Analyzer, AttachmentJob

        s = self.settings
        analyzer = Analyzer(
            images=self.image_reader,
            ocr=self.ocr,
            documents=DocumentReader(
                s.attachment_max_pages,
                s.attachment_max_text_chars,
                max_pdf_pages=s.attachment_max_pdf_pages,
                max_decoded_bytes=s.attachment_max_decoded_bytes,
            ),
            llm=self.llm("attachments", offline=offline),
            count=self.token_counter.count,
            chunk_tokens=s.attachment_chunk_tokens,
            vision=None if offline else self.vision,
            read=self.analysis_reader,  # reading runs in the helper process, not through the readers above
            # Kept on the last attempt too: speech has no offline stand-in, and an outage then
            # fails the file as "gave up after retries".
            transcriber=self.transcriber,
        )
        # A claim outlives the longest job (the reading is killed at its time limit, then the
        # texts are embedded), and no more: a worker killed mid-job holds the file that long.
        claim_s = int(2 * self.settings.attachment_analysis_timeout_s) + 10
        return AttachmentJob(
            self.attachment_store, self.blobs, self.fetcher, analyzer, self.embedder, guess_binary, claim_s=claim_s
        )

    @cached_property
    def fact_store(self) -> PostgresFactStore:
        from chatmem.adapters.facts_pg import PostgresFactStore

        return PostgresFactStore(self.pool, self.event_keys)

    @cached_property
    def mem0(self) -> Mem0Store:
        from chatmem.adapters.mem0_store import Mem0Store

        s = self.settings
        return Mem0Store(
            self.pool,
            s.data_dir,
            self.configured_embedder,
            llm_api_key=s.llm_api_key,
            llm_base_url=s.llm_base_url,
            llm_model=s.llm_model,
            query_embedder=self.recall_query_embedder_for(self.embedding_state.configured),
        )

    # --- read path ------------------------------------------------------------------------------
    @cached_property
    def read_connections(self) -> ReadConnections:
        """Shared by the readers below: a read's session pins one connection for all of them."""
        from chatmem.adapters.read_pg import ReadConnections

        return ReadConnections(self.pool, parallel=self.settings.recall_parallel)

    @cached_property
    def recall_reader(self) -> PostgresRecallReader:
        from chatmem.adapters.recall_pg import PostgresRecallReader

        query = self.query_embedder
        return PostgresRecallReader(
            self.read_connections,
            lambda: query.model,
            self.embedding_state.configured.model,
        )

    @cached_property
    def context_reader(self) -> PostgresContextReader:
        from chatmem.adapters.context_pg import PostgresContextReader

        return PostgresContextReader(self.read_connections)

    @cached_property
    def browser(self) -> PostgresBrowser:
        """Threads and episodes listings (CLI, HTTP browse routes)."""
        from chatmem.adapters.browse_pg import PostgresBrowser

        return PostgresBrowser(self.read_connections)

    @cached_property
    def export(self) -> PostgresExport:
        """Everything held about one user (`chatmem export`)."""
        from chatmem.adapters.export_pg import PostgresExport

        return PostgresExport(self.pool, self.event_keys)

    @cached_property
    def notices(self) -> PostgresNotices:
        """Dead letters and event notices (conflicts, clocks out of range), newest first."""
        from chatmem.adapters.notices_pg import PostgresNotices

        return PostgresNotices(self.pool, self.event_keys)

    @cached_property
    def progress(self) -> PostgresProgress:
        """How far processing has come for given threads and events (the demo waits on it)."""
        from chatmem.adapters.progress_pg import PostgresProgress

        return PostgresProgress(self.pool)

    @cached_property
    def recall(self) -> Recall:
        """recall(user_id, query, scope=, limit=, thread_id=) -> RecallResult."""
        from chatmem.memory.recall import Recall

        return Recall(
            self.recall_reader,
            self.recall_query_embedder,
            self.mem0 if self.settings.recall_mem0 else None,
        )

    @cached_property
    def api_keys(self) -> ApiKeys:
        from chatmem.adapters.api_keys import ApiKeys

        return ApiKeys(self.pool)

    @cached_property
    def token_counter(self) -> TokenCounter:
        from chatmem.memory.tokens import default_counter

        return default_counter()

    def warm_up(self) -> None:
        """Load what a first read loads (the query encoder, mem0, the token counter; about 2 s),
        so a server's first caller does not wait for it."""
        self.recall(WARM_UP_USER, "warm up")
        self.token_counter.count("warm up")

    def build_context(self, thread_id: str, user_id: str, query: str | None = None, **kw: Any) -> ContextBundle:
        """The bundle for one turn of a bot: see memory/context.py."""
        from chatmem.memory.context import build_context
        from chatmem.schemas.read import Budgets

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
            self.context_reader,
            self.recall,
            self.token_counter,
            thread_id=thread_id,
            user_id=user_id,
            query=query,
            **kw,
        )

    def what_do_you_know(self, user_id: str, *, facts: int = 50, episodes: int = 5) -> KnownAbout:
        """The user's active facts and the titles of their latest episodes."""
        from chatmem.schemas.read import EpisodeTitle, KnownAbout, KnownFact

        rows = self.fact_store.user_facts(user_id)[:facts]
        return KnownAbout(
            user_id=user_id,
            facts=[
                KnownFact(category=r["category"], key=r["key"], value=r["value"], confidence=r["confidence"])
                for r in rows
            ],
            episodes=[EpisodeTitle(**r) for r in self.browser.recent_episodes(user_id, episodes)],
        )

    def summaries(self, thread_id: str) -> list[SummaryView]:
        """The thread's active summaries, highest level first."""
        from chatmem.schemas.read import SummaryView

        return [SummaryView(**r) for r in self.browser.active_summaries(thread_id)]

    # --- jobs -----------------------------------------------------------------------------------
    @cached_property
    def jobs(self) -> Jobs:
        from chatmem.memory.jobs import Jobs

        s = self.settings
        mem0 = _Deferred(lambda: self.mem0)
        return Jobs(self.summary_store, self.embedder, self.fact_store, mem0, s.rollup_fanin, s.rollup_keep)

    @cached_property
    def sweeper(self) -> Sweeper:
        from chatmem.memory.sweeper import Sweeper

        app = self.celery
        return Sweeper(
            self.thread_log,
            self.doorbell,
            self.summary_store,
            self.attachment_store,
            self.fact_store,
            queue_depth=lambda queue: queue_depths(app)[queue],
            enqueue_summary=lambda t, g, job: enqueue_summary(app, t, g, job),
            enqueue_attachment=lambda e, p: enqueue_attachment(app, e, p),
            enqueue_facts=lambda t, g, e: enqueue_episode_facts(app, t, g, e),
            facts_after_s=self.settings.sweeper_facts_after_s,
            finals_after_s=self.settings.sweeper_finals_after_s,
        )

    def _replay_or_failed(self, thread_id: str, llm: CachedLLM, owner: str) -> ReplayResult | ReplayFailed:
        from chatmem.adapters.errors import TRANSIENT_ERRORS
        from chatmem.memory.replay import ReplayFailed

        try:
            return self.replay(thread_id, llm, owner)
        except TRANSIENT_ERRORS:
            raise
        except Exception as error:  # this thread's own: a bug, or input nothing refused earlier
            log.exception("thread %s: the rebuild failed; its memory is left as it was", thread_id)
            return ReplayFailed(thread_id, error)

    def replay(self, thread_id: str, llm: CachedLLM, owner: str, **kw: Any) -> ReplayResult:
        """Rebuild one thread (memory/replay.py), facts included; then retire what the old
        generation derived that the rebuild did not."""
        llm = llm.for_thread(thread_id)
        # One connection for the whole rebuild: its many short blocks run on it in turn, and
        # only its last commit waits for the disk.
        with self.pool.pinned(flush_at_end=True):
            return self._replay(thread_id, llm, owner, **kw)

    def replay_many(
        self, thread_ids: Sequence[str], llm: CachedLLM, owner: str, *, overlap: int = REPLAY_OVERLAP
    ) -> Iterator[ReplayResult | ReplayFailed]:
        """Rebuild threads `overlap` at a time, each on a thread of this process, yielding results
        as they finish. A rebuild waits on Postgres for about half its time, one statement after
        another, and another rebuild computes meanwhile. A thread is one rebuild's, so its order
        holds. A thread whose rebuild fails is yielded as ReplayFailed and the others go on; an
        outage (TRANSIENT_ERRORS) stops the ones not started and is raised."""
        if overlap <= 1 or len(thread_ids) <= 1:
            for tid in thread_ids:
                yield self._replay_or_failed(tid, llm, owner)
            return
        # Built here, once, before two rebuilds could each build them: cached_property has no
        # lock from Python 3.12 on (mem0 locks its own; the LLM assist's cooldown is per process).
        self.embedder, self.jobs, self.projections, self.thread_log, self.seg_config, self.summary_policy  # noqa: B018
        self.boundary_assist()
        with ThreadPoolExecutor(min(overlap, len(thread_ids)), thread_name_prefix="replay") as pool:
            futures = [pool.submit(self._replay_or_failed, tid, llm, owner) for tid in thread_ids]
            try:
                for done in as_completed(futures):
                    yield done.result()
            finally:
                for f in futures:
                    f.cancel()

    def _replay(self, thread_id: str, llm: CachedLLM, owner: str, **kw: Any) -> ReplayResult:
        from chatmem.memory.replay import replay_thread

        s = self.settings
        jobs = self.jobs
        return replay_thread(
            thread_id,
            threads=self.thread_log,
            projections=self.projections,
            embedder=self.embedder,
            run=lambda job, generation: jobs.run_inline(llm, thread_id, generation, job),
            seg_cfg=self.seg_config,
            policy=self.summary_policy,
            owner=owner,
            lease_s=s.thread_lease_s,
            batch_size=s.apply_batch_size,
            after_switch=lambda generation: jobs.retire_rebuilt(thread_id, generation),
            assist=self.boundary_assist(refresh=llm.refresh),
            scorer=self.boundary_scorer,
            **kw,
        )

    def check_replay(self, thread_id: str, llm: CachedLLM, owner: str) -> dict[str, tuple[list[tuple], list[tuple]]]:
        """Rebuild one thread into a scratch generation, compare it with the active one, drop it.
        Episodes, messages, summaries and commands are compared row for row; facts by running the
        fact jobs as replay does into an in-memory store (never the facts table or mem0) and
        comparing with the active generation's facts and ledger; artifacts by checking the stored
        references, captions, blobs and texts against the log and the recorded analysis
        (memory/replay_check.py)."""
        from dataclasses import replace

        from chatmem.adapters.replay_check_pg import PostgresReplayCheck
        from chatmem.memory.replay import diff_generations, replay_thread
        from chatmem.memory.replay_check import ScratchFacts, artifact_rows, fact_rows

        s = self.settings
        llm = llm.for_thread(thread_id)
        check = PostgresReplayCheck(self.pool, self.blobs)
        scratch = ScratchFacts(self.fact_store)
        jobs = replace(self.jobs, facts=scratch, mem0=None)
        projections = _RecordingProjections(self.projections)
        live = self.projections.load_context(thread_id).generation
        # Read before the rebuild: projecting its messages adds any missing reference row back.
        stored_refs, artifacts = check.attachments(thread_id)
        result = replay_thread(
            thread_id,
            threads=self.thread_log,
            projections=projections,
            embedder=self.embedder,
            run=lambda job, generation: jobs.run_inline(llm, thread_id, generation, job),
            seg_cfg=self.seg_config,
            policy=self.summary_policy,
            owner=owner,
            lease_s=s.thread_lease_s,
            batch_size=s.apply_batch_size,
            switch=False,
            assist=self.boundary_assist(refresh=llm.refresh),
            scorer=self.boundary_scorer,
        )
        try:
            live_facts, live_ledger = check.facts(thread_id, live)
            facts_live, facts_rebuilt = fact_rows(live_ledger, live_facts, scratch)
            shas = sorted({r.sha256 for r in stored_refs if r.status == "linked" and r.sha256})
            logged = [(event_id, position, ref) for event_id, position, _user, ref in projections.attachments]
            art_live, art_expected = artifact_rows(logged, stored_refs, artifacts, check.blob_sha256(shas))
            return diff_generations(
                {
                    **self.projections.generation_rows(thread_id, live),
                    "facts": facts_live,
                    "artifacts": art_live,
                },
                {
                    **self.projections.generation_rows(thread_id, result.generation),
                    "facts": facts_rebuilt,
                    "artifacts": art_expected,
                },
            )
        finally:
            self.projections.drop_generation(thread_id, result.generation)

    def apply_failed(self, thread_id: str, event: LoggedEvent, error: Exception) -> None:
        """A thread's batch failed for a reason other than an outage: counted, and kept as a
        notice on the batch's first event with where it was raised (not the error's message,
        which may quote a message). Recording it never hides the error itself."""
        from chatmem.adapters.errors import TRANSIENT_ERRORS, where_raised
        from chatmem.adapters.metrics import instruments

        place = where_raised(error)
        instruments().apply_failures.labels(type(error).__name__).inc()
        detail = (
            f"applying thread {thread_id} stopped at the batch this event begins: {place}. The events stay "
            "in the log; the thread goes on from here once the cause is fixed and the workers restarted"
        )
        try:
            self.notices.apply_failed(event.event_id, event.stream_pos, detail)
        except TRANSIENT_ERRORS:
            log.warning("thread %s: the notice of a failed batch (%s) could not be stored", thread_id, place)

    def erasure_subject(self, thread_id: str, event_id: str) -> str | None:
        from chatmem.adapters.erase_pg import PostgresErasure

        return PostgresErasure(self.pool, self.event_keys).command_sender(thread_id, event_id)

    def erase(
        self, *, user_id: str | None = None, thread_id: str | None = None, requested_by: str = "cli"
    ) -> dict[str, int]:
        """Erase a user (every thread) or a thread (every user): destroy their data keys, so the
        log keeps only tombstones; remove what was derived from the content in every store; rebuild
        the threads without it through replay; record the erasure. Counts per store."""
        from chatmem.adapters.erase_pg import PostgresErasure
        from chatmem.producers.spool import Spool
        from chatmem.schemas.events import CommandEvent, CommandName

        if (user_id is None) == (thread_id is None):
            raise ValueError("erase needs exactly one of a user or a thread")
        eraser = PostgresErasure(self.pool, self.event_keys)
        scope, subject = ("user", user_id) if user_id is not None else ("thread", thread_id)
        assert subject is not None
        erasure_id = eraser.record(scope, subject, requested_by)
        plan = eraser.plan(user_id=user_id, thread_id=thread_id)
        removed: dict[str, int] = {"threads": len(plan.threads), "keys": eraser.destroy_keys(plan)}
        removed["clear_events_redacted"] = eraser.redact(plan, clear_only=True)

        whole = set(plan.whole)

        def doomed(raw: bytes) -> bool:
            try:
                event = json.loads(raw)
            except ValueError:
                return False
            return isinstance(event, dict) and (event.get("thread_id") in whole or event.get("user_id") == user_id)

        removed["stream_entries"] = self.stream.erase(doomed)
        spools = [self.settings.resolved_spool_dir, self.settings.resolved_spool_dir / "bulk"]
        removed["spooled_events"] = sum(Spool(d).erase(doomed) for d in spools)
        _tally(removed, self._purge(eraser, plan))
        with self.cache_uses.watching(plan.threads) as used:
            _tally(removed, self._rebuild(plan.threads, f"erase-{erasure_id}"))
        # A job already past reading the content when the keys went may have written after the
        # purge (a fact, a mem0 memory): a second pass, now that the replays held every lease;
        # then the model answers the rebuilds did not use, a late job's included.
        _tally(removed, self._purge(eraser, plan))
        _tally(removed, eraser.sweep_answers(plan.threads, used))
        # The log records that an erasure happened in each thread, without content.
        self.sink.add_many(
            [
                CommandEvent(
                    event_id=f"erasure-{erasure_id}-{i}",
                    thread_id=t,
                    user_id="chatmem",
                    platform="chatmem",
                    command=CommandName.ERASED,
                    args={"erasure": erasure_id, "scope": scope},
                )
                .model_dump_json()
                .encode()
                for i, t in enumerate(plan.threads)
            ]
        )
        eraser.finish(erasure_id, removed)
        return removed

    def reembed(self, target: EmbedderSpec, on_progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """Build every thread's projections again with another embedder, into new generations,
        and switch to all of them and to the new model in one transaction (memory/replay.py's
        machinery). Reads go on from the old generations meanwhile; live projection is held
        (events wait in the log) so the new generations are complete when they switch. Facts
        and mem0 stay as they are. `on_progress(events done, events in all)`."""
        from chatmem.adapters.embedders import CachedEmbedder
        from chatmem.adapters.migrate import ensure_vector_indexes
        from chatmem.memory.jobs import Jobs
        from chatmem.memory.replay import replay_thread

        s = self.settings
        state = self.embedding_state
        state.begin(target)
        new = CachedEmbedder(self.inner_embedder(target), self.pool)
        built: list[ReplayResult] = []
        try:
            ensure_vector_indexes(self.urls.database_url, target.dim)
            jobs = Jobs(self.summary_store, new, self.fact_store, None, s.rollup_fanin, s.rollup_keep)
            llm = self.llm("maintenance")
            assist = self.boundary_assist()  # other vectors, other unsure decisions: asked as live would
            threads = self.thread_log.all_threads()
            total, done = self.projections.applied_events(), 0
            for thread_id in threads:
                scoped = llm.for_thread(thread_id)

                def summaries_only(job: Job, generation: int, t: str = thread_id, llm_t: CachedLLM = scoped) -> None:
                    if job.kind in ("running", "chunk", "final"):
                        jobs.summarize(llm_t, t, generation, job, facts_next=lambda *_: None)

                built.append(
                    replay_thread(
                        thread_id,
                        threads=self.thread_log,
                        projections=self.projections,
                        embedder=new,
                        run=summaries_only,
                        seg_cfg=self.seg_config,
                        policy=self.summary_policy,
                        owner="reembed",
                        lease_s=s.thread_lease_s,
                        batch_size=s.apply_batch_size,
                        switch=False,
                        assist=assist,
                        scorer=self.boundary_scorer,
                    )
                )
                done += built[-1].events
                if on_progress:
                    on_progress(done, total)
            artifacts = self.projections.stage_artifact_vectors(new)
            self.projections.switch_all(built, lambda conn: state.switch(conn, target))
        except BaseException:
            for r in built:
                self.projections.drop_generation(r.thread_id, r.generation)
            self.projections.unstage_artifact_vectors()
            state.abort()
            raise
        artifacts += self.projections.stage_artifact_vectors(new, in_place=True)
        return {"threads": len(built), "events": done, "artifact_texts": artifacts}

    def reanalyse_attachments(
        self, on_progress: Callable[[int, int], None] | None = None, *, recordings: bool = False
    ) -> dict[str, int]:
        """Analyse every stored file again with the OCR and vision settings in use now, each
        swapped in at once with its messages' surrogates. A file that fails now keeps its old
        analysis (counted as failed). Recordings only with `recordings`: their words depend on
        the speech model alone, which bills each minute again; without it a video's pictures are
        read again and its words kept."""
        from dataclasses import replace

        from chatmem.memory.attachments import Analyzer, KeptSpeech
        from chatmem.memory.attachments.errors import BadFile
        from chatmem.memory.ports import TransientError

        job = self.attachment_job()
        assert isinstance(job.analyze, Analyzer)
        todo = [f for f in self.attachment_store.analysed() if recordings or f[2] != "audio"]
        done = failed = 0
        for i, (sha, mime, kind, filename) in enumerate(todo, start=1):
            kept = None
            if kind == "video" and not recordings:
                kept = replace(job.analyze, transcriber=KeptSpeech(self.attachment_store.heard(sha)))
            try:
                job.reanalyse(sha, mime, kind, filename, analyze=kept)
                done += 1
            except (BadFile, TransientError, FileNotFoundError) as error:
                log.warning("re-analysis of %s failed, its old analysis stays: %s", sha[:12], error)
                failed += 1
            if on_progress:
                on_progress(i, len(todo))
        return {"files": done, "failed": failed}

    def apply_retention(self, now: datetime | None = None) -> dict[str, int]:
        """Shred the content of events past their retention (settings: retention_days,
        retention_days_by) and rebuild their threads without it, as erasure does for a subject;
        dead letters older than the global period go too. `now` is for a fake clock. Counts."""
        from datetime import UTC, timedelta

        from chatmem.adapters.erase_pg import PostgresErasure

        s = self.settings
        now = now or datetime.now(UTC)
        eraser = PostgresErasure(self.pool, self.event_keys)
        with eraser.one_run("retention"):
            removed: dict[str, int] = {"events": 0}
            # A run that stopped after shredding left threads to rebuild: the expired events are
            # tombstones now, so only its record names them.
            stopped = eraser.unfinished("retention")
            threads: set[str] = {t for _, pending in stopped for t in pending}
            run: int | None = None
            while ids := eraser.expired(now, s.retention_days, s.retention_days_by):
                plan = eraser.plan_events(ids)
                run = run if run is not None else eraser.record("retention", "expired events", "retention")
                threads.update(plan.threads)
                eraser.note_pending(run, sorted(threads))  # before the shredding it is about
                removed["events"] += eraser.redact(plan, clear_only=False)
                _tally(removed, self._purge(eraser, plan))
            if s.retention_days is not None:
                removed["dead_letters_expired"] = eraser.expire_dead_letters(now - timedelta(days=s.retention_days))
            if threads:
                with self.cache_uses.watching(sorted(threads)) as used:
                    _tally(removed, self._rebuild(sorted(threads), "retention"))
                _tally(removed, eraser.sweep_answers(sorted(threads), used))
            removed["threads"] = len(threads)
            if run is None and removed.get("dead_letters_expired"):  # a quiet run leaves no record
                run = eraser.record("retention", "expired events", "retention")
            for done in [r for r, _ in stopped] + ([run] if run is not None else []):
                eraser.finish(done, removed if done == run else {"threads": len(threads)})
            return removed

    def forget_deleted(self, thread_id: str) -> dict[str, int]:
        """Shred the messages (and their edits) that the thread's message_deleted events name and
        rebuild the thread without them, as retention does for expired events. Nothing to do when
        they are gone already or were never logged. Counts."""
        from chatmem.adapters.erase_pg import PostgresErasure

        eraser = PostgresErasure(self.pool, self.event_keys)
        with eraser.one_run(f"forget_deleted:{thread_id}"):  # a burst of deletions queues several runs
            ids = eraser.deleted(thread_id)
            # A run that stopped after shredding (a worker lost, an outage) left its rebuild undone:
            # the retry finds no content left to shred, and must still rebuild.
            stopped = [run for run, _ in eraser.unfinished("messages", thread_id)]
            if not ids and not stopped:
                return {"events": 0}
            if stopped:
                ids = eraser.deleted(thread_id, shredded_too=True)
            run = stopped[0] if stopped else eraser.record("messages", thread_id, "deleted on the platform")
            plan = eraser.plan_events(ids)
            removed = {"events": eraser.redact(plan, clear_only=False)}
            _tally(removed, self._purge(eraser, plan))
            with self.cache_uses.watching(plan.threads) as used:
                _tally(removed, self._rebuild(plan.threads, f"deleted-{run}"))
            # A deletion often follows its message within seconds, while a job may still be reading
            # it: a second pass, as erase makes, with the facts derived meanwhile; then the model
            # answers the rebuild did not use, a late job's included.
            _tally(removed, self._purge(eraser, eraser.plan_events(ids)))
            _tally(removed, eraser.sweep_answers(plan.threads, used))
            for done in {run, *stopped}:
                eraser.finish(done, removed if done == run else {})
            return removed

    def _purge(self, eraser: PostgresErasure, plan: ErasurePlan) -> dict[str, int]:
        """What replay does not rebuild: the rows, the files nobody else sent, and mem0's
        memories (all of a subject's, or those of the covered facts)."""
        counts, orphans = eraser.purge(plan)
        counts["blobs"] = sum(self.blobs.delete(sha) for sha in orphans)
        for user_id in plan.users:
            _tally(counts, self.mem0.erase_user(user_id, plan.mem0_ids))
        if not plan.users and plan.mem0_ids:
            _tally(counts, self.mem0.erase_memories(plan.mem0_ids))
        return counts

    def _rebuild(self, thread_ids: Sequence[str], owner: str) -> dict[str, int]:
        """Replay the threads over their tombstones, then drop the generations they replaced."""
        llm = self.llm("maintenance")
        for thread_id in thread_ids:
            self.replay(thread_id, llm, owner)
        return {f"old_{table}": n for table, n in self.projections.gc().items()}

    def close(self) -> None:
        if "analysis_reader" in self.__dict__:
            self.analysis_reader.close()
        if "pool" in self.__dict__:
            self.pool.close()
        if "redis" in self.__dict__:
            self.redis.close()


def open_memory(settings: Settings | None = None) -> Container:
    """The read path for a bot in-process: `memory.build_context(...)`, `memory.recall(...)`.
    Settings from CHATMEM_* / .env; the embedded services when no URL is set."""
    from chatmem.schemas.settings import load_settings

    return Container(settings or load_settings())


def _tally(into: dict[str, int], counts: dict[str, int]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + n
