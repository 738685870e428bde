"""The query's vector (search.ranking.query_vectors): through the embedder port, cached for the caller's
principals only. The service starts it beside the scope; the stage waits for it (`embed` in the timings)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ki.embedding import Embedder
from search.pipeline import QueryContext, Stage
from search.ranking.query_vectors import EmbeddingCache
from search.telemetry.metrics import SearchMetrics


class EmbedStage(Stage):
    name = "embed"

    def __init__(self, embedder: Embedder, cache: EmbeddingCache, metrics: SearchMetrics) -> None:
        self.embedder, self.cache, self.metrics = embedder, cache, metrics

    async def embed(self, query: str, principals: Sequence[str] = ()) -> list[float]:
        """The query's vector, cached for this caller (`principals`, the token's) only."""
        key = EmbeddingCache.key(self.embedder.signature, query, principals)
        cached = self.cache.get(key)
        self.metrics.embed_cache.labels("miss" if cached is None else "hit").inc()
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(None, self.embedder.embed_queries, [query])
        vector = [float(x) for x in vectors[0]]
        self.cache.put(key, vector)
        return vector

    async def run(self, ctx: QueryContext) -> None:
        """The vector the plan needs: the one being computed, else embedded now."""
        vector = ctx.vector
        if vector is None and ctx.plan.needs_vector:
            vector = self.embed(ctx.plan.expansion.text, ctx.principals)
        ctx.query_vector = await vector if vector is not None else None
