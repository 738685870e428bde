"""Pure ranking steps: weighted RRF, matched identifiers, status boost, collapse."""

from __future__ import annotations

import datetime as dt

import pytest

from search.ranking.fusion import Candidate, age_factor, apply_boost, apply_decay, collapse, matched_identifiers, rrf
from search.ranking.legs import LegHit

W = {"lexical": 1.0, "semantic": 1.0, "identifier": 1.5}


def hit(chunk: str, doc: int = 1, version: int | None = None, status: str = "final", **extra: object) -> LegHit:
    source = {
        "document_id": str(doc),
        "document_version_id": str(version or doc),
        "project_id": "1",
        "version_status": status,
        **extra,
    }
    return LegHit(chunk, 1.0, source)


def test_rrf_sums_weighted_reciprocal_ranks_from_zero() -> None:
    legs = {"lexical": [hit("a"), hit("b")], "semantic": [hit("b")], "identifier": []}
    out = {c.chunk_id: c for c in rrf(legs, W, 60)}
    assert out["a"].score == pytest.approx(1 / 60)
    assert out["b"].score == pytest.approx(1 / 61 + 1 / 60)
    assert out["b"].ranks == {"lexical": 1, "semantic": 0}
    assert out["b"].parts == pytest.approx({"lexical": 1 / 61, "semantic": 1 / 60})
    assert [c.chunk_id for c in rrf(legs, W, 60)] == ["b", "a"]


def test_identifier_weight_and_k_come_from_arguments() -> None:
    legs = {"lexical": [hit("a")], "identifier": [hit("b")]}
    ranked = rrf(legs, W, 10)
    assert [c.chunk_id for c in ranked] == ["b", "a"]
    assert ranked[0].score == pytest.approx(1.5 / 10)
    assert rrf(legs, {"lexical": 2.0, "identifier": 1.5}, 10)[0].chunk_id == "a"


def test_matched_identifiers_casefolded_substring_only_for_identifier_leg() -> None:
    ids = ["2 BvR 1234/19", "§ 823 BGB", "HRB 999"]
    assert matched_identifiers(ids, "siehe 2 bvr 1234/19 und § 823 bgb!") == ("2 BvR 1234/19", "§ 823 BGB")
    legs = {"lexical": [hit("a", identifiers=ids)], "identifier": [hit("b", doc=2, identifiers=ids)]}
    out = {c.chunk_id: c for c in rrf(legs, W, 60, query="Az. 2 BVR 1234/19")}
    assert out["b"].matched_identifiers == ("2 BvR 1234/19",)
    assert out["a"].matched_identifiers == ()  # not found by the identifier leg
    assert out["b"].score == pytest.approx(1.5 / 60)  # reported, not scored


def test_boost_multiplies_by_status_and_defaults_to_one() -> None:
    legs = {
        "lexical": [
            hit("d", doc=1, status="draft"),
            hit("e", doc=2, status="executed"),
            hit("x", doc=3, status="weird"),
        ]
    }
    boosted = apply_boost(rrf(legs, W, 60), {"executed": 1.2, "draft": 0.7})
    scores = {c.chunk_id: c for c in boosted}
    assert scores["d"].score == pytest.approx(0.7 / 60)
    assert scores["e"].score == pytest.approx(1.2 / 61)
    assert scores["x"].score == pytest.approx(1 / 62) and scores["x"].boost == 1.0
    assert [c.chunk_id for c in boosted] == ["e", "x", "d"]


def cand(chunk: str, doc: int, version: int, score: float) -> Candidate:
    return Candidate(chunk, score, {"document_id": str(doc), "document_version_id": str(version), "project_id": "1"})


def test_collapse_one_per_document_tiebreak_latest_final() -> None:
    cands = [cand("old", 1, 10, 0.5), cand("new", 1, 11, 0.5), cand("other", 2, 20, 0.7), cand("low", 1, 11, 0.1)]
    latest = {1: 11, 2: 20}
    out = collapse(
        cands,
        per_document=True,
        max_chunks_per_document=3,
        is_latest_final=lambda c: latest[c.document_id] == c.version_id,
    )
    assert [c.chunk_id for c in out] == ["other", "new"]
    latest[1] = 10
    out = collapse(
        cands,
        per_document=True,
        max_chunks_per_document=3,
        is_latest_final=lambda c: latest[c.document_id] == c.version_id,
    )
    assert [c.chunk_id for c in out] == ["other", "old"]


def test_collapse_off_caps_chunks_per_document() -> None:
    cands = [cand(f"c{i}", 1, 10, 1 - i / 10) for i in range(5)] + [cand("z", 2, 20, 0.05)]
    out = collapse(cands, per_document=False, max_chunks_per_document=3, is_latest_final=lambda c: True)
    assert [c.chunk_id for c in out] == ["c0", "c1", "c2", "z"]


def test_age_factor_follows_the_formula() -> None:
    today = dt.date(2026, 1, 1)
    assert age_factor("2026-01-01", today, 0.8) == 1.0
    assert age_factor("2025-01-01", today, 0.8) == pytest.approx(0.8 + 0.2 / (1 + 365 / 365.25))
    assert age_factor("2030-01-01", today, 0.8) == 1.0  # a future date counts as new
    assert age_factor(None, today, 0.8) == 0.8  # no date: old
    assert age_factor("1900-01-01", today, 0.5) == pytest.approx(0.5, abs=0.01)
    assert age_factor("2020-01-01", today, 1.0) == 1.0  # floor 1: no decay


def test_decay_reorders_by_age_and_keeps_the_product() -> None:
    old = Candidate("a", 1.0, {"doc_date": "2016-01-01"})
    new = Candidate("b", 0.95, {"doc_date": "2025-12-01"})
    decayed = apply_decay([old, new], dt.date(2026, 1, 1), 0.8)
    assert [c.chunk_id for c in decayed] == ["b", "a"]
    assert all(c.score == pytest.approx(next(o for o in (old, new) if o.chunk_id == c.chunk_id).score * c.decay)
               for c in decayed)  # fmt: skip
