"""One ranked search over an already compiled scope, stage after stage (search.pipeline): embed, legs and the
identity preflight's wait; fuse and re-verify; the stages after ranking; the page and the answer's stages.

Every stage from the legs on is sized for the whole window (offset + limit): collapse and the re-verify drop
rows after ranking, so the offset cannot be pushed down into OpenSearch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from ki.settings import RetrievalSettings, Settings
from projections.plan import VECTOR_PENDING
from search.access.scope import CompiledScope
from search.names.keys import Identity
from search.pipeline import QueryContext, SearchResult, Stage, StageTimer, run_stages
from search.plan import QueryPlan
from search.ranking.fusion import Candidate
from search.ranking.hits import FusionParams, hit_json
from search.ranking.legs import LegHit
from search.ranking.mode_gate import Mode
from search.ranking.scoped import ScopedIndex
from search.request import SearchRequest
from search.stages.augment import Augment, GraphAugmentation
from search.stages.authoritative import AuthoritativeType, FindAuthoritative
from search.stages.identity import Identities, IdentityHit, NamedDocumentFirst
from search.stages.rerank import Rerank, RerankStage
from search.telemetry.metrics import SearchMetrics
from search.telemetry.stats import StatsRecorder, query_stats


def post_ranking_stages(
    retrieval: RetrievalSettings,
    metrics: SearchMetrics,
    *,
    augment: Augment,
    authoritative: FindAuthoritative,
    rerank: Rerank | None,
    identity_hit: IdentityHit,
) -> list[Stage]:
    """The order matters: augmentation and the authoritative type widen the list the rerank orders; the
    named document goes first after everything else."""
    return [
        GraphAugmentation(retrieval, metrics, augment),
        AuthoritativeType(retrieval, authoritative),
        RerankStage(rerank),
        NamedDocumentFirst(retrieval, identity_hit),
    ]


CompileScope = Callable[[Sequence[str], Sequence[int] | None], Awaitable[CompiledScope]]
EmbedQuery = Callable[[str, Sequence[str]], Awaitable[list[float]]]


class RankedSearch:
    """The stages of a ranked search in their order, and the answer they make."""

    def __init__(
        self,
        settings: Settings,
        scoped: ScopedIndex,
        identities: Identities,
        metrics: SearchMetrics,
        stats: StatsRecorder | None,
        *,
        head: Sequence[Stage],  # embed, legs, the identity preflight's wait
        ranking: Sequence[Stage],  # fuse, re-verify and collapse
        post_ranking: Sequence[Stage],
        answer: Sequence[Stage],
        compile_scope: CompileScope,  # the scope stage's (search.stages.scope)
        embed: EmbedQuery,  # the embed stage's, cached per caller (search.stages.embed)
    ) -> None:
        self.settings, self.scoped, self.identities, self.metrics, self.stats = (
            settings, scoped, identities, metrics, stats
        )  # fmt: skip
        self.head, self.ranking, self.post_ranking, self.answer = head, ranking, post_ranking, answer
        self.compile_scope, self.embed = compile_scope, embed

    async def search(self, principals: Sequence[str], request: SearchRequest, plan: QueryPlan) -> SearchResult:
        """The whole request on its plan: the caller's scope compiled, then the stages. The query vector does not
        depend on the scope, so a cache miss is embedded while the scope's SQL runs."""
        started = time.perf_counter()
        vector = None
        if plan.needs_vector:
            vector = asyncio.ensure_future(self.embed(plan.expansion.text, principals))
        try:
            scope = await self.compile_scope(principals, request.filters.project_id)
        except BaseException:
            if vector is not None:
                vector.cancel()
            raise
        return await self.run(principals, request, scope, plan, started=started, vector=vector)

    async def run(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        plan: QueryPlan,
        *,
        started: float | None,
        vector: Awaitable[list[float]] | None,
    ) -> SearchResult:
        timer = StageTimer(started)
        timer.mark("scope", timer.started)
        request = plan.applied(request)  # the dates the query's words asked for, where the request named none
        ctx = QueryContext(principals, request, plan, scope, timer, vector=vector)
        # The identity preflight runs beside the legs (it needs the scope, not their hits).
        ctx.preflight = asyncio.ensure_future(self.identities.identify(principals, request, scope, plan.compare_with))
        try:
            await run_stages(self.head, ctx)
        finally:
            ctx.preflight.cancel()  # a no-op once it is done
        assert ctx.run is not None
        if ctx.run.took_ms:
            self.metrics.msearch_seconds.observe(timer.ms["msearch"] / 1000)
            self.metrics.observe_legs({str(leg): ms for leg, ms in ctx.run.took_ms.items()})
        await run_stages(self.ranking, ctx)
        await run_stages(self.post_ranking, ctx)
        with timer.stage("page"):  # the page's text and span, read for its rows only
            page = await self.scoped.page_rows(ctx.kept[request.offset : request.window])
        fusion = FusionParams(plan.weights, plan.fusion_rrf_k, plan.mode, plan.fusion_method)
        explain = fusion if request.explain else None
        ctx.hits = [hit_json(c, ctx.verified[c.version_id], explain) for c in page]
        ctx.has_more = len(ctx.kept) > request.window
        await run_stages(self.answer, ctx)
        reason = await self.scoped.empty_reason(request, scope) if not ctx.kept else None
        return self.result(ctx, page, reason, timer.finish())

    def result(
        self, ctx: QueryContext, page: Sequence[Candidate], reason: str | None, timings: dict[str, float]
    ) -> SearchResult:
        """The answer of a ranked search whose stages have run (and its retrieval statistics recorded)."""
        request, plan, identity = ctx.request, ctx.plan, ctx.identity
        mode_info = plan.mode_json()
        pending = sum(1 for c in page if c.source.get(VECTOR_PENDING))  # the caller's own hits only
        if pending:
            mode_info["vectors_pending"] = pending
        if request.mode is None and plan.mode != "hybrid":
            ctx.fallbacks.append(f"default_mode_{plan.mode}")
        self.record(request, plan.mode, page, ctx.legs, identity, reason, ctx.fallbacks, timings["total"])
        ambiguous = [s.to_json() for s in identity.subjects] if identity.outcome == "ambiguous" else None
        return SearchResult(
            ctx.hits,
            request.offset,
            request.limit,
            ctx.has_more,
            timings,
            mode_info,
            ambiguous=ambiguous,
            identity=identity.to_json() if request.explain else None,
            synonyms=list(plan.expansion.added) if request.explain else None,
            semantic_floor={"similarity": ctx.floor, "dropped": ctx.below_floor} if request.explain else None,
            evidence=ctx.evidence,
            graph=ctx.graph,
            reason=reason,
            plan=plan.to_json() if request.explain else None,
            answer_gate=ctx.answer_gate if request.explain else None,
        )

    def record(
        self,
        request: SearchRequest,
        mode: Mode,
        page: Sequence[Candidate],
        legs: Mapping[str, Sequence[LegHit]],
        identity: Identity,
        reason: str | None,
        fallbacks: Sequence[str],
        took_ms: float,
    ) -> None:
        """The query's retrieval statistics: metrics now, the statistics table in the background."""
        stats = query_stats(
            mode=mode,
            page=page,
            legs=legs,
            identity=identity.outcome,
            reason=reason,
            fallbacks=fallbacks,
            took_ms=took_ms,
            query=request.query if self.settings.api.stats.store_query_text else None,
        )
        self.metrics.observe_query(stats)
        if self.stats is not None:
            self.stats.record(stats)
