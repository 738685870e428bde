"""The ranked legs (one module each, registered in `REGISTRY`): their bodies, and the reading of their
`_msearch` answer (the round trip itself is `search.ranking.scoped.run_legs`; this package does no I/O).

Every leg carries the same strict filter (scope + metadata). The semantic leg passes it as the kNN
`filter` (pre-filtered approximate kNN), never as a post-filter. Skip rules: lexical and identifier
bodies are not sent when the filter is `match_none`; the identifier body also not for a blank query;
the semantic body is always sent (given a query vector). A leg weighted 0 is not sent at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ki.errors import (
    TOO_MANY_CLAUSES_TYPES,
    ItemFailure,
    KiError,
    QueryTooManyTerms,
    Rejected,
    SearchUnavailable,
    error_types,
)
from search.access.scope import MATCH_NONE
from search.ranking.legs.base import MAX_LEG_DEPTH, Leg, LegName, LegQuery, leg_depth
from search.ranking.legs.identifier import Identifier
from search.ranking.legs.lexical import Lexical
from search.ranking.legs.semantic import Semantic, knn_clause

# The legs, in send order: a leg is one module of this package plus its line here.
REGISTRY: tuple[Leg, ...] = (Lexical(), Semantic(), Identifier())
LEGS: tuple[LegName, ...] = tuple(leg.name for leg in REGISTRY)
# What fusion, re-verification and collapse read from a leg's hit (its ids, status, date, promotion and
# identifiers): every leg asks only for these, for up to 2,500 hits each. The page's own fields -- the text above
# all, ~1.2 kB a row against ~0.2 kB for these -- are read for the page's rows only, once they are known
# (`PAGE_SOURCE_INCLUDES`, `search.ranking.scoped.ScopedIndex.page_rows`). Never asked: the vector, and the
# principal projection (the scope filter matches its indexed terms and the sync reads it back).
SOURCE_INCLUDES = [
    "document_id",
    "document_version_id",
    "project_id",
    "version_status",
    "promoted",
    "doc_date",
    "identifiers",
]
# What the page's hits show besides those (search.ranking.hits.hit_json, the answer's `vectors_pending`).
PAGE_SOURCE_INCLUDES = [
    "text",
    "chunk_kind",
    "language",
    "meta.locus",
    "meta.start",
    "meta.end",
    "vector_pending",
]

__all__ = [
    "LEGS", "MAX_LEG_DEPTH", "PAGE_SOURCE_INCLUDES", "REGISTRY", "SOURCE_INCLUDES", "Leg", "LegName", "LegQuery",
    "knn_clause", "leg_depth",
]  # fmt: skip


@dataclass(frozen=True)
class LegHit:
    id: str
    score: float
    source: dict[str, Any]


def active_legs(weights: Mapping[str, float]) -> frozenset[LegName]:
    """Legs that can contribute to the fused score: a leg weighted 0 is not run at all (its hits would
    only add score-0 candidates)."""
    return frozenset(leg for leg in LEGS if float(weights.get(leg, 0.0)) > 0)


def build_leg_bodies(
    query: str,
    vector: list[float] | None,
    strict: dict[str, Any],
    window: int,
    legs: frozenset[LegName] = frozenset(LEGS),
    lexical_query: str | None = None,
    ef_search: int = 0,
) -> dict[LegName, dict[str, Any]]:
    """The request body of every leg that can match, keyed by leg name (insertion order = send order).
    `lexical_query`: what the lexical leg matches, if not `query` (the query with synonyms added)."""
    q = LegQuery(query, lexical_query or query, vector, strict, strict == MATCH_NONE, ef_search)
    bodies: dict[LegName, dict[str, Any]] = {}
    for leg in REGISTRY:
        if leg.name not in legs:
            continue
        clause = leg.query(q, depth := leg.depth(window))
        if clause is not None:
            bodies[leg.name] = {"size": depth, "_source": {"includes": SOURCE_INCLUDES}, "track_total_hits": False,
                                "query": clause}  # fmt: skip
    return bodies


def msearch_lines(index: str, bodies: dict[LegName, dict[str, Any]]) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for body in bodies.values():
        lines.append({"index": index})
        lines.append(body)
    return lines


def parse_msearch(bodies: dict[LegName, dict[str, Any]], response: dict[str, Any]) -> dict[LegName, list[LegHit]]:
    """Hits per leg in rank order. Nothing degrades silently: a leg that failed raises, by its status,
    `SearchUnavailable` (429/5xx, or a missing response), `QueryTooManyTerms` (the query text has more
    terms than one query may match) or `Rejected` (OpenSearch refused the query)."""
    responses = response.get("responses") or []
    names = list(bodies)
    if len(responses) != len(names):
        raise SearchUnavailable(f"_msearch returned {len(responses)} responses for {len(names)} legs")
    out: dict[LegName, list[LegHit]] = {}
    for name, item in zip(names, responses, strict=True):
        if "error" in item:
            raise leg_error(name, item)
        hits = item.get("hits", {}).get("hits", [])
        out[name] = [LegHit(h["_id"], float(h.get("_score") or 0.0), h.get("_source") or {}) for h in hits]
    for name in LEGS:
        out.setdefault(name, [])
    return out


def leg_error(name: LegName, item: dict[str, Any]) -> KiError:
    """By the failed item's status and error types, never its message (`ki.errors.ItemFailure`)."""
    error = item["error"]
    kind, reason = (str(error.get("type", "")), error.get("reason")) if isinstance(error, dict) else ("", error)
    failure = ItemFailure(int(item.get("status", 500)), kind, str(reason or kind))
    message = f"{name} leg failed: {failure}"
    if failure.transient:
        return SearchUnavailable(message)
    if error_types(error) & TOO_MANY_CLAUSES_TYPES:
        return QueryTooManyTerms()
    return Rejected(message, service="opensearch")


def leg_took(bodies: dict[LegName, dict[str, Any]], response: dict[str, Any]) -> dict[LegName, float]:
    """OpenSearch's own `took` (ms) of each leg that reported one."""
    out: dict[LegName, float] = {}
    for name, item in zip(bodies, response.get("responses") or [], strict=False):
        took = item.get("took") if isinstance(item, dict) else None
        if isinstance(took, int | float):
            out[name] = float(took)
    return out


@dataclass(frozen=True)
class LegRun:
    hits: dict[LegName, list[LegHit]]
    took_ms: dict[LegName, float]
    scope_filter: str = "exact"  # the kind of scope clause the legs carried (search.access.scope)
