"""The identifier leg: the query's own text (no synonyms) against the chunks' identifiers (file numbers,
provisions). Not sent for a blank query."""

from __future__ import annotations

from typing import Any

from search.ranking.legs.base import Leg, LegQuery, with_filter


class Identifier(Leg):
    name = "identifier"
    weight_key = "weight_identifier"
    modes = frozenset({"hybrid", "lexical"})

    def query(self, q: LegQuery, depth: int) -> dict[str, Any] | None:
        if q.blocked or not q.query.strip():
            return None
        return with_filter({"match": {"identifiers_text": {"query": q.query}}}, q.strict)
