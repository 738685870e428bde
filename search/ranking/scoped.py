"""The index as one caller may read it: every OpenSearch read of a search goes through the caller's scope.

A scope is sent as a filter of bounded size (search.access.scope): the exact document ids when they fit,
else a superset (the caller's projects, or no scope clause at all) whose hits are checked against the
exact scope one by one. With a superset filter a leg may lose hits to that check; it is then asked again
for more until it has what the page needs or the index has no more. Every read's failure comes out as a
`ki.errors` type (no partial answers).
"""

from __future__ import annotations

import math
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opensearchpy import AsyncOpenSearch

from ki.clients import opensearch_errors
from search.access.scope import MATCH_NONE, CompiledScope, ScopeFilter, strict_filter
from search.ranking.fusion import Candidate
from search.ranking.legs import (
    LEGS,
    PAGE_SOURCE_INCLUDES,
    SOURCE_INCLUDES,
    LegHit,
    LegName,
    LegRun,
    knn_clause,
    leg_took,
    msearch_lines,
    parse_msearch,
)
from search.ranking.neighbours import plan_neighbours
from search.request import SearchFilters, SearchRequest, metadata_clauses, point_in_time_clauses

if TYPE_CHECKING:
    from search.telemetry.metrics import SearchMetrics

# A leg asked again for more hits (superset scope filter) grows by this factor, up to OpenSearch's
# default `index.max_result_window`.
FILL_GROWTH = 4
MAX_FILL_SIZE = 10_000
MIN_DENSITY = 0.02  # a sparser scope starts at 50x depth and grows from there
EMPTY_REASON_PROBE = 200  # rows an empty answer's reason looks at through a superset scope filter


def admitted(hits: Sequence[LegHit], scope: CompiledScope) -> list[LegHit]:
    """The hits the exact scope filter would have let through."""
    return [h for h in hits if admits(scope, h.source)]


def admits(scope: CompiledScope, source: dict[str, Any]) -> bool:
    try:
        return scope.admits(int(source["document_id"]), int(source["project_id"]), int(source["document_version_id"]))
    except (KeyError, TypeError, ValueError):
        return False  # a row without its ids is no row of the scope


def resized(body: dict[str, Any], size: int) -> dict[str, Any]:
    """The same leg asking for `size` hits (the kNN leg: `k` too)."""
    out = {**body, "size": size}
    knn = body.get("query", {}).get("knn")
    if knn:
        ((field_name, spec),) = knn.items()
        ef_search = spec.get("method_parameters", {}).get("ef_search", 0)
        out["query"] = {"knn": {field_name: knn_clause(spec["vector"], size, spec["filter"], ef_search)}}
    return out


def first_size(chosen: ScopeFilter, depth: int) -> int:
    """Hits a leg asks for first: `depth`, or through a superset filter as many as should leave `depth`
    in scope at the filter's density, with a quarter to spare (so one round trip usually suffices)."""
    if chosen.exact:
        return depth
    return min(math.ceil(depth / max(chosen.density, MIN_DENSITY) * 1.25), MAX_FILL_SIZE)


def prefix_end(candidates: Sequence[Candidate], n: int) -> int:
    """`n`, moved past candidates scoring the same as the n-th: a prefix cut between equal scores could
    collapse differently from the whole list."""
    n = min(n, len(candidates))
    while 0 < n < len(candidates) and candidates[n].score == candidates[n - 1].score:
        n += 1
    return n


async def run_legs(client: AsyncOpenSearch, index: str, bodies: dict[LegName, dict[str, Any]]) -> LegRun:
    """All active legs in one `_msearch` round-trip (none sent if no leg is active)."""
    if not bodies:
        return LegRun({name: [] for name in LEGS}, {})
    response = await client.msearch(body=msearch_lines(index, bodies))
    return LegRun(parse_msearch(bodies, response), leg_took(bodies, response))


