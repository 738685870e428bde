"""Decision search: request validation (no services; the anchor rule is SQL, tested in tests/integration)."""

from __future__ import annotations

import pytest

from ki.errors import RequestInvalid
from ki.settings import ApiSettings, LimitsSettings
from search.request import WindowTooDeep, parse_decision_request

API = ApiSettings(limits=LimitsSettings(max_query_chars=50, max_limit=20, max_filter_values=3))


def test_decision_request_defaults_and_filters() -> None:
    req = parse_decision_request({"query": "Kaution", "filters": {"project_id": 4}}, API)
    assert (req.limit, req.offset, req.filters.project_id, req.filters.document_id) == (10, 0, [4], None)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "query"),
        ({"query": " "}, "query"),
        ({"query": "x" * 51}, "query"),
        ({"query": "a\x00"}, "query"),
        ({"query": "\ud800"}, "query"),
        ({"query": "a", "explain": True}, "explain"),
        ({"query": "a", "filters": {"document_id": [0]}}, "filters.document_id"),
        ({"query": "a", "filters": {"project_id": [2**63]}}, "filters.project_id"),
        ({"query": "a", "filters": {"project_id": [1, 2, 3, 4]}}, "filters.project_id"),
        ({"query": "a", "filters": {"doc_type": [1]}}, "filters.doc_type"),
    ],
)
def test_bad_decision_requests_name_the_field(data: object, field: str) -> None:
    with pytest.raises(RequestInvalid) as info:
        parse_decision_request(data, API)
    assert info.value.field == field


def test_decision_window_is_capped() -> None:
    with pytest.raises(WindowTooDeep):
        parse_decision_request({"query": "a", "offset": 490, "limit": 20}, API)
