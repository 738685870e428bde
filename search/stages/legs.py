"""The legs (search.ranking.legs) in one `_msearch` through the scoped index reader: more rounds only when the
scope's bounded filter is a superset and a leg lost hits to it (search.ranking.scoped)."""

from __future__ import annotations

from typing import Any

from search.access.scope import CompiledScope, ScopeFilter, strict_filter
from search.pipeline import QueryContext, Stage
from search.plan import QueryPlan
from search.ranking.legs import LegName, LegRun, build_leg_bodies
from search.ranking.scoped import ScopedIndex, first_size, resized
from search.request import SearchRequest, metadata_clauses, point_in_time_clauses


class LegsStage(Stage):
    name = "msearch"

    def __init__(self, scoped: ScopedIndex, ef_search: int) -> None:
        self.scoped, self.ef_search = scoped, ef_search

    def bodies(
        self, request: SearchRequest, scope: CompiledScope | ScopeFilter, vector: list[float] | None, plan: QueryPlan
    ) -> dict[LegName, dict[str, Any]]:
        """The `_msearch` bodies of one ranked search (also what `ki bench search` sends raw as its baseline).

        A leg weighted 0 cannot add to any score, so it is not run at all: its hits would only trail the
        ranking with score 0 (this is how `ki eval` measures one leg alone)."""
        chosen = self.scoped.scope_filter(scope) if isinstance(scope, CompiledScope) else scope
        strict = strict_filter(chosen, metadata_clauses(request.filters) + point_in_time_clauses(request.as_of))
        bodies = build_leg_bodies(request.query, vector, strict, request.window, plan.legs,
                                  lexical_query=plan.expansion.text, ef_search=self.ef_search)  # fmt: skip
        if chosen.exact:
            return bodies
        return {leg: resized(body, first_size(chosen, plan.depth)) for leg, body in bodies.items()}

    async def in_scope(
        self, request: SearchRequest, scope: CompiledScope, vector: list[float] | None, plan: QueryPlan
    ) -> tuple[LegRun, int]:
        """Every leg's hits exactly as the exact scope filter gives them, through a filter of bounded size
        (search.ranking.scoped). Returns the legs and the number of `_msearch` round trips."""
        chosen = self.scoped.scope_filter(scope)
        bodies = self.bodies(request, chosen, vector, plan)
        return await self.scoped.fill_legs(bodies, scope, chosen, plan.depth)

    async def run(self, ctx: QueryContext) -> None:
        ctx.run, _ = await self.in_scope(ctx.request, ctx.scope, ctx.query_vector, ctx.plan)
        if ctx.run.scope_filter != "exact":
            ctx.fallbacks.append(f"scope_filter_{ctx.run.scope_filter}")
