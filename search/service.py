"""The search service: the facade of one search process's search side. It composes the narrow ports
(search.ports, the scoped index reader, the embedder, the reranker) and the stages (search.stages) once, and
answers the web layer, the MCP server and the dev tools by handing each call to them.

A ranked search: scope (beside the query's embedding) -> the plan, made once (search.plan) -> the stages
(search.stages.ranked: embed, legs, fuse, re-verify and collapse, the stages after ranking, the answer's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from opensearchpy import AsyncOpenSearch
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from ki.embedding import Embedder
from ki.settings import Settings
from search.access.scope import CompiledScope, ScopeFilter
from search.documents.chunks import ChunkId
from search.documents.decisions import DecisionPage
from search.pipeline import SearchResult
from search.plan import QueryPlan, plan_query, synonym_groups
from search.ports import Background, ModeGateReader, SqlReader
from search.ranking.legs import LegName, LegRun
from search.ranking.mode_gate import GateDecision
from search.ranking.query_vectors import EmbeddingCache
from search.ranking.rerank import Reranker
from search.ranking.scoped import ScopedIndex
from search.rate_limit import RateLimiter
from search.reads import DocumentReads
from search.request import (
    DecisionSearchRequest,
    FilterRequest,
    LookupRequest,
    ReadRequest,
    RelatedRequest,
    SearchRequest,
    TraverseRequest,
)
from search.stages.build import ranked_search
from search.stages.embed import EmbedStage
from search.stages.filtered import FilterSearch
from search.stages.legs import LegsStage
from search.stages.scope import ScopeStage, scope_caches
from search.telemetry.metrics import SearchMetrics
from search.telemetry.stats import StatsRecorder

T = TypeVar("T")


class SearchService:
    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        client: AsyncOpenSearch,
        embedder: Embedder,
        metrics: SearchMetrics | None = None,
        *,
        scope_cache: bool | None = None,
        verify_engine: AsyncEngine | None = None,
    ) -> None:
        r = settings.retrieval
        self.settings, self.engine, self.client = settings, engine, client
        # The re-verify's connections (`ki.clients.make_async_engine(generic_plans=True)` in the API).
        self.verify_engine = verify_engine or engine
        self.limiter = RateLimiter(settings.api.limits.rate_per_s, settings.api.limits.rate_burst)
        self.metrics = metrics or SearchMetrics()
        self.index = r.index_name
        self.synonym_groups = synonym_groups(r)
        # Retrieval statistics (search.telemetry.stats): buffered here, written by `start()`'s background task.
        self.stats: StatsRecorder | None = None
        if settings.api.stats.enabled:
            self.stats = StatsRecorder(engine, settings.api, on_dropped=lambda n: self.metrics.stats_dropped.inc(n))
        # The scope and name caches and their feed; `start()` starts the feed.
        self.scope_cache, self.name_cache, self.feed = scope_caches(settings, self.metrics, scope_cache)
        # The ports: SQL; every OpenSearch read of a search, through the caller's scope (search.ranking.scoped).
        self.sql = SqlReader(settings, engine, self.verify_engine)
        self.scoped = ScopedIndex(client, self.index, settings.api.limits.max_scope_filter_bytes, self.metrics)
        self.background = Background()  # refreshes of stale cache entries, after the answer has left
        self.reranker = Reranker(r) if r.rerank_enabled else None
        vectors = EmbeddingCache(settings.api.caches.embedding_size, settings.api.caches.embedding_ttl_s)
        self.embedding = EmbedStage(embedder, vectors, self.metrics)
        self.mode_gate = ModeGateReader(settings, engine, lambda: self.embedder.signature)
        self._gate_task: asyncio.Task[None] | None = None
        # The stages (search.stages).
        self.scope = ScopeStage(settings, self.sql, self.metrics, self.background, self.scope_cache, self.feed)
        self.legs = LegsStage(self.scoped, r.hnsw_ef_search)
        self.ranked = ranked_search(
            settings, sql=self.sql, scoped=self.scoped, embedding=self.embedding, scope=self.scope, legs=self.legs,
            signature=lambda: self.embedder.signature, reranker=self.reranker, metrics=self.metrics,
            stats=self.stats, background=self.background, name_cache=self.name_cache, feed=self.feed,
        )  # fmt: skip
        self.filtered = FilterSearch(settings, self.scope, self.scoped, self.sql)
        self.reads = DocumentReads(settings, self.sql, self.scoped, self.scope.compile)

    def start(self) -> None:
        self._gate_task = asyncio.get_running_loop().create_task(self.mode_gate.refresh_forever())
        if self.feed is not None:
            self.feed.start()
        if self.stats is not None:
            self.stats.start()

    async def close(self) -> None:
        if self._gate_task is not None:
            self._gate_task.cancel()
        if self.feed is not None:
            self.feed.stop()
        if self.stats is not None:
            await self.stats.close()
        if self.reranker is not None:
            await self.reranker.close()

    @property
    def gate(self) -> GateDecision:
        """The mode gate's current decision (search.ports.ModeGateReader): a request reads it once, into its plan."""
        return self.mode_gate.decision

    async def refresh_gate(self) -> GateDecision:
        """Re-read the newest self-eval report and decide the default mode again (search.ranking.mode_gate)."""
        return await self.mode_gate.refresh()

    @property
    def embedder(self) -> Embedder:
        return self.embedding.embedder

    @embedder.setter
    def embedder(self, embedder: Embedder) -> None:
        self.embedding.embedder = embedder

    @property
    def cache(self) -> EmbeddingCache:
        """The query vectors' cache (`ki eval` shares one across services)."""
        return self.embedding.cache

    @cache.setter
    def cache(self, cache: EmbeddingCache) -> None:
        self.embedding.cache = cache

    @property
    def filter_budget(self) -> int | None:
        """Bytes of scope clause per leg (None: always the exact filter, as the reference path in tests)."""
        return self.scoped.filter_budget

    @filter_budget.setter
    def filter_budget(self, budget: int | None) -> None:
        self.scoped.filter_budget = budget

    async def settled(self) -> None:
        """Until the background refreshes started so far are done (tests, benchmarks)."""
        await self.background.settled()

    async def compile_scope(self, principals: Sequence[str], project_ids: Sequence[int] | None) -> CompiledScope:
        """The caller's scope (search.stages.scope)."""
        return await self.scope.compile(principals, project_ids)

    def scope_filter(self, scope: CompiledScope) -> ScopeFilter:
        return self.scoped.scope_filter(scope)

    async def embed_query(self, query: str, principals: Sequence[str] = ()) -> list[float]:
        """The query's vector, cached for this caller (`principals`, the token's) only."""
        return await self.embedding.embed(query, principals)

    def plan(self, request: SearchRequest) -> QueryPlan:
        """The request's plan (search.plan), made from one reading of the mode gate: every later step reads it."""
        return plan_query(request, self.settings.retrieval, self.gate, self.synonym_groups)

    def plan_legs(
        self,
        request: SearchRequest,
        scope: CompiledScope | ScopeFilter,
        vector: list[float] | None,
        plan: QueryPlan | None = None,
    ) -> dict[LegName, dict[str, Any]]:
        """The `_msearch` bodies of one ranked search (search.stages.legs; `ki bench search` sends them raw)."""
        return self.legs.bodies(request, scope, vector, plan or self.plan(request))

    async def run_legs_in_scope(
        self, request: SearchRequest, scope: CompiledScope, vector: list[float] | None, plan: QueryPlan | None = None
    ) -> tuple[LegRun, int]:
        """Every leg's hits as the exact scope filter gives them, and the number of `_msearch` round trips."""
        return await self.legs.in_scope(request, scope, vector, plan or self.plan(request))

    async def search(self, principals: Sequence[str], request: SearchRequest) -> SearchResult:
        """A ranked search on its plan (made here, once: every stage reads it), released on the search grid
        (`api.limits.search_release_quantum_ms`)."""
        work = self.ranked.search(principals, request, self.plan(request))
        return await self.sql.on_the_grid(work, self._search_quantum_ms)

    async def search_in_scope(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        *,
        started: float | None = None,
        vector: Awaitable[list[float]] | None = None,
        plan: QueryPlan | None = None,
    ) -> SearchResult:
        """The ranked search's stages for an already compiled scope (the re-verify still checks grants in SQL afresh).
        `vector`: the query vector being computed (else embedded); `plan`: the request's plan (else made here)."""
        return await self.ranked.run(principals, request, scope, plan or self.plan(request), started=started,
                                     vector=vector)  # fmt: skip

    async def search_filter(self, principals: Sequence[str], request: FilterRequest) -> SearchResult:
        """Metadata-only: filter-only query, doc_date descending, one hit per version, score 0; on the search grid."""
        return await self.sql.on_the_grid(self.filtered.run(principals, request), self._search_quantum_ms)

    @property
    def _search_quantum_ms(self) -> float:
        return self.settings.api.limits.search_release_quantum_ms

    # The SQL reader's helpers, for a facade method of its own (search.ports.SqlReader).
    async def _verified_read(self, work: Callable[[Connection], T]) -> T:
        return await self.sql.verified_read(work)

    async def _on_the_grid(self, work: Awaitable[T]) -> T:
        return await self.sql.on_the_grid(work)

    # The document reads (search.reads): in SQL, checked against the caller's principals, released on the grid.
    async def get_document(self, principals: Sequence[str], document_id: int) -> dict[str, Any] | None:
        return await self.reads.get_document(principals, document_id)

    async def read_text(
        self, principals: Sequence[str], document_id: int, version_id: int | None, request: ReadRequest
    ) -> dict[str, Any] | None:
        return await self.reads.read_text(principals, document_id, version_id, request)

    async def related(
        self, principals: Sequence[str], document_id: int, request: RelatedRequest
    ) -> dict[str, Any] | None:
        return await self.reads.related(principals, document_id, request)

    async def traverse(self, principals: Sequence[str], request: TraverseRequest) -> dict[str, Any]:
        return await self.reads.traverse(principals, request)

    async def search_decisions(self, principals: Sequence[str], request: DecisionSearchRequest) -> DecisionPage:
        return await self.reads.search_decisions(principals, request)

    async def read_chunk(self, principals: Sequence[str], chunk: ChunkId) -> dict[str, Any] | None:
        return await self.reads.read_chunk(principals, chunk)

    async def lookup(self, principals: Sequence[str], request: LookupRequest) -> dict[str, Any]:
        return await self.reads.lookup(principals, request)
