"""Rerank: reply parsing and the reorder-never-drop rule (no services)."""

from __future__ import annotations

import json

import pytest

from ki.settings import RerankSettings, RetrievalSettings, SettingsError, load_settings
from search.ranking.fusion import Candidate
from search.ranking.rerank import (
    RERANK_TOP_N,
    Reranker,
    RerankUnavailable,
    apply_rerank,
    parse_scores,
    passages,
    request_body,
)


def cand(i: int) -> Candidate:
    return Candidate(f"c{i}", 1.0 / (i + 1), {"text": f"Text {i}", "document_id": i, "document_version_id": i})


def reply(scores: object) -> dict[str, object]:
    return {"choices": [{"message": {"role": "assistant", "content": json.dumps({"scores": scores})}}]}


def test_scored_prefix_reorders_and_nothing_is_dropped() -> None:
    fused = [cand(i) for i in range(25)]
    scores = {"3": 9.0, "1": 2.5, "20": 9.0}  # positions 1-based; ties keep fused order
    out = apply_rerank(fused, scores)
    assert [c.chunk_id for c in out[:3]] == ["c2", "c19", "c0"]
    assert [c.rerank_score for c in out[:3]] == [9.0, 9.0, 2.5]
    unscored_prefix = [c.chunk_id for c in fused[:RERANK_TOP_N] if c.chunk_id not in {"c2", "c19", "c0"}]
    assert [c.chunk_id for c in out[3:RERANK_TOP_N]] == unscored_prefix
    assert [c.chunk_id for c in out[RERANK_TOP_N:]] == [f"c{i}" for i in range(20, 25)]
    assert sorted(c.chunk_id for c in out) == sorted(c.chunk_id for c in fused)
    assert all(c.rerank_score is None and c.final_score == c.score for c in out[3:])
    assert out[0].final_score == 9.0


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ({"1": 7, "2": 0, "3": 10}, {"1": 7.0, "2": 0.0, "3": 10.0}),
        ([{"id": "2", "score": 4.5}, {"id": 3, "score": 1}], {"2": 4.5, "3": 1.0}),
        ({"1": 11, "2": -1, "3": "7", "4": 5, "x": 3, "5": True}, {"4": 5.0}),  # out of range, wrong type, unknown
    ],
)
def test_parse_scores_keeps_valid_scores_of_known_ids(scores: object, expected: dict[str, float]) -> None:
    assert parse_scores(reply(scores), ["1", "2", "3", "4", "5"]) == expected


@pytest.mark.parametrize(
    "response",
    [
        {},
        {"choices": []},
        {"choices": [{"message": {"content": "not json"}}]},
        {"choices": [{"message": {"content": json.dumps({"ranking": [1, 2]})}}]},
        {"choices": [{"message": {"content": json.dumps({"scores": 5})}}]},
        [1, 2, 3],
    ],
)
def test_a_malformed_reply_is_a_gateway_error(response: object) -> None:
    with pytest.raises(RerankUnavailable):
        parse_scores(response, ["1"])


def test_request_carries_model_query_and_numbered_passages() -> None:
    items = passages([cand(0), cand(1)], ["Titel A", "Titel B"])
    body = request_body("m", "Kaution", items)
    assert body["model"] == "m" and body["messages"][0]["role"] == "system"
    user = json.loads(body["messages"][1]["content"])
    assert user == {
        "query": "Kaution",
        "passages": [
            {"id": "1", "title": "Titel A", "text": "Text 0"},
            {"id": "2", "title": "Titel B", "text": "Text 1"},
        ],
    }


def test_enabled_without_url_refuses_to_start() -> None:
    with pytest.raises(SettingsError, match=r"retrieval\.rerank\.url: rerank_enabled is true but it is empty"):
        load_settings(environ={"KI_RETRIEVAL__RERANK_ENABLED": "true"})
    settings = RetrievalSettings.model_construct(rerank_enabled=True, rerank=RerankSettings())  # bypassing validation
    with pytest.raises(SettingsError, match=r"rerank\.url"):
        Reranker(settings)
