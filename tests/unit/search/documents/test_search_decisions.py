"""Decision search: request validation and the anchor rule (no services)."""

from __future__ import annotations

import pytest

from ki.errors import RequestInvalid
from ki.settings import ApiSettings, LimitsSettings
from search.documents.decisions import Anchors
from search.request import WindowTooDeep, parse_decision_request

API = ApiSettings(limits=LimitsSettings(max_query_chars=50, max_limit=20, max_filter_values=3))

ANCHORS = Anchors(document_projects={10: {1}}, object_projects={100: {1}, 200: {2}})


@pytest.mark.parametrize(
    ("project", "document", "evidence", "admitted"),
    [
        (1, 10, [], True),
        (1, None, [100], True),
        (1, 10, [100], True),
        (1, None, [], False),  # rests on nothing
        (1, 11, [], False),  # invisible document
        (1, 10, [100, 300], False),  # one unconfirmed evidence object
        (2, 10, [], False),  # no anchor in the record's own project
        (2, 10, [200], True),
        (3, None, [100, 200], False),
    ],
)
def test_anchor_rule(project: int, document: int | None, evidence: list[int], admitted: bool) -> None:
    assert ANCHORS.admits(project, document, evidence) is admitted


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
