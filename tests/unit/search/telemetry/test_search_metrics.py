"""Per-leg timing extraction, zero-weight legs, and the metrics exposition (no services)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from search.ranking.legs import active_legs, build_leg_bodies, leg_took
from search.telemetry.metrics import SearchMetrics

STRICT = {"bool": {"filter": [{"terms": {"document_id": ["1"]}}]}}


def test_leg_took_follows_the_send_order() -> None:
    bodies = build_leg_bodies("Kaution", [0.1, 0.2], STRICT, 10)
    assert list(bodies) == ["lexical", "semantic", "identifier"]
    response = {"responses": [{"took": 3}, {"took": 11}, {"error": {"reason": "x"}}]}
    assert leg_took(bodies, response) == {"lexical": 3.0, "semantic": 11.0}


def test_a_leg_weighted_zero_is_not_built() -> None:
    legs = active_legs({"lexical": 1.0, "semantic": 0.0, "identifier": 1.5})
    assert legs == frozenset({"lexical", "identifier"})
    assert list(build_leg_bodies("Kaution", [0.1], STRICT, 10, legs)) == ["lexical", "identifier"]


def test_exposition_has_every_family_and_leg_latency_in_seconds() -> None:
    metrics = SearchMetrics()
    metrics.observe_legs({"lexical": 250.0})
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    for name in [
        "ki_api_requests",
        "ki_api_request_duration_seconds",
        "ki_search_leg_duration_seconds",
        "ki_search_scope_compile_duration_seconds",
        "ki_search_scope_documents",
        "ki_search_embed_cache",
    ]:
        assert name in families, name
    sums = {
        s.labels.get("leg"): s.value
        for s in families["ki_search_leg_duration_seconds"].samples
        if s.name.endswith("_sum")
    }
    assert sums == {"lexical": 0.25}
    assert SearchMetrics().exposition() != metrics.exposition()  # registries are per instance
