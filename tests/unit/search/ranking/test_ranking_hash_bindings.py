"""Every ranking setting is bound into the ranking hash (search.ranking.mode_gate.ranking_hash): an evaluation
report measured under other values must stop matching. A setting the legs, fusion or the steps after them read
is either in the hash or in `NOT_RANKING` below with the reason; a new setting in neither fails here."""

from __future__ import annotations

from typing import Any

import pytest

from ki.settings import AnswerCoverageSettings, GraphRagSettings, RetrievalSettings
from search.ranking.legs import REGISTRY
from search.ranking.mode_gate import RANKING_FIELDS, ranking_hash

# Retrieval settings that the ranking hash leaves out on purpose, each with why.
NOT_RANKING: dict[str, str] = {
    "index_name": "which index is read, not how its rows are ranked",
    "embedding_dimensions": "bound through the embedding signature (model + dimension), beside the ranking hash",
    "vector_engine": "the index's vector layout, fixed when the index is built",
    "vector_space_type": "the index's vector layout, fixed when the index is built",
    "hnsw_m": "the index's vector layout, fixed when the index is built",
    "hnsw_ef_construction": "the index's vector layout, fixed when the index is built",
    # kNN candidates per segment at query time: recall of the approximate search, left out of the hash when it
    # was added (reports measured before it still hold); the semantic leg's ranking is unchanged when exact.
    "hnsw_ef_search": "approximate-search recall only, not bound when added",
    "rerank_enabled": "the rerank runs after the ranking the reports measure",
    "rerank_model": "the rerank runs after the ranking the reports measure",
    "rerank": "the rerank runs after the ranking the reports measure",
    "graph_rag_enabled": "enters as `graph_rag` when on (off changes nothing)",
    "authoritative_doc_type": "a placement after ranking (one hit at the end of the first page)",
    "decay_enabled": "enters as `decay_floor` when on (off changes nothing)",
    "synonyms_enabled": "enters as `synonyms` when on (off changes nothing)",
    "query_words_enabled": "the query words are read into the plan, not used for ranking yet",
    "neighbours_max_chunks_per_document": "context added to hits, not their order",
    "semantic_floor_enabled": "enters as `semantic_floor` when on (off changes nothing)",
    "answer_coverage_gate_enabled": "enters as `answer_coverage_gate` when on (off changes nothing)",
    "evidence_budget_chars": "how much of the answer's text is handed out, not its order",
    "name_lookup_enabled": "the named document first, a placement after ranking",
    "name_lookup": "the named document first, a placement after ranking",
    "text_analyzer": "bound through the analyzer hash, beside the ranking hash",
    "text_analysis": "bound through the analyzer hash, beside the ranking hash",
    "default_mode": "which mode runs by default: what the reports decide, not what they measured",
    "mode_gate": "how the reports are read, not what they measured",
}
# Settings that count only while their feature is on (see `ranking_hash`): compared with the feature on.
ENABLED_BY = {
    "decay_min_weight": "decay_enabled",
    "semantic_floor": "semantic_floor_enabled",
    "semantic_floor_gates_answer": "semantic_floor_enabled",
    "graph_rag": "graph_rag_enabled",
    "answer_coverage_gate": "answer_coverage_gate_enabled",
    "synonyms": "synonyms_enabled",
}
# Another value for the settings that are neither bool nor number.
OTHER_VALUE: dict[str, Any] = {
    "fusion_method": "minmax",
    "version_status_boost": {"final": 1.5},
    "semantic_floor": {"model-a": 0.5},
    "graph_rag": GraphRagSettings(seeds=6),
    "answer_coverage_gate": AnswerCoverageSettings(min_coverage=0.25),
    "synonyms": [["Miete", "Pacht"]],
}
RANKED = [name for name in RetrievalSettings.model_fields if name not in NOT_RANKING]


def other_value(name: str, value: Any) -> Any:
    if name in OTHER_VALUE:
        return OTHER_VALUE[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    raise AssertionError(f"retrieval.{name}: give it another value in OTHER_VALUE, or list it in NOT_RANKING")


def test_the_allow_list_names_only_settings_that_exist() -> None:
    assert set(NOT_RANKING) <= set(RetrievalSettings.model_fields)
    assert set(ENABLED_BY) <= set(RANKED) and set(ENABLED_BY.values()) <= set(NOT_RANKING)


@pytest.mark.parametrize("name", RANKED)
def test_a_ranking_setting_changes_the_ranking_hash(name: str) -> None:
    base = RetrievalSettings()
    if name in ENABLED_BY:
        base = base.model_copy(update={ENABLED_BY[name]: True})
    changed = base.model_copy(update={name: other_value(name, getattr(base, name))})
    assert ranking_hash(changed) != ranking_hash(base), f"retrieval.{name} is not bound into the ranking hash"


def test_every_legs_weight_is_a_ranking_setting() -> None:
    """A leg's weight is bound like every ranking setting (the test above checks it changes the hash): a new leg's
    weight enters the hash only when set (as the steps added later do), so that reports measured before it hold."""
    assert {leg.weight_key for leg in REGISTRY} <= set(RANKED)
    assert {"weight_lexical", "weight_semantic", "weight_identifier"} <= set(RANKING_FIELDS)
