"""Retrieval statistics of one ranked answer (search.telemetry.stats.query_stats)."""

from __future__ import annotations

from search.ranking.fusion import Candidate
from search.ranking.legs import LegHit
from search.telemetry.stats import query_stats


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


def test_the_audit_names_the_documents_of_every_answer_shape() -> None:
    from search.telemetry.audit import named_documents, record_of

    assert named_documents({"hits": [{"document_id": 3}, {"document_id": 1}, {"document_id": 3}]}) == (1, 3)
    assert named_documents({"hits": [{"decision_id": 9, "document_id": None}]}) == ()
    assert named_documents({"document_id": 5, "versions": []}) == (5,)
    assert named_documents({"document_id": 5, "related": [{"document": {"document_id": 8}}]}) == (5, 8)
    assert named_documents({"nodes": [{"document_id": 2}], "not_found": [77]}) == (2,)  # never what was asked
    assert named_documents({"principals": ["user:x"], "admin": False}) == ()
    assert named_documents(None) == ()
    refused = record_of(["user:x"], "/v1/documents/{document_id}", 404, {"document_id": 5, "versions": []})
    assert refused.document_ids == () and refused.version_ids == ()
    # Reading names the document and the version whose text it showed; nothing else names a version.
    read = record_of(["user:x"], "mcp:read_document", 200, {"document_id": 5, "version_id": 12, "text": "…"})
    assert (read.document_ids, read.version_ids) == ((5,), (12,))
    assert record_of(["user:x"], "mcp:get_document", 200, {"document_id": 5, "versions": []}).version_ids == ()
