"""Graph augmentation (search.ranking.augment): the top seeds' cited documents join the pool, scoped,
re-verified, scored below their seed; nothing ranked is dropped (`graph` in the timings)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from ki.errors import KiError
from ki.settings import RetrievalSettings
from search.access.reverify import VerifiedVersion
from search.access.scope import MATCH_NONE, CompiledScope
from search.pipeline import QueryContext, Stage, Verified, matches
from search.ports import SqlReader
from search.ranking import augment, sql_reads
from search.ranking.fusion import Candidate
from search.ranking.legs import SOURCE_INCLUDES
from search.ranking.scoped import ScopedIndex
from search.request import SearchRequest
from search.telemetry.metrics import SearchMetrics


class GraphAugmenter:
    """The augmentation's reads: the citations in SQL, the cited documents' best chunks through the scope."""

    def __init__(self, retrieval: RetrievalSettings, scoped: ScopedIndex, sql: SqlReader) -> None:
        self.retrieval, self.scoped, self.sql = retrieval, scoped, sql

    async def augment(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        kept: list[Candidate],
        verified: dict[int, VerifiedVersion],
    ) -> tuple[list[Candidate], dict[int, VerifiedVersion], dict[str, Any]]:
        r = self.retrieval
        seeds = kept[: r.graph_rag.seeds]
        edges = await self.sql.verified_read(lambda c: sql_reads.cited_documents(c, seeds))
        present = {c.document_id for c in kept}
        cited = [c for c in augment.plan_additions(seeds, edges, present, r.graph_rag.max_added)
                 if scope.holds_document(c.document_id, c.project_id)]  # fmt: skip
        info: dict[str, Any] = {"status": "ok", "seeds": len(seeds), "cited": len(cited), "added": 0}
        if not cited:
            return kept, verified, info
        strict = self.scoped.request_filter(request, scope)
        if strict == MATCH_NONE:
            return kept, verified, info
        body = augment.best_chunk_body(request.query, strict, [c.document_id for c in cited], SOURCE_INCLUDES)
        added = augment.added_candidates(await self.scoped.search(body), cited, r.graph_rag.hop_penalty)
        found = await self.sql.reverify(principals, [c.version_id for c in added], scope, request.as_of)
        added = [c for c in added if matches(c, found)]
        info["added"] = len(added)
        return augment.merge(kept, added), {**verified, **found}, info


class Augment(Protocol):
    """The augmentation port (`GraphAugmenter.augment`)."""

    def __call__(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        kept: list[Candidate],
        verified: Verified,
    ) -> Awaitable[tuple[list[Candidate], Verified, dict[str, Any]]]: ...  # fmt: skip


class GraphAugmentation(Stage):
    """Its own failure must not take the ranked answer with it: answered without it, flagged and counted."""

    name = "graph"
    fallback = "graph_failed"
    recoverable = (KiError,)

    def __init__(self, retrieval: RetrievalSettings, metrics: SearchMetrics, augment: Augment) -> None:
        self.retrieval, self.metrics, self.augment = retrieval, metrics, augment

    def applies(self, ctx: QueryContext) -> bool:
        return self.retrieval.graph_rag_enabled and bool(ctx.kept)

    async def run(self, ctx: QueryContext) -> None:
        ctx.kept, ctx.verified, ctx.graph = await self.augment(
            ctx.principals, ctx.request, ctx.scope, ctx.kept, ctx.verified
        )
        self.metrics.graph_augmentation.labels(ctx.graph["status"]).inc()

    def failed(self, ctx: QueryContext, exc: BaseException) -> None:
        ctx.graph = {"status": "failed", "error": type(exc).__name__}
        self.metrics.graph_augmentation.labels("failed").inc()
