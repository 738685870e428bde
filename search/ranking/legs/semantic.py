"""The semantic leg: approximate kNN on the query vector, pre-filtered (the strict filter is the kNN `filter`,
never a post-filter). Sent whenever there is a vector, also through a `match_none` filter."""

from __future__ import annotations

from typing import Any

from search.ranking.legs.base import Leg, LegQuery


def knn_clause(vector: list[float], k: int, strict: dict[str, Any], ef_search: int = 0) -> dict[str, Any]:
    """The kNN leg's clause: `k` neighbours through the filter; with `ef_search`, that many candidates per
    segment (at least `k`) where the engine's default would be fewer."""
    clause: dict[str, Any] = {"vector": vector, "k": k, "filter": strict}
    if ef_search:
        clause["method_parameters"] = {"ef_search": max(k, ef_search)}
    return clause


class Semantic(Leg):
    name = "semantic"
    weight_key = "weight_semantic"
    modes = frozenset({"hybrid", "semantic"})

    def query(self, q: LegQuery, depth: int) -> dict[str, Any] | None:
        if q.vector is None:
            return None
        return {"knn": {"embedding": knn_clause(q.vector, depth, q.strict, q.ef_search)}}
