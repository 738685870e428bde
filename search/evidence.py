"""What a measured figure is bound to: the data, the embedder, the analyzer and the ranking settings.

A report (`ki eval`) carries `binding_for(...)` and its `binding_hash`; two figures are comparable
only if their bindings agree on what the comparison does not vary. Hashes are sha256 over canonical
JSON (sorted keys, no whitespace), cut to a short hex prefix.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ki.settings import Settings

#: The retrieval settings that decide the ranking of an index built with a given analyzer and embedder.
RANKING_FIELDS: tuple[str, ...] = (
    "fusion_rrf_k",
    "weight_lexical",
    "weight_semantic",
    "weight_identifier",
    "version_status_boost",
    "chunk_chars",
    "chunk_overlap_chars",
    "chunk_contextualize",
    "profile_embeddings",
    "clause_embeddings",
    "collapse_per_document",
    "max_chunks_per_document",
)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def short_hash(value: Any, length: int = 12) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:length]


def analyzer_definition(settings: Settings) -> dict[str, Any]:
    """The analyzer of the `text` field: `retrieval.text_analyzer`, plus `retrieval.text_analysis`
    (custom analysis chain) where the settings have it."""
    retrieval = settings.retrieval
    definition: dict[str, Any] = {"text_analyzer": retrieval.text_analyzer}
    analysis = getattr(retrieval, "text_analysis", None)
    if analysis is not None:
        definition["text_analysis"] = analysis.model_dump(mode="json") if hasattr(analysis, "model_dump") else analysis
    return definition


def ranking_settings(settings: Settings) -> dict[str, Any]:
    dumped = settings.retrieval.model_dump(mode="json")
    return {name: dumped[name] for name in RANKING_FIELDS}


def binding_for(settings: Settings, embedding_signature: str, dataset_sha256: str) -> dict[str, Any]:
    return {
        "dataset_sha256": dataset_sha256,
        "embedding_signature": embedding_signature,
        "analyzer_hash": short_hash(analyzer_definition(settings)),
        "ranking_hash": short_hash(ranking_settings(settings)),
    }


def binding_hash(binding: dict[str, Any]) -> str:
    return short_hash(binding, 16)
