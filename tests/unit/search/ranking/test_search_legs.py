"""Leg bodies, skip rules, _msearch parsing and the compiled scope filter (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ki.errors import PermanentError, QueryTooManyTerms, Rejected, SearchUnavailable, TransientError
from search.access.scope import MATCH_NONE, CompiledScope, strict_filter
from search.ranking.legs import SOURCE_INCLUDES, build_leg_bodies, leg_depth, msearch_lines, parse_msearch


@pytest.mark.parametrize(
    ("window", "depth"), [(1, 50), (8, 50), (10, 50), (11, 55), (80, 400), (500, 2500), (501, 2500)]
)
def test_depth(window: int, depth: int) -> None:
    assert leg_depth(window) == depth


def test_scope_filter_is_terms_on_document_and_project_ids_as_strings() -> None:
    scope = CompiledScope.of([2, 1, 2], [30, 10])
    assert scope.opensearch_filter() == {
        "bool": {"filter": [{"terms": {"document_id": ["10", "30"]}}, {"terms": {"project_id": ["1", "2"]}}]}
    }
    assert CompiledScope.of([], []).opensearch_filter() == MATCH_NONE
    assert strict_filter(CompiledScope.of([], []), [{"terms": {"language": ["de"]}}]) == MATCH_NONE


def test_large_scope_is_split_into_should_clauses_within_max_terms() -> None:
    scope = CompiledScope.of([1], range(1, 11), max_terms_count=4)
    doc_clause = scope.opensearch_filter()["bool"]["filter"][0]
    parts = doc_clause["bool"]["should"]
    assert doc_clause["bool"]["minimum_should_match"] == 1
    assert [len(p["terms"]["document_id"]) for p in parts] == [4, 4, 2]
    assert sum((p["terms"]["document_id"] for p in parts), []) == [str(i) for i in range(1, 11)]


def test_every_leg_carries_the_strict_filter_and_knn_prefilters() -> None:
    strict = strict_filter(CompiledScope.of([1], [5]), [{"terms": {"language": ["de"]}}])
    bodies = build_leg_bodies("2 BvR 1234/19", [0.1, 0.2], strict, window=12)
    assert list(bodies) == ["lexical", "semantic", "identifier"]
    for body in bodies.values():
        assert body["size"] == 60
        assert body["_source"] == {"includes": SOURCE_INCLUDES}
        assert not {"embedding", "allowed_principals", "denied_principals", "text"} & set(SOURCE_INCLUDES)
    assert bodies["lexical"]["query"] == {
        "bool": {"must": [{"match": {"text": {"query": "2 BvR 1234/19"}}}], "filter": [strict]}
    }
    assert bodies["identifier"]["query"]["bool"]["must"] == [
        {"match": {"identifiers_text": {"query": "2 BvR 1234/19"}}}
    ]
    knn = bodies["semantic"]["query"]["knn"]["embedding"]
    assert knn == {"vector": [0.1, 0.2], "k": 60, "filter": strict}
    assert "post_filter" not in bodies["semantic"]


def test_skip_rules() -> None:
    assert list(build_leg_bodies("q", [1.0], MATCH_NONE, 10)) == ["semantic"]
    strict = strict_filter(CompiledScope.of([1], [5]), [])
    assert list(build_leg_bodies("  ", [1.0], strict, 10)) == ["lexical", "semantic"]


def test_msearch_lines_and_parsing() -> None:
    bodies = build_leg_bodies("q", [1.0], strict_filter(CompiledScope.of([1], [5]), []), 10)
    lines = msearch_lines("alias", bodies)
    assert lines[0::2] == [{"index": "alias"}] * 3
    ok = {"hits": {"hits": [{"_id": "5:chunk:0", "_score": 2.0, "_source": {"document_id": "5"}}]}}
    parsed = parse_msearch(bodies, {"responses": [ok, {"hits": {"hits": []}}, ok]})
    assert [h.id for h in parsed["lexical"]] == ["5:chunk:0"] and parsed["semantic"] == []
    with pytest.raises(SearchUnavailable):
        parse_msearch(bodies, {"responses": [ok]})


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (503, "search_phase_execution_exception", SearchUnavailable),
        (429, "circuit_breaking_exception", SearchUnavailable),
        (404, "index_not_found_exception", SearchUnavailable),  # not created yet: the worker's first write does
        (400, "query_shard_exception", Rejected),
        (500, "illegal_state_exception", Rejected),
    ],
)
def test_a_failed_leg_is_transient_or_permanent_by_its_status(status: int, kind: str, error: type) -> None:
    bodies = build_leg_bodies("q", [1.0], strict_filter(CompiledScope.of([1], [5]), []), 10)
    ok = {"hits": {"hits": []}}
    failed = {"error": {"type": kind, "reason": "boom"}, "status": status}
    with pytest.raises(error, match=f"semantic leg failed: {status} {kind}: boom") as info:
        parse_msearch(bodies, {"responses": [ok, failed, ok]})
    assert isinstance(info.value, TransientError if error is SearchUnavailable else PermanentError)


# What OpenSearch 2.19 answers a `match` whose query text analyses to more terms than maxClauseCount: a
# 400 `search_phase_execution_exception`; the cause's type is only in the shard failure.
TOO_MANY_CLAUSES = {
    "error": {
        "root_cause": [{"type": "query_shard_exception", "reason": "failed to create query: maxClauseCount is 1024"}],
        "type": "search_phase_execution_exception",
        "reason": "all shards failed",
        "failed_shards": [
            {
                "shard": 0,
                "reason": {
                    "type": "query_shard_exception",
                    "reason": "failed to create query: maxClauseCount is set to 1024",
                    "caused_by": {"type": "too_many_clauses", "reason": "maxClauseCount is set to 1024"},
                },
            }
        ],
    },
    "status": 400,
}


@pytest.mark.parametrize("cause", ["too_many_clauses", "too_many_nested_clauses"])
def test_a_leg_refused_for_too_many_clauses_is_the_callers_query(cause: str) -> None:
    """Read from the error's types (nested anywhere), not its reason: a 400 naming `query`, not a 500."""
    bodies = build_leg_bodies("q", [1.0], strict_filter(CompiledScope.of([1], [5]), []), 10)
    ok: dict[str, Any] = {"hits": {"hits": []}}
    failed = json.loads(json.dumps(TOO_MANY_CLAUSES).replace("too_many_clauses", cause))
    with pytest.raises(QueryTooManyTerms) as info:
        parse_msearch(bodies, {"responses": [failed, ok, ok]})
    assert info.value.field == "query"
    # The same words in a reason, without the type, are an ordinary refusal.
    worded = {"error": {"type": "query_shard_exception", "reason": f"{cause}: maxClauseCount"}, "status": 400}
    with pytest.raises(Rejected):
        parse_msearch(bodies, {"responses": [worded, ok, ok]})
