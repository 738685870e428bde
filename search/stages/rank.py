"""The legs' lists as one ranking (search.ranking.floor, .fusion): the relevance floor on the semantic leg,
fusion, status boost, decay, the promoted bonus (`fuse` in the timings)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from ki.settings import RetrievalSettings
from search.pipeline import QueryContext, Stage
from search.ranking.floor import apply_floor, floor_empties_answer, floor_for
from search.ranking.fusion import apply_boost, apply_decay, apply_promoted, fuse
from search.telemetry.metrics import SearchMetrics


class RankStage(Stage):
    name = "fuse"

    def __init__(self, retrieval: RetrievalSettings, signature: Callable[[], str], metrics: SearchMetrics) -> None:
        self.retrieval, self.signature, self.metrics = retrieval, signature, metrics

    async def run(self, ctx: QueryContext) -> None:
        """Also keeps the legs as fused, the floor and how many hits it dropped."""
        r, request, plan = self.retrieval, ctx.request, ctx.plan
        assert ctx.run is not None
        legs = {str(leg): found for leg, found in ctx.run.hits.items()}
        floor = floor_for(r, self.signature())
        below_floor = 0
        before = dict(legs)
        if "semantic" in legs:
            legs["semantic"], below_floor = apply_floor(legs["semantic"], floor, r.vector_space_type)
        if below_floor:
            self.metrics.floor_dropped.inc(below_floor)
        if floor is not None and r.semantic_floor_gates_answer and floor_empties_answer(before, len(legs["semantic"])):
            legs = {leg: [] for leg in legs}  # no credible evidence: the answer is empty, with that reason
        fused = fuse(legs, plan.weights, plan.fusion_method, plan.fusion_rrf_k, request.query)
        fused = apply_boost(fused, r.version_status_boost)
        if r.decay_enabled:
            fused = apply_decay(fused, request.as_of or dt.datetime.now(dt.UTC).date(), r.decay_min_weight)
        fused = apply_promoted(fused, r.promoted_bonus)
        ctx.legs, ctx.fused, ctx.floor, ctx.below_floor = legs, fused, floor, below_floor
