"""The top collapsed hits through the rerank gateway (search.ranking.rerank); its failure answers the request,
never a silent fallback to the unreranked order (`rerank` in the timings)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Protocol

from search.access.reverify import VerifiedVersion
from search.pipeline import QueryContext, Stage
from search.ranking.fusion import Candidate
from search.ranking.rerank import RERANK_TOP_N, Reranker, RerankUnavailable, apply_rerank, passages
from search.telemetry.metrics import SearchMetrics


class PageRows(Protocol):
    """The page fields' read (search.ranking.scoped.ScopedIndex.page_rows)."""

    def __call__(self, page: Sequence[Candidate]) -> Awaitable[list[Candidate]]: ...


class RerankGateway:
    """The reranker port, timed."""

    def __init__(self, reranker: Reranker, metrics: SearchMetrics, page_rows: PageRows) -> None:
        self.reranker, self.metrics, self.page_rows = reranker, metrics, page_rows

    async def rerank(self, query: str, kept: list[Candidate], verified: dict[int, VerifiedVersion]) -> list[Candidate]:
        """The top RERANK_TOP_N collapsed hits through the gateway (raises; never a silent fallback). The legs
        read no text: the passages' is read here, for those hits only."""
        top = await self.page_rows(kept[:RERANK_TOP_N])
        kept = top + kept[RERANK_TOP_N:]
        items = passages(top, [verified[c.version_id].title for c in top])
        started = time.perf_counter()
        try:
            scores = await self.reranker.scores(query, items)
        except RerankUnavailable:
            self.metrics.rerank_seconds.labels("error").observe(time.perf_counter() - started)
            raise
        self.metrics.rerank_seconds.labels("ok").observe(time.perf_counter() - started)
        return apply_rerank(kept, scores, top_n=len(top))


class Rerank(Protocol):
    """The rerank port (`RerankGateway.rerank`)."""

    def __call__(
        self, query: str, kept: list[Candidate], verified: dict[int, VerifiedVersion]
    ) -> Awaitable[list[Candidate]]: ...


class RerankStage(Stage):
    name = "rerank"

    def __init__(self, rerank: Rerank | None) -> None:
        self.rerank = rerank

    def applies(self, ctx: QueryContext) -> bool:
        return self.rerank is not None and bool(ctx.kept)

    async def run(self, ctx: QueryContext) -> None:
        assert self.rerank is not None
        ctx.kept = await self.rerank(ctx.request.query, ctx.kept, ctx.verified)
