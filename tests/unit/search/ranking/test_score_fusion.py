"""Score-aware fusion (`search.ranking.fusion.fuse` with `minmax` and `dbsf`): per-query
normalisation of each leg's scores, edge cases included, and a weighted sum; RRF stays the default and
leaves the ranking hash of committed evidence reports as it was."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ki.settings import RetrievalSettings
from search.ranking.fusion import fuse, normalise, rrf
from search.ranking.legs import LegHit
from search.ranking.mode_gate import ranking_hash


def hit(chunk: str, score: float, document: int = 1) -> LegHit:
    return LegHit(chunk, score, {"document_id": str(document), "document_version_id": str(document)})


@pytest.mark.parametrize("method", ["minmax", "dbsf"])
def test_empty_one_hit_and_equal_scores(method: str) -> None:
    assert normalise([], method) == []  # type: ignore[arg-type]
    assert normalise([7.3], method) == [1.0]  # type: ignore[arg-type]
    assert normalise([2.0, 2.0, 2.0], method) == [1.0, 1.0, 1.0]  # type: ignore[arg-type]


def test_minmax_spans_zero_to_one_and_keeps_the_order() -> None:
    assert normalise([12.0, 8.0, 4.0], "minmax") == [1.0, 0.5, 0.0]
    assert normalise([-1.0, -3.0], "minmax") == [1.0, 0.0]


def test_dbsf_clips_what_lies_beyond_three_standard_deviations() -> None:
    scores = [1000.0] + [10.0 + i / 10 for i in range(50)]
    dbsf = normalise(scores, "dbsf")
    assert dbsf[0] == 1.0 and all(0.0 < v < 1.0 for v in dbsf[1:])
    assert dbsf[1:] == sorted(dbsf[1:])


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=40), st.sampled_from(["minmax", "dbsf"]))
def test_normalised_scores_are_finite_in_unit_range_and_order_preserving(scores: list[float], method: str) -> None:
    out = normalise(scores, method)  # type: ignore[arg-type]
    assert len(out) == len(scores) and all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in out)
    for (a, x), (b, y) in zip(zip(scores, out, strict=True), zip(scores[1:], out[1:], strict=True), strict=False):
        if a > b:
            assert x >= y


def test_score_fusion_lets_a_strong_leg_win_where_rrf_ties() -> None:
    """Lexical is sure of `a` (BM25 30 against 3), semantic barely prefers `b` (0.81 against 0.80): RRF
    gives each its rank-0 part and ties them; a weighted sum of normalised scores follows the margins."""
    legs = {"lexical": [hit("a", 30.0, 1), hit("b", 3.0, 2)], "semantic": [hit("b", 0.81, 2), hit("a", 0.80, 1)]}
    weights = {"lexical": 1.0, "semantic": 1.0, "identifier": 1.5}
    tied = rrf(legs, weights, 60)
    assert tied[0].score == pytest.approx(tied[1].score)
    for method in ("minmax", "dbsf"):
        fused = fuse(legs, weights, method, 60)  # type: ignore[arg-type]
        assert [c.chunk_id for c in fused] == ["a", "b"], method
        first = fused[0]
        assert first.ranks == {"lexical": 0, "semantic": 1}
        assert first.score == pytest.approx(sum(first.parts.values()))


def test_a_leg_with_no_hits_or_weight_zero_adds_nothing() -> None:
    legs = {"lexical": [hit("a", 5.0, 1), hit("b", 1.0, 2)], "semantic": []}
    fused = fuse(legs, {"lexical": 2.0, "semantic": 1.0}, "minmax", 60)
    assert [(c.chunk_id, c.score) for c in fused] == [("a", 2.0), ("b", 0.0)]
    assert fuse(legs, {"lexical": 0.0}, "minmax", 60)[0].score == 0.0


def test_rrf_is_the_default_and_keeps_the_committed_ranking_hash() -> None:
    default = RetrievalSettings()
    assert default.fusion_method == "rrf"
    assert ranking_hash(default) == ranking_hash(default.model_copy(update={"fusion_method": "rrf"}))
    assert ranking_hash(default) != ranking_hash(default.model_copy(update={"fusion_method": "minmax"}))
    legs = {"lexical": [hit("a", 5.0, 1)], "semantic": [hit("b", 0.7, 2), hit("a", 0.6, 1)]}
    weights = {"lexical": 1.0, "semantic": 1.0}
    assert fuse(legs, weights, "rrf", 60) == rrf(legs, weights, 60)
