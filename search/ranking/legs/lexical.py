"""The lexical leg: BM25 over the chunk text, matching the query with synonyms added."""

from __future__ import annotations

from typing import Any

from search.ranking.legs.base import Leg, LegQuery, with_filter


class Lexical(Leg):
    name = "lexical"
    weight_key = "weight_lexical"
    modes = frozenset({"hybrid", "lexical"})

    def query(self, q: LegQuery, depth: int) -> dict[str, Any] | None:
        if q.blocked:
            return None
        return with_filter({"match": {"text": {"query": q.lexical_query}}}, q.strict)
