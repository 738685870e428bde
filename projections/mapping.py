"""The chunk index's settings and mapping, its physical name, and checks against a live index.

`retrieval.index_name` is the alias that readers and writers use; the physical index behind it
is named after the index signature — the embedding signature (model + dimension) plus the text
analyzer (and, for an analyzer defined in `retrieval.text_analysis`, a hash of its definition) — so
vectors from two models, or text analysed two ways, never share one index, and a rebuild can fill a
fresh index before the alias swaps.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ki.analysis import analysis_digest, comparable, used_analysis
from ki.settings import Settings

KEYWORD_FIELDS: tuple[str, ...] = (
    "project_id",
    "document_id",
    "document_version_id",
    "matter_id",
    "doc_type",
    "doc_type_ancestors",
    "version_status",
    "language",
    "chunk_kind",
    "clause_type",
    "identifiers",
    "allowed_principals",
    "denied_principals",
)

# OpenSearch rejects names longer than 255 bytes.
_MAX_INDEX_NAME_BYTES = 255
_REBUILD_HINT = "run `ki rebuild` to build a fresh index for the current embedding model and swap the alias"


def mapping_properties(settings: Settings) -> dict[str, Any]:
    retrieval = settings.retrieval
    properties: dict[str, Any] = {
        "text": {"type": "text", "analyzer": retrieval.text_analyzer},
        "embedding": {
            "type": "knn_vector",
            "dimension": retrieval.embedding_dimensions,
            "method": {
                "name": "hnsw",
                "engine": retrieval.vector_engine,
                "space_type": retrieval.vector_space_type,
                "parameters": {"m": retrieval.hnsw_m, "ef_construction": retrieval.hnsw_ef_construction},
            },
        },
        **{name: {"type": "keyword"} for name in KEYWORD_FIELDS},
        "doc_date": {"type": "date"},
        # The identifier leg matches a pasted query against this field. `standard` splits on
        # punctuation and lowercases, so "2 BvR 1234/19" indexes as 2, bvr, 1234, 19 and still
        # matches a query that wraps it in brackets or ends it with a comma; a whitespace
        # tokenizer would keep "1234/19," as one token and miss. Rare tokens (1234, bvr) carry the
        # BM25 weight, and the exact `identifiers` keyword field stays available for filtering.
        "identifiers_text": {"type": "text", "analyzer": "standard"},
        # long, not integer: the access version may come from a bigint counter in SQL.
        "access_version": {"type": "long"},
        # sha256 of the exact string embedded: rows with equal keys carry equal vectors (one embedding
        # signature per index), so a vector is looked up by it instead of embedded again.
        "embedding_key": {"type": "keyword"},
        # On a row written before its vector (text first): since when it waits (`ki sync status`, /metrics).
        "vector_pending": {"type": "date", "format": "epoch_millis"},
        # Payload only (kind, ordinal, locus, content_hash, ...): kept in _source, never indexed.
        "meta": {"type": "object", "enabled": False},
        "indexed_at": {"type": "date"},
    }
    return properties


def index_body(settings: Settings, embedding_signature: str | None = None) -> dict[str, Any]:
    """Body for creating a physical chunk index (bound to `embedding_signature`, recorded in `_meta`,
    which tells a rebuild whose vectors it may take over).

    The embedding stays in `_source` on purpose: partial updates (access-only, keep-vector
    rewrites) re-index from `_source`, and a vector excluded there would be lost. Searches exclude
    it per request instead.
    """
    opensearch = settings.opensearch
    index: dict[str, Any] = {
        "number_of_shards": opensearch.number_of_shards,
        "number_of_replicas": opensearch.number_of_replicas,
        "refresh_interval": opensearch.refresh_interval,
        "knn": True,
        "max_terms_count": opensearch.max_terms_count,
    }
    analysis = text_analysis(settings)
    if analysis:
        index["analysis"] = analysis
    mappings: dict[str, Any] = {"dynamic": False, "properties": mapping_properties(settings)}
    if embedding_signature is not None:
        mappings["_meta"] = {"embedding_signature": embedding_signature}
    return {"settings": {"index": index}, "mappings": mappings}


def embedding_signature_of(live_mapping: Mapping[str, Any]) -> str | None:
    """The embedding signature a physical index records in its mapping's `_meta` (None: not recorded)."""
    signature = (live_mapping.get("_meta") or {}).get("embedding_signature")
    return signature if isinstance(signature, str) and signature else None


