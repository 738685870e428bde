"""Request validation and the OpenSearch filter clauses it produces."""

from __future__ import annotations

import datetime as dt

import pytest

from ki.errors import RequestInvalid
from ki.settings import ApiSettings, LimitsSettings
from search.request import (
    WindowTooDeep,
    metadata_clauses,
    parse_filter_request,
    parse_search_request,
)

API = ApiSettings(limits=LimitsSettings(max_query_chars=50, max_limit=20, max_filter_values=3))


def field_of(data: object) -> str:
    with pytest.raises(RequestInvalid) as info:
        parse_search_request(data, API)
    return info.value.field


def test_defaults_and_single_values_become_lists() -> None:
    req = parse_search_request({"query": "Kaution", "filters": {"project_id": 4, "chunk_kind": "clause"}}, API)
    assert (req.limit, req.offset, req.window, req.explain) == (10, 0, 10, False)
    assert req.filters.project_id == [4] and req.filters.chunk_kind == ["clause"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x" * 51}, "query"),
        ({"query": "a", "limit": 21}, "limit"),
        ({"query": "a", "limit": 0}, "limit"),
        ({"query": "a", "offset": -1}, "offset"),
        ({"query": "a", "unknown": 1}, "unknown"),
        ({"query": "a", "principals": ["user:x"]}, "principals"),
        ({"query": "a", "filters": {"doc_type": ["abc"]}}, "filters.doc_type"),
        ({"query": "a", "filters": {"project_id": [1, 2, 3, 4]}}, "filters.project_id"),
        ({"query": "a", "filters": {"version_status": ["gone"]}}, "filters.version_status"),
        ({"query": "a", "filters": {"language": []}}, "filters.language"),
        ({"query": "a", "filters": {"date_from": "2024-13-01"}}, "filters.date_from"),
        ({"query": "a", "filters": {"date_from": "2024-02-01", "date_to": "2024-01-01"}}, "filters"),
        ([1, 2], "body"),
        # the evidence-shaping request fields
        ({"query": "a", "expand": "vielleicht"}, "expand"),
        ({"query": "a", "as_of": "gestern"}, "as_of"),
        ({"query": "a", "evidence_budget_chars": -5}, "evidence_budget_chars"),
    ],
)
def test_bad_input_names_the_field(data: object, field: str) -> None:
    assert field_of(data) == field


def test_window_over_500_is_its_own_error() -> None:
    parse_search_request({"query": "a", "offset": 480, "limit": 20}, API)
    with pytest.raises(WindowTooDeep):
        parse_search_request({"query": "a", "offset": 481, "limit": 20}, API)
    with pytest.raises(WindowTooDeep):
        parse_filter_request({"offset": 10_000}, API)


def test_metadata_clauses_cover_every_filter() -> None:
    req = parse_filter_request(
        {
            "filters": {
                "project_id": [1],
                "matter_id": 2,
                "doc_type": [7],
                "version_status": ["final", "executed"],
                "language": "de",
                "date_from": "2024-01-01",
                "date_to": "2024-12-31",
                "clause_type": 9,
                "chunk_kind": ["clause"],
            }
        },
        API,
    )
    assert req.filters.date_to == dt.date(2024, 12, 31)
    assert metadata_clauses(req.filters) == [
        {"terms": {"project_id": ["1"]}},
        {"terms": {"matter_id": ["2"]}},
        {"terms": {"doc_type_ancestors": ["7"]}},
        {"terms": {"version_status": ["final", "executed"]}},
        {"terms": {"language": ["de"]}},
        {"terms": {"clause_type": ["9"]}},
        {"terms": {"chunk_kind": ["clause"]}},
        {"range": {"doc_date": {"gte": "2024-01-01", "lte": "2024-12-31"}}},
    ]
    assert metadata_clauses(parse_filter_request({}, API).filters) == []


def test_issue_15s_request_fields_are_in_the_openapi_document() -> None:
    from search.web.openapi import openapi_document

    properties = openapi_document()["components"]["schemas"]["SearchRequest"]["properties"]
    assert {"expand", "as_of", "evidence_budget_chars", "mode", "explain"} <= properties.keys()
    assert properties["expand"]["type"] == "boolean"