class ScopedIndex:
    """The search index read through callers' scopes. `filter_budget`: bytes of scope clause per query
    (None: always the exact filter, the reference path in tests)."""

    def __init__(self, client: AsyncOpenSearch, index: str, filter_budget: int | None, metrics: SearchMetrics) -> None:
        self.client, self.index, self.filter_budget, self.metrics = client, index, filter_budget, metrics

    async def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await an OpenSearch call; its failures come out as `ki.errors` types."""
        with opensearch_errors():
            return await coro

    async def search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """One query's hits (the caller builds `body` on `request_filter`)."""
        response = await self.call(self.client.search(index=self.index, body=body))
        hits: list[dict[str, Any]] = response.get("hits", {}).get("hits", [])
        return hits

    def scope_filter(self, scope: CompiledScope) -> ScopeFilter:
        chosen = scope.bounded_filter(self.filter_budget)
        self.metrics.scope_filter.labels(chosen.kind).inc()
        return chosen

    def request_filter(self, request: SearchRequest, scope: CompiledScope) -> dict[str, Any]:
        """The scope filter with the request's metadata filters and `as_of`, as every query of a search uses it."""
        clauses = metadata_clauses(request.filters) + point_in_time_clauses(request.as_of)
        return strict_filter(self.scope_filter(scope), clauses)

    async def fill_legs(
        self, bodies: dict[LegName, dict[str, Any]], scope: CompiledScope, chosen: ScopeFilter, depth: int
    ) -> tuple[LegRun, int]:
        """Every leg's hits exactly as the exact scope filter gives them: `bodies` were sized for `chosen`
        (`first_size`); with a superset filter each leg's hits are checked against the scope, and a leg that
        lost some is asked again for more (all such legs in one `_msearch`) until it has `depth` or has no
        more. Returns the legs and the number of `_msearch` round trips."""
        size = first_size(chosen, depth)
        run = await self.call(run_legs(self.client, self.index, bodies))
        if chosen.exact:
            return replace(run, scope_filter=chosen.kind), 1
        hits = {leg: admitted(found, scope) for leg, found in run.hits.items()}
        took = dict(run.took_ms)
        full = {leg for leg in bodies if len(run.hits[leg]) >= size}  # the leg may have more
        rounds = 1
        while size < MAX_FILL_SIZE:
            short = {leg: body for leg, body in bodies.items() if leg in full and len(hits[leg]) < depth}
            if not short:
                break
            size = min(size * FILL_GROWTH, MAX_FILL_SIZE)
            more = await self.call(
                run_legs(self.client, self.index, {leg: resized(b, size) for leg, b in short.items()})
            )
            rounds += 1
            for leg in short:
                hits[leg] = admitted(more.hits[leg], scope)
                took[leg] = took.get(leg, 0.0) + more.took_ms.get(leg, 0.0)
                if len(more.hits[leg]) < size:
                    full.discard(leg)
        if any(leg in full and len(hits[leg]) < depth for leg in bodies):
            self.metrics.scope_fill_exhausted.inc()
        self.metrics.scope_fill_rounds.observe(rounds)
        return LegRun({leg: found[:depth] for leg, found in hits.items()}, took, chosen.kind), rounds

    async def newest_versions(self, scope: CompiledScope, filters: SearchFilters, depth: int) -> list[Candidate]:
        """Metadata-only: the scope's versions matching `filters`, `doc_date` descending, one row each (score
        0), the first `depth` of them."""
        chosen = self.scope_filter(scope)
        strict = strict_filter(chosen, metadata_clauses(filters))
        if strict == MATCH_NONE:
            return []
        size = first_size(chosen, depth)
        while True:  # with a superset filter: until `depth` versions pass the scope or none are left
            body = {
                "size": size,
                "track_total_hits": False,
                "_source": {"includes": SOURCE_INCLUDES},
                "query": {"bool": {"filter": [strict]}},
                "sort": [
                    {"doc_date": {"order": "desc", "missing": "_last"}},
                    {"document_version_id": {"order": "asc"}},
                ],
                "collapse": {"field": "document_version_id"},
            }
            found = await self.search(body)
            candidates = [Candidate(h["_id"], 0.0, h.get("_source") or {}) for h in found]
            if not chosen.exact:
                candidates = [c for c in candidates if admits(scope, c.source)]
            if chosen.exact or len(candidates) >= depth or len(found) < size or size >= MAX_FILL_SIZE:
                return candidates[:depth]
            size = min(size * FILL_GROWTH, MAX_FILL_SIZE)

    async def empty_reason(self, request: SearchRequest, scope: CompiledScope) -> str:
        """Why a ranked answer is empty: `scope_empty` (the caller may see no document, within the project
        narrowing), `filtered_out` (the metadata filters and `as_of` leave none of them), else
        `no_credible_evidence` (documents are there, nothing matched). Decided on the caller's scope only:
        with a superset scope filter, rows are counted only if the scope admits them, so the reason never
        depends on documents the caller may not see."""
        if scope.is_empty:
            return "scope_empty"
        clauses = metadata_clauses(request.filters) + point_in_time_clauses(request.as_of)
        if not clauses:
            return "no_credible_evidence"
        chosen = self.scope_filter(scope)
        strict = strict_filter(chosen, clauses)
        if strict == MATCH_NONE:
            return "filtered_out"
        size = 0 if chosen.exact else EMPTY_REASON_PROBE
        body = {
            "size": size,
            "track_total_hits": 1,
            "_source": {"includes": ["document_id", "project_id", "document_version_id"]},
            "query": {"bool": {"filter": [strict]}},
        }
        response = await self.call(self.client.search(index=self.index, body=body))
        hits = response.get("hits", {})
        if chosen.exact:
            return "no_credible_evidence" if hits.get("total", {}).get("value", 0) else "filtered_out"
        found = hits.get("hits", [])
        if any(admits(scope, h.get("_source") or {}) for h in found):
            return "no_credible_evidence"
        return "filtered_out" if len(found) < size else "no_credible_evidence"  # not sure: say less

    async def page_rows(self, page: Sequence[Candidate]) -> list[Candidate]:
        """The page's candidates with their rows' page fields (`PAGE_SOURCE_INCLUDES`: the text, the span, ...)
        added to what the legs read, in one `mget` of the page's ids -- rows the re-verify has just admitted,
        asked in id order, so the request is the page's and nothing else's (not its rank order either). A row
        gone since the legs read it (its version deleted meanwhile) leaves the page."""
        if not page:
            return []
        ids = {"ids": sorted({c.chunk_id for c in page})}
        params = {"_source_includes": ",".join(PAGE_SOURCE_INCLUDES)}
        response = await self.call(self.client.mget(index=self.index, body=ids, params=params))
        rows = {d["_id"]: d.get("_source") or {} for d in response.get("docs", []) if d.get("found")}
        return [replace(c, source={**rows[c.chunk_id], **c.source}) for c in page if c.chunk_id in rows]

    async def add_neighbours(self, hits: list[dict[str, Any]], per_document: int) -> None:
        """Chunk expansion (search.ranking.neighbours): every hit's neighbours, fetched in one `mget`, as
        `context`. Neighbours are chunks of the hit's own version, which the re-verify already admitted."""
        planned = plan_neighbours([(h["chunk_id"], h["document_id"]) for h in hits], per_document)
        for hit in hits:
            hit["context"] = []
        if not planned:
            return
        ids = {"ids": [n.chunk_id for n in planned]}
        response = await self.call(self.client.mget(index=self.index, body=ids, params={"_source_includes": "text"}))
        texts = {d["_id"]: (d.get("_source") or {}).get("text", "") for d in response.get("docs", []) if d.get("found")}
        by_hit = {h["chunk_id"]: h for h in hits}
        for n in planned:
            if n.chunk_id in texts:
                by_hit[n.hit_chunk_id]["context"].append(
                    {"chunk_id": n.chunk_id, "position": n.position, "text": texts[n.chunk_id]}
                )
        for hit in hits:  # reading order: before, after
            hit["context"].sort(key=lambda c: c["position"] != "before")