def text_analysis(settings: Settings) -> dict[str, Any]:
    """The analysis definitions the `text` analyzer uses, for the index settings ({} for a built-in)."""
    retrieval = settings.retrieval
    return used_analysis(retrieval.text_analyzer, retrieval.text_analysis.as_map())


def analyzer_signature(settings: Settings) -> str:
    """The analyzer part of the index signature: `german`, or `name@{hash8}` for a defined analyzer.

    The hash covers the name plus every definition the analyzer uses (canonical JSON, key order and
    `3` vs `"3"` do not matter), so a changed filter yields another index name, never a reused index."""
    analyzer = settings.retrieval.text_analyzer
    used = text_analysis(settings)
    return f"{analyzer}@{analysis_digest(analyzer, used)}" if used else analyzer


def _slug(value: str) -> str:
    out: list[str] = []
    for ch in value.lower():
        ok = ch.isascii() and (ch.isalnum() or ch in "._")
        if ok:
            out.append(ch)
        elif out and out[-1] != "-":
            out.append("-")
    return "".join(out).strip("-._")


def index_signature(settings: Settings, embedding_signature: str) -> str:
    """What a physical index is bound to: the embedding signature and the analyzer of `text`.

    BM25 statistics of text analysed by two analyzers are not comparable (stems vs. words), so a
    changed `retrieval.text_analyzer` — or a changed definition of it — needs a fresh index exactly
    like a changed embedding model. A built-in analyzer keeps its bare name (`…+german`), so indices
    built before analyzers could be defined keep their names.
    """
    if not embedding_signature.strip():
        raise ValueError("embedding_signature must not be empty")
    return f"{embedding_signature}+{analyzer_signature(settings)}"


def physical_index_name(settings: Settings, embedding_signature: str, generation: str | int | None = None) -> str:
    """`{alias}--{index signature slug}-{hash8}[--{generation}]`, lowercase and legal for OpenSearch.

    The 8-hex hash of the raw index signature keeps the name injective: "MiniLM/384" and
    "minilm-384" slug alike but must not share an index. `generation` (e.g. a rebuild counter or
    timestamp the caller chooses) lets a rebuild with the same model fill a fresh index beside the
    live one.
    """
    signature = index_signature(settings, embedding_signature)
    alias = _slug(settings.retrieval.index_name)
    if not alias:
        raise ValueError(f"retrieval.index_name {settings.retrieval.index_name!r} has no usable characters")
    digest = hashlib.sha256(signature.encode("utf-8")).hexdigest()[:8]
    suffix = f"-{digest}" + (f"--{_slug(str(generation))}" if generation is not None else "")
    room = _MAX_INDEX_NAME_BYTES - len(alias) - len("--") - len(suffix)
    slug = _slug(signature)[: max(room, 0)].strip("-._") or "sig"
    return f"{alias}--{slug}{suffix}"[:_MAX_INDEX_NAME_BYTES]


