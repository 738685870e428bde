"""The composition root of a search process: the OpenSearch client, the async engines, the embedder, the
search service and its operations service, started together and closed together.

Outside `search.web` so that the MCP server (apps.runtime.mcp_server) builds the same service without the
aiohttp API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from ki.clients import make_async_engine, make_client
from ki.embedding import create_embedder
from ki.settings import Settings
from search.consistency import ConsistencyGate, consistency_gate
from search.operations import Operations
from search.service import SearchService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchRuntime:
    """A started search service, its operations service, and what closes both with their clients."""

    service: SearchService
    operations: Operations
    consistency: ConsistencyGate  # waits for a writer's consistency token (search.consistency)
    close: Callable[[], Awaitable[None]]


async def start_search_runtime(settings: Settings) -> SearchRuntime:
    """A started search service with its own OpenSearch client, async engines and embedder, and its operations
    service (the HTTP API and the MCP server each make one)."""
    loop = asyncio.get_running_loop()
    embedder = await loop.run_in_executor(None, create_embedder, settings)
    # Read-only statements that each take their own snapshot anyway (READ COMMITTED): autocommit spares
    # every connection checkout a BEGIN and a ROLLBACK round trip to PostgreSQL.
    engine = make_async_engine(settings, isolation_level="AUTOCOMMIT")
    # no ping before each re-verify (a round trip per search): `search.ports.SqlReader.verified_read` retries once
    verify_engine = make_async_engine(settings, isolation_level="AUTOCOMMIT", generic_plans=True, pool_pre_ping=False)
    client = make_client(settings)
    service = SearchService(settings, engine, client, embedder, verify_engine=verify_engine)
    # Shares the service's statistics recorder and scope cache, which the service starts and closes.
    operations = Operations(
        settings,
        engine,
        client,
        service.metrics,
        stats=service.stats,
        scope_cache=service.scope_cache,
        feed=service.feed,
    )
    consistency = consistency_gate(settings, client)
    service.start()
    operations.start()
    log.info("default search mode: %s (%s)", service.gate.default_mode, service.gate.reason)

    async def close() -> None:
        await service.close()
        await operations.close()
        await client.close()
        await engine.dispose()
        await verify_engine.dispose()
        consistency.close()

    return SearchRuntime(service, operations, consistency, close)


@contextlib.asynccontextmanager
async def search_runtime(settings: Settings) -> AsyncIterator[SearchRuntime]:
    """`start_search_runtime`, closed on leaving."""
    runtime = await start_search_runtime(settings)
    try:
        yield runtime
    finally:
        await runtime.close()
