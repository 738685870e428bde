"""The one place that builds clients of the services from the settings object.

PostgreSQL engines (sync and asyncio), OpenSearch clients (sync and asyncio), Kafka admin and consumer
clients (the worker's own Kafka clients are Faust's). Everything that talks to a service gets its client
here, so connection options (and, later, TLS and credentials) are decided once.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from opensearchpy import AsyncOpenSearch, OpenSearch
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ki.settings import Settings

# Our statements are short and run often; PostgreSQL's JIT spends more compiling them (tens of ms) than
# it ever saves, so it is off for our sessions whatever the server default is.
_SESSION_OPTIONS = {"options": "-c jit=off"}


def make_engine(settings: Settings, *, pooled: bool = True, **kwargs: Any) -> Engine:
    """A synchronous engine (psycopg 3). `pooled=False` for one-shot tools such as migrations."""
    db = settings.database
    kwargs.setdefault("connect_args", _SESSION_OPTIONS)
    if pooled:
        kwargs.setdefault("pool_size", db.pool_size)
        kwargs.setdefault("pool_pre_ping", True)
    else:
        kwargs.setdefault("poolclass", NullPool)
    return create_engine(db.url, **kwargs)


def make_async_engine(settings: Settings, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine on the same URL (psycopg 3 serves both), for the aiohttp API."""
    kwargs.setdefault("pool_size", settings.database.pool_size)
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("connect_args", _SESSION_OPTIONS)
    return create_async_engine(settings.database.url, **kwargs)


def make_client(settings: Settings) -> AsyncOpenSearch:
    """The asyncio OpenSearch client of the sync writer and the search API."""
    return AsyncOpenSearch(
        hosts=[settings.opensearch.url],
        timeout=settings.opensearch.timeout_s,
        max_retries=0,  # retries are ours: we also retry 429s and count them
        http_compress=settings.opensearch.http_compress,
    )


def make_sync_client(settings: Settings, *, timeout_s: float | None = None) -> OpenSearch:
    """A blocking OpenSearch client, for commands and status probes."""
    return OpenSearch(hosts=[settings.opensearch.url], timeout=timeout_s or settings.opensearch.timeout_s)


def kafka_config(settings: Settings, **options: Any) -> dict[str, Any]:
    """librdkafka configuration for this stack's brokers, plus the caller's options."""
    return {"bootstrap.servers": settings.kafka.bootstrap_servers, **options}


def make_kafka_admin(settings: Settings, **options: Any) -> AdminClient:
    return AdminClient(kafka_config(settings, **options))


def make_kafka_consumer(settings: Settings, group_id: str, **options: Any) -> Consumer:
    return Consumer(kafka_config(settings, **{"group.id": group_id, **options}))
