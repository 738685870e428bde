"""Explain (search.ranking.hits): the parts of a fused score add up to it (no services)."""

from __future__ import annotations

import pytest

from search.ranking.fusion import apply_boost, rrf
from search.ranking.hits import FusionParams, explain_json
from search.ranking.legs import LegHit


def hit(i: int, status: str) -> LegHit:
    return LegHit(f"c{i}", 1.0, {"document_id": i, "document_version_id": i, "project_id": 1, "version_status": status})


def test_parts_times_boost_is_the_score() -> None:
    weights = {"lexical": 1.0, "semantic": 0.5, "identifier": 1.5}
    legs = {
        "lexical": [hit(1, "executed"), hit(2, "draft")],
        "semantic": [hit(2, "draft"), hit(3, "final")],
        "identifier": [hit(1, "executed")],
    }
    fused = apply_boost(rrf(legs, weights, 60), {"executed": 1.2, "draft": 0.7})
    for c in fused:
        ex = explain_json(c, FusionParams(weights, 60))
        for leg, rank in ex["ranks"].items():
            assert ex["rrf_parts"][leg] == pytest.approx(weights[leg] / (60 + rank))
        assert ex["rrf_score"] * ex["status_boost"] == pytest.approx(c.score)
        assert ex["fused_score"] == c.score and ex["rerank_score"] is None
    by_id = {c.chunk_id: explain_json(c, FusionParams(weights, 60)) for c in fused}
    assert by_id["c1"]["ranks"] == {"lexical": 0, "identifier": 0} and by_id["c1"]["status_boost"] == 1.2
    assert by_id["c2"]["ranks"] == {"lexical": 1, "semantic": 0} and by_id["c2"]["status_boost"] == 0.7
    assert by_id["c3"]["weights"] == {"semantic": 0.5} and by_id["c3"]["status_boost"] == 1.0
