"""Retrieval statistics of one ranked answer (search.stats.query_stats)."""

from __future__ import annotations

from search.fusion import Candidate
from search.legs import LegHit
from search.stats import query_stats


def cand(chunk: str, *legs: str, score: float = 1.0) -> Candidate:
    return Candidate(chunk, score, {}, ranks=dict.fromkeys(legs, 0))


def test_hit_sources_top_scores_and_zero_results() -> None:
    page = [
        cand("a", "lexical", score=0.05),
        cand("b", "semantic"),
        cand("c", "lexical", "semantic"),
        cand("d", "identifier"),
        cand("e", "identifier", "semantic"),
    ]
    legs = {"lexical": [LegHit("a", 12.5, {})], "semantic": [LegHit("b", 0.91, {})], "identifier": []}
    stats = query_stats(mode="hybrid", page=page, legs=legs, identity="none", reason=None,
                        fallbacks=["x", "x"], took_ms=12.34567, query=None)  # fmt: skip
    assert (stats.lexical_only, stats.semantic_only, stats.both) == (2, 1, 2)
    assert (stats.top_lexical, stats.top_semantic, stats.top_fused) == (12.5, 0.91, 0.05)
    assert stats.fallbacks == ("x",) and stats.took_ms == 12.346 and not stats.zero_result
    empty = query_stats(mode="lexical", page=[], legs={}, identity="none", reason="scope_empty",
                        fallbacks=[], took_ms=1.0, query="Kündigung")  # fmt: skip
    assert empty.zero_result and empty.top_fused is None and empty.top_lexical is None and empty.query == "Kündigung"
