"""One retrieval leg behind one interface (`Leg`): the query it sends, the setting that weights it and the modes
that run it, its depth. The legs are registered in `search.ranking.legs.REGISTRY` (send order); adding a leg is
one module here plus its registration there and its weight setting in `ki.settings.RetrievalSettings`; the
registration binds that setting into the ranking hash (`search.ranking.mode_gate.RANKING_FIELDS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

# A leg's name: the key of its hits, its weight and its timing (`lexical`, `semantic`, `identifier`).
LegName = str
MAX_LEG_DEPTH = 2500


def leg_depth(window: int) -> int:
    """Hits per leg for a window of `window` (= offset + limit): min(max(n*5, 50), 2500)."""
    return min(max(window * 5, 50), MAX_LEG_DEPTH)


@dataclass(frozen=True)
class LegQuery:
    """What every leg builds its query from."""

    query: str  # the request's own text
    lexical_query: str  # the text with synonyms added (what the lexical leg matches)
    vector: list[float] | None  # the query vector (None: not embedded)
    strict: dict[str, Any]  # the scope and metadata filter every leg carries
    blocked: bool  # `strict` is `match_none`
    ef_search: int  # kNN candidates per segment (0: the engine's default)


class Leg(Protocol):
    """One retrieval leg."""

    name: ClassVar[LegName]
    weight_key: ClassVar[str]  # the `RetrievalSettings` field that weights it (a ranking setting)
    modes: ClassVar[frozenset[str]]  # the search modes that run it (search.ranking.mode_gate.Mode)

    def depth(self, window: int) -> int:
        """Hits it asks for for a window of `window`."""
        return leg_depth(window)

    def query(self, q: LegQuery, depth: int) -> dict[str, Any] | None:
        """Its query clause (carrying `q.strict`), or None when it cannot match and is not sent."""
        ...


def with_filter(query: dict[str, Any], strict: dict[str, Any]) -> dict[str, Any]:
    return {"bool": {"must": [query], "filter": [strict]}}
