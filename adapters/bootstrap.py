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
        return make_pool(self.urls.database_url, self.settings.db_pool_size)

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

    def close(self) -> None:
        if "pool" in self.__dict__:
            self.pool.close()
        if "redis" in self.__dict__:
            self.redis.close()


def process_name(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"