def _properties_of(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """Accept a bare mapping, an index body, or a GET `_mapping` response for one index."""
    if "properties" in mapping:
        return mapping["properties"]
    if "mappings" in mapping:
        return _properties_of(mapping["mappings"])
    if len(mapping) == 1:
        (only,) = mapping.values()
        if isinstance(only, Mapping):
            return _properties_of(only)
    return {}


def _missing(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    missing: dict[str, Any] = {}
    for name, definition in wanted.items():
        if name not in live:
            missing[name] = definition
        elif "properties" in definition and "properties" in live[name]:
            nested = _missing(live[name]["properties"], definition["properties"])
            if nested:
                missing[name] = {"properties": nested}
    return missing


def missing_fields(live_mapping: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Properties present in `wanted` but absent from the live index, ready for a put-mapping call.

    Additive only: a field that exists with another type is not touched here (see
    `conflicting_fields`). Documents indexed before a field existed need a re-sync to be
    searchable on it.
    """
    return _missing(_properties_of(live_mapping), _properties_of(wanted))


def conflicting_fields(live_mapping: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """Top-level fields whose live type differs from the wanted one (cannot be fixed in place)."""
    live = _properties_of(live_mapping)
    return sorted(
        name
        for name, definition in _properties_of(wanted).items()
        if name in live and live[name].get("type", "object") != definition.get("type", "object")
    )


def dimension_mismatch(live_mapping: Mapping[str, Any], wanted_dim: int) -> str | None:
    """A message telling the operator to rebuild when the live vector dimension differs, else None."""
    embedding = _properties_of(live_mapping).get("embedding")
    if not embedding or "dimension" not in embedding:
        return None  # no vector field yet: missing_fields adds it
    live_dim = int(embedding["dimension"])
    if live_dim == wanted_dim:
        return None
    return (
        f"live index has embedding dimension {live_dim} but retrieval.embedding_dimensions is "
        f"{wanted_dim}; vectors of two embedding models cannot share one ANN index: {_REBUILD_HINT}"
    )


def live_analysis(live_settings: Mapping[str, Any]) -> Mapping[str, Any]:
    """`index.analysis` of a GET `_settings` response for one index, an index body, or its `settings`."""
    node: Any = live_settings
    if len(node) == 1 and "settings" not in node and "index" not in node:
        (node,) = node.values()
    node = node.get("settings", node)
    node = node.get("index", node)
    analysis = node.get("analysis", {}) if isinstance(node, Mapping) else {}
    return analysis if isinstance(analysis, Mapping) else {}


def _live_used(analyzer: str, analysis: Mapping[str, Any]) -> dict[str, Any]:
    """What the live index defines for `analyzer`, in the shape of `used_analysis`."""
    definition = analysis.get("analyzer", {}).get(analyzer)
    if definition is None:
        return {}
    used: dict[str, Any] = {"analyzer": {analyzer: definition}}
    for kind in ("char_filter", "tokenizer", "filter"):
        refs = definition.get(kind) or []
        refs = [refs] if isinstance(refs, str) else refs
        defined = analysis.get(kind, {})
        picked = {ref: defined[ref] for ref in refs if ref in defined}
        if picked:
            used[kind] = picked
    return used


def analyzer_mismatch(
    live_mapping: Mapping[str, Any],
    wanted_analyzer: str,
    wanted_analysis: Mapping[str, Any] | None = None,
    live_settings: Mapping[str, Any] | None = None,
) -> str | None:
    """A message telling the operator to rebuild when the live `text` analyzer differs, else None.

    Writing with one analyzer into an index built with another would mix two vocabularies in one
    BM25 field; the mapping cannot be changed in place, so the only fix is a rebuild. With
    `live_settings` (GET `_settings` of the index) the analyzer's *definition* is compared too:
    `wanted_analysis` is what it should use (`text_analysis(settings)`, {} for a built-in).
    """
    text_field = _properties_of(live_mapping).get("text")
    if not text_field:
        return None  # no text field yet: missing_fields adds it
    live = text_field.get("analyzer", "standard")  # OpenSearch's default when none is named
    hint = (
        "text analysed two ways cannot share one BM25 field: run `ki rebuild` to build a fresh index "
        "with the current analyzer and swap the alias"
    )
    if live != wanted_analyzer:
        return f"live index analyses `text` with {live!r} but retrieval.text_analyzer is {wanted_analyzer!r}; {hint}"
    if live_settings is None:
        return None
    have = _live_used(live, live_analysis(live_settings))
    if comparable(have) == comparable(wanted_analysis or {}):
        return None
    return (
        f"live index defines the analyzer {live!r} of `text` otherwise than retrieval.text_analysis "
        f"(live {_short(have)}, wanted {_short(wanted_analysis or {})}); {hint}"
    )


def _short(used: Mapping[str, Any]) -> str:
    if not used:
        return "built-in"
    text = json.dumps(comparable(used), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."
