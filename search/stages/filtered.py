"""The metadata-only search (`/v1/search/filter`): a filter-only query through the scoped index reader,
doc_date descending, one hit per version, score 0, each re-verified in SQL."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ki.settings import Settings
from search.pipeline import SearchResult, matches
from search.ports import SqlReader
from search.ranking.hits import FusionParams, hit_json, mark_injections
from search.ranking.legs import leg_depth
from search.ranking.scoped import ScopedIndex
from search.request import FilterRequest
from search.stages.answer import link_sources
from search.stages.scope import ScopeStage


class FilterSearch:
    def __init__(self, settings: Settings, scope: ScopeStage, scoped: ScopedIndex, sql: SqlReader) -> None:
        self.settings, self.scope, self.scoped, self.sql = settings, scope, scoped, sql

    async def run(self, principals: Sequence[str], request: FilterRequest) -> SearchResult:
        t0 = time.perf_counter()
        scope = await self.scope.compile(principals, request.filters.project_id)
        candidates = await self.scoped.newest_versions(scope, request.filters, leg_depth(request.window))
        verified = await self.sql.reverify(principals, [c.version_id for c in candidates], scope) if candidates else {}
        seen: set[int] = set()
        survivors = []
        for c in candidates:
            if matches(c, verified) and c.version_id not in seen:
                seen.add(c.version_id)
                survivors.append(c)
        page = await self.scoped.page_rows(survivors[request.offset : request.window])
        explain = FusionParams({}, self.settings.retrieval.fusion_rrf_k) if request.explain else None
        hits = [hit_json(c, verified[c.version_id], explain) for c in page]
        link_sources(hits, verified, self.settings.api.evidence.source_urls)
        mark_injections(hits, self.settings.api.evidence.injection)
        timings = {"total": (time.perf_counter() - t0) * 1000}
        return SearchResult(hits, request.offset, request.limit, len(survivors) > request.window, timings)
