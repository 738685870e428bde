import re

import pytest

from ki.settings import Settings
from projections.mapping import (
    analyzer_mismatch,
    conflicting_fields,
    dimension_mismatch,
    embedding_signature_of,
    index_body,
    index_signature,
    mapping_properties,
    missing_fields,
    physical_index_name,
)
from projections.rows import AccessProjection, DocumentState, VersionState, build_rows
from tests.spec_fields import SPEC_KEYWORD_FIELDS

LEGAL_INDEX_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def make_settings(**retrieval):
    return Settings.model_validate({"retrieval": retrieval})


def test_index_settings_come_from_opensearch_settings():
    settings = Settings.model_validate(
        {"opensearch": {"number_of_shards": 3, "number_of_replicas": 1, "refresh_interval": "5s"}}
    )
    index = index_body(settings)["settings"]["index"]
    assert index == {
        "number_of_shards": 3,
        "number_of_replicas": 1,
        "refresh_interval": "5s",
        "knn": True,
        "max_terms_count": 65_536,
    }


def test_an_index_records_the_embedder_whose_vectors_it_holds_and_keys_them():
    settings = make_settings()
    bound = index_body(settings, "multilingual-e5-small-384")["mappings"]
    assert embedding_signature_of(bound) == "multilingual-e5-small-384"
    assert embedding_signature_of(index_body(settings)["mappings"]) is None  # unknown: never reused
    assert bound["properties"]["embedding_key"] == {"type": "keyword"}  # terms and collapse need it indexed


def test_mapping_is_strict_and_types_every_field():
    mappings = index_body(make_settings())["mappings"]
    assert mappings["dynamic"] is False
    props = mappings["properties"]
    assert props["text"] == {"type": "text", "analyzer": "german"}
    assert props["identifiers_text"]["type"] == "text"
    assert props["doc_date"] == {"type": "date"}
    assert props["access_version"]["type"] in ("integer", "long")
    assert props["meta"] == {"type": "object", "enabled": False}
    for name in SPEC_KEYWORD_FIELDS:
        assert props[name] == {"type": "keyword"}, name


def test_every_row_field_is_mapped():
    rows = build_rows(
        DocumentState(id=1, project_id=1, title="T", latest_final_version_id=2),
        VersionState(id=2, document_id=1, version_no=1, status="final", language="de", doc_date=None, text="x"),
        doc_type_ancestors=(),
        doc_type_label=None,
        matter_title=None,
        access=AccessProjection((), (), 0),
        settings=make_settings().retrieval,
    )
    props = mapping_properties(make_settings())
    for row in rows:
        assert set(row.source) <= set(props)
    assert "embedding" in props


def test_knn_vector_uses_the_hnsw_settings():
    settings = make_settings(
        embedding_dimensions=384,
        vector_engine="faiss",
        vector_space_type="l2",
        hnsw_m=24,
        hnsw_ef_construction=256,
    )
    vector = index_body(settings)["mappings"]["properties"]["embedding"]
    assert vector == {
        "type": "knn_vector",
        "dimension": 384,
        "method": {
            "name": "hnsw",
            "engine": "faiss",
            "space_type": "l2",
            "parameters": {"m": 24, "ef_construction": 256},
        },
    }


def test_text_analyzer_is_configurable():
    props = index_body(make_settings(text_analyzer="standard"))["mappings"]["properties"]
    assert props["text"]["analyzer"] == "standard"


def test_physical_index_name_is_legal_and_bound_to_the_signature():
    settings = make_settings()
    name = physical_index_name(settings, "all-MiniLM-L6-v2@384")
    assert name.startswith("knowledge-index-chunks-v1--all-minilm-l6-v2-384-")
    assert LEGAL_INDEX_NAME.match(name)
    assert name == physical_index_name(settings, "all-MiniLM-L6-v2@384")
    assert name != physical_index_name(settings, "all-MiniLM-L6-v2@768")
    # Signatures that slug alike still get different indices.
    assert physical_index_name(settings, "A/B") != physical_index_name(settings, "a-b")


def test_text_analyzer_defaults_to_german_and_is_part_of_the_index_signature():
    german, english = make_settings(), make_settings(text_analyzer="english")
    assert german.retrieval.text_analyzer == "german"
    assert index_signature(german, "m@384") != index_signature(english, "m@384")
    # A changed analyzer gets another physical index, exactly as a changed embedding model does.
    assert physical_index_name(german, "m@384") != physical_index_name(english, "m@384")
    assert physical_index_name(english, "m@384") == physical_index_name(make_settings(text_analyzer="english"), "m@384")
    assert "english" in physical_index_name(english, "m@384")
    assert physical_index_name(german, "m@384", generation=2) != physical_index_name(english, "m@384", generation=2)
    with pytest.raises(ValueError):
        index_signature(german, " ")


def test_analyzer_mismatch_tells_to_rebuild():
    live = {"idx": {"mappings": {"properties": {"text": {"type": "text", "analyzer": "german"}}}}}
    assert analyzer_mismatch(live, "german") is None
    message = analyzer_mismatch(live, "english")
    assert message is not None and "'german'" in message and "'english'" in message and "ki rebuild" in message
    # No analyzer named in the live mapping means OpenSearch's `standard`.
    assert analyzer_mismatch({"properties": {"text": {"type": "text"}}}, "standard") is None
    assert analyzer_mismatch({"properties": {"text": {"type": "text"}}}, "german") is not None
    assert analyzer_mismatch({"properties": {}}, "english") is None


def test_physical_index_name_with_generation_and_hostile_signature():
    settings = make_settings()
    assert physical_index_name(settings, "m@1", generation=3).endswith("--3")
    odd = physical_index_name(settings, 'Ünïcode* "model"/\\?#<>|, x' * 40)
    assert LEGAL_INDEX_NAME.match(odd) and len(odd.encode()) <= 255
    with pytest.raises(ValueError):
        physical_index_name(settings, "  ")


def test_missing_fields_reports_only_absent_properties():
    wanted = index_body(make_settings())
    live = {"ki-physical": {"mappings": {"dynamic": "false", "properties": dict(wanted["mappings"]["properties"])}}}
    assert missing_fields(live, wanted) == {}
    del live["ki-physical"]["mappings"]["properties"]["clause_type"]
    del live["ki-physical"]["mappings"]["properties"]["indexed_at"]
    assert missing_fields(live, wanted) == {
        "clause_type": {"type": "keyword"},
        "indexed_at": {"type": "date"},
    }


def test_missing_fields_recurses_into_objects_and_accepts_bare_mappings():
    live = {"properties": {"obj": {"properties": {"a": {"type": "keyword"}}}}}
    wanted = {"properties": {"obj": {"properties": {"a": {"type": "keyword"}, "b": {"type": "long"}}}}}
    assert missing_fields(live, wanted) == {"obj": {"properties": {"b": {"type": "long"}}}}
    assert missing_fields({}, wanted) == wanted["properties"]


def test_conflicting_fields():
    live = {"properties": {"access_version": {"type": "keyword"}, "text": {"type": "text"}}}
    assert conflicting_fields(live, index_body(make_settings())) == ["access_version"]


def test_dimension_mismatch_tells_to_rebuild():
    live = {"idx": {"mappings": {"properties": {"embedding": {"type": "knn_vector", "dimension": 384}}}}}
    assert dimension_mismatch(live, 384) is None
    message = dimension_mismatch(live, 1536)
    assert message is not None and "384" in message and "1536" in message and "ki rebuild" in message


def test_dimension_mismatch_ignores_an_index_without_vectors():
    assert dimension_mismatch({"properties": {}}, 384) is None
