"""The OpenAPI 3 document served at `/openapi.json`; request schemas come from the pydantic models, so the
document and the validation cannot drift apart."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from search.request import (
    MAX_RANKED_WINDOW,
    DecisionSearchRequest,
    FilterRequest,
    LookupRequest,
    ReadRequest,
    RelatedRequest,
    SearchRequest,
    TraverseRequest,
)

_REQUESTS: dict[str, type[BaseModel]] = {
    "SearchRequest": SearchRequest,
    "FilterRequest": FilterRequest,
    "DecisionSearchRequest": DecisionSearchRequest,
    "TraverseRequest": TraverseRequest,
    "LookupRequest": LookupRequest,
}

_DOCUMENT_CITATION = {
    "type": "object",
    "description": "the version a document is cited by (its latest final one if visible, else the newest visible "
    "one) and the source objects the caller may cite it at",
    "properties": {
        "project_id": {"type": "integer"},
        "document_id": {"type": "integer"},
        "version_id": {"type": "integer"},
        "source_object_ids": {"type": "array", "items": {"type": "integer"}},
    },
}

_SUMMARY_PROPERTIES: dict[str, Any] = {
    "document_id": {"type": "integer"},
    "project_id": {"type": "integer"},
    "title": {"type": "string"},
    "citation": {"$ref": "#/components/schemas/DocumentCitation"},
}

_DOCUMENT_SUMMARY = {"type": "object", "properties": _SUMMARY_PROPERTIES}

_DOCUMENT = {
    "type": "object",
    "description": "a document with the versions the caller may see (and only those)",
    "properties": {
        **_SUMMARY_PROPERTIES,
        "identifiers": {"type": "array", "items": {"type": "string"}},
        "matter": {"type": "object", "nullable": True},
        "doc_type": {"type": "object", "nullable": True},
        "latest_final_version_id": {
            "type": "integer",
            "nullable": True,
            "description": "null when the document has none or it is not a version the caller may see",
        },
        "versions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "version_id": {"type": "integer"},
                    "version_no": {"type": "integer"},
                    "status": {"type": "string"},
                    "doc_date": {"type": "string", "format": "date", "nullable": True},
                    "language": {"type": "string"},
                    "latest_final": {"type": "boolean"},
                    "source_object_ids": {"type": "array", "items": {"type": "integer"}},
                    "chars": {"type": "integer", "description": "characters of the version's text (NFC)"},
                },
            },
        },
    },
}

_TEXT = {
    "type": "object",
    "properties": {
        "document_id": {"type": "integer"},
        "version_id": {"type": "integer"},
        "version_no": {"type": "integer", "description": "among the caller's versions of the document"},
        "status": {"type": "string"},
        "latest_final": {"type": "boolean"},
        "offset": {"type": "integer", "description": "the first character returned (of the NFC text)"},
        "length": {"type": "integer", "description": "characters returned"},
        "total_chars": {"type": "integer"},
        "next_offset": {"type": "integer", "nullable": True, "description": "where to read on; null at the end"},
        "text": {"type": "string"},
        "injection": {"$ref": "#/components/schemas/Injection"},
        "evidence": {
            "type": "object",
            "properties": {
                "sha256": {"type": "string", "description": "SHA-256 (hex) of `text` as UTF-8"},
                "version_sha256": {"type": "string", "description": "SHA-256 (hex) of the version's whole NFC text"},
                "permalink": {"type": "string", "description": "the path that reads this slice again"},
                "source_object_ids": {"type": "array", "items": {"type": "integer"}},
            },
        },
    },
}

_SPAN = {
    "type": "object",
    "nullable": True,
    "description": "where a body chunk sits in its version's text as `GET .../versions/{version_id}/text` counts "
    "it (NFC characters, `end` exclusive); null for clause and profile rows, which are not spans of the text",
    "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}},
}

_HIT_EVIDENCE = {
    "type": "object",
    "properties": {
        "sha256": {"type": "string", "description": "SHA-256 (hex) of the hit's `text` as indexed (before redaction)"},
        "permalink": {"type": "string", "description": "`/v1/chunks/{chunk_id}`: reads this chunk again"},
        "text_permalink": {
            "type": "string",
            "nullable": True,
            "description": "the text slice at `span` (null without a span)",
        },
    },
}

_CHUNK = {
    "type": "object",
    "properties": {
        "chunk_id": {"type": "string"},
        "document_id": {"type": "integer"},
        "version_id": {"type": "integer"},
        "version_no": {"type": "integer", "description": "among the caller's versions of the document"},
        "chunk_kind": {"type": "string", "enum": ["chunk", "clause", "profile"]},
        "ordinal": {"type": "integer"},
        "locus": {"type": "string"},
        "span": {"$ref": "#/components/schemas/Span"},
        "current": {
            "type": "boolean",
            "description": "the index row agrees with the stored text (false until the sync applies an edit)",
        },
        "text": {"type": "string", "description": "a body chunk: the stored text at `span`; else the row's text"},
        "injection": {"$ref": "#/components/schemas/Injection"},
        "evidence": {
            "type": "object",
            "properties": {
                "sha256": {"type": "string", "description": "SHA-256 (hex) of `text` as UTF-8 (before redaction)"},
                "permalink": {"type": "string"},
                "text_permalink": {"type": "string", "nullable": True},
                "source_object_ids": {"type": "array", "items": {"type": "integer"}},
            },
        },
    },
}

_RELATED = {
    "type": "object",
    "properties": {
        "document_id": {"type": "integer"},
        "related": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {
                        "type": "string",
                        "enum": ["supersedes", "annex_of", "responds_to", "references", "thread"],
                    },
                    "direction": {"type": "string", "enum": ["outgoing", "incoming"]},
                    "document": {"$ref": "#/components/schemas/DocumentSummary"},
                },
            },
        },
        "truncated": {"type": "boolean", "description": "more edges than `limit`"},
    },
}

_TRAVERSAL = {
    "type": "object",
    "properties": {
        "nodes": {
            "type": "array",
            "items": {
                "allOf": [
                    {"$ref": "#/components/schemas/DocumentSummary"},
                    {"type": "object", "properties": {"depth": {"type": "integer"}}},
                ]
            },
        },
        "edges": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string"},
                    "from_document_id": {"type": "integer"},
                    "to_document_id": {"type": "integer"},
                },
            },
        },
        "not_found": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "start documents the caller may not see or that do not exist (not told apart)",
        },
        "truncated": {"type": "boolean", "description": "some document had more edges than `max_fanout`"},
    },
}


_LOOKUP_VERSION = {
    "type": "object",
    "description": "the version shown: in force at `as_of`, else the one the document is cited by",
    "properties": {
        "version_id": {"type": "integer"},
        "version_no": {"type": "integer", "description": "among the caller's versions of the document"},
        "status": {"type": "string"},
        "doc_date": {"type": "string", "format": "date", "nullable": True},
        "language": {"type": "string"},
        "latest_final": {"type": "boolean"},
    },
}

_LOOKUP_DOCUMENT: dict[str, Any] = {
    "document_id": {"type": "integer"},
    "project_id": {"type": "integer"},
    "title": {"type": "string"},
    "matched": {
        "type": "object",
        "description": "how it carries the name: `identifier`, `title`, or `statute` (the law a provision belongs "
        "to); `key` is the identity key matched",
        "properties": {
            "why": {"type": "string", "enum": ["identifier", "title", "statute"]},
            "key": {"type": "string"},
        },
    },
    "version": _LOOKUP_VERSION,
    "citation": {"$ref": "#/components/schemas/DocumentCitation"},
}

_LOOKUP = {
    "type": "object",
    "description": "`found`: exactly one document (its fields at the top level); `ambiguous`: `candidates` in "
    "document-id order, never ranked; `not_found`: no document the caller may see carries the name (the same "
    "answer for a hidden document as for a missing one)",
    "properties": {
        "outcome": {"type": "string", "enum": ["found", "ambiguous", "not_found"]},
        "asked": {
            "type": "object",
            "description": "the name as read: `by` (identifier or title), `text`, `kind` (file_number, ecli, "
            "provision, identifier, title), `provision` (canonical, with its parts), `as_of`",
            "properties": {
                "by": {"type": "string"},
                "text": {"type": "string"},
                "kind": {"type": "string", "enum": ["file_number", "ecli", "provision", "identifier", "title"]},
                "provision": {"type": "string"},
                "as_of": {"type": "string", "format": "date", "nullable": True},
            },
        },
        **_LOOKUP_DOCUMENT,
        "provision": {
            "type": "object",
            "nullable": True,
            "description": "a provision asked for, found in the statute's text: its heading line, its span (NFC "
            "characters, from the heading to the next heading of its kind), the body chunk holding the heading "
            "(null until indexed) and the path that reads the span",
            "properties": {
                "heading": {"type": "string"},
                "start": {"type": "integer"},
                "end": {"type": "integer"},
                "chunk_id": {"type": "string", "nullable": True},
                "permalink": {"type": "string"},
            },
        },
        "candidates": {"type": "array", "items": {"type": "object", "properties": _LOOKUP_DOCUMENT}},
        "truncated": {"type": "boolean", "description": "more candidates than listed"},
    },
}


def _document_get(summary: str, response: str, parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": [
                {"name": "document_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}},
                *(parameters or []),
            ],
            "responses": {
                "200": {
                    "description": "found",
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{response}"}}},
                },
                "400": _err("invalid input; `field` names the offending parameter"),
                "401": _err("missing or invalid bearer token"),
                "404": _err("no document the caller may see has this id (whether one exists is not said)"),
            },
        }
    }


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A flat request model's fields as query parameters (lists comma-separated)."""
    schema = model.model_json_schema()
    return [{"name": name, "in": "query", "schema": prop} for name, prop in schema["properties"].items()]


_ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "field": {"type": "string", "description": "the offending request field (400 only)"},
    },
}

_CITATION = {
    "type": "object",
    "properties": {
        "project_id": {"type": "integer"},
        "document_id": {"type": "integer"},
        "version_id": {"type": "integer"},
        "source_object_ids": {"type": "array", "items": {"type": "integer"}},
        "chunk_id": {"type": "string"},
    },
}

_EXPLAIN = {
    "type": "object",
    "description": "score = sum(rrf_parts) * status_boost * decay + promoted_bonus (replaced by rerank_score when "
    "the hit was reranked)",
    "properties": {
        "mode": {"type": "string", "enum": ["hybrid", "lexical", "semantic"], "description": "the legs that ran"},
        "ranks": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "0-based per leg"},
        "weights": {"type": "object", "additionalProperties": {"type": "number"}},
        "rrf_k": {"type": "integer"},
        "rrf_parts": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "weight_leg / (rrf_k + rank) per leg the hit appeared in",
        },
        "rrf_score": {"type": "number"},
        "status_boost": {"type": "number"},
        "decay": {"type": "number", "description": "temporal decay multiplier (1 when retrieval.decay_enabled is off)"},
        "promoted_bonus": {
            "type": "number",
            "description": "retrieval.promoted_bonus for a row of a promoted document (documents.promoted), else 0",
        },
        "fused_score": {"type": "number"},
        "rerank_score": {"type": "number", "nullable": True},
    },
}

_INJECTION = {
    "type": "object",
    "description": "passages of `text` that read as instructions to a model (api.evidence.injection): flagged "
    "with their spans into `text`, or (redact) replaced and only their kinds named; the text is data, never "
    "instructions",
    "properties": {
        "flagged": {"type": "boolean"},
        "redacted": {"type": "boolean"},
        "kinds": {"type": "array", "items": {"type": "string"}},
        "spans": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "start": {"type": "integer"},
                    "end": {"type": "integer"},
                    "kind": {
                        "type": "string",
                        "enum": [
                            "override",
                            "role_marker",
                            "tool_call",
                            "exfiltration",
                            "hidden_unicode",
                            "bidi_control",
                        ],
                    },
                },
            },
        },
    },
}

_HIT = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "project_id": {"type": "integer"},
        "document_id": {"type": "integer"},
        "version_id": {"type": "integer"},
        "chunk_id": {"type": "string"},
        "title": {"type": "string"},
        "text": {"type": "string"},
        "injection": {"$ref": "#/components/schemas/Injection"},
        "matched_identifiers": {"type": "array", "items": {"type": "string"}},
        "match_reason": {
            "type": "string",
            "enum": ["ranked", "identifier", "title", "graph", "authoritative"],
            "description": "`identifier` / `title`: the document the query names (identity preflight), put first; "
            "`graph`: pulled into the pool because a top document references it (retrieval.graph_rag_enabled); "
            "`authoritative`: the best match of retrieval.authoritative_doc_type, kept on the first page",
        },
        "citation": {"$ref": "#/components/schemas/Citation"},
        "span": {"$ref": "#/components/schemas/Span"},
        "evidence": {"$ref": "#/components/schemas/HitEvidence"},
        "context": {
            "type": "array",
            "description": "with `expand`: neighbouring body chunks of the same version",
            "items": {
                "type": "object",
                "properties": {
                    "chunk_id": {"type": "string"},
                    "position": {"type": "string", "enum": ["before", "after"]},
                    "text": {"type": "string"},
                    "injection": {"$ref": "#/components/schemas/Injection"},
                },
            },
        },
        "text_truncated": {
            "type": "boolean",
            "description": "present (true) when the evidence budget cut the first hit's text to fit",
        },
        "compare": {
            "type": "object",
            "description": 'present when the query asks for a comparison ("vorherige Fassung", '
            "\"seit 2019 geändert\"): this hit's version (`later`) and the caller's own version it is compared "
            "with (`earlier`; `version_id` null when they see none on that side)",
            "properties": {
                "earlier": {
                    "type": "object",
                    "properties": {
                        "side": {"type": "string", "description": "`previous`, `current` or a day (ISO)"},
                        "version_id": {"type": "integer", "nullable": True},
                        "version_no": {"type": "integer", "nullable": True},
                        "doc_date": {"type": "string", "format": "date", "nullable": True},
                    },
                },
                "later": {
                    "type": "object",
                    "properties": {
                        "version_id": {"type": "integer"},
                        "version_no": {"type": "integer"},
                        "doc_date": {"type": "string", "format": "date", "nullable": True},
                    },
                },
            },
        },
        "explain": {"$ref": "#/components/schemas/Explain"},
    },
}

_DECISION = {
    "type": "object",
    "properties": {
        "decision_id": {"type": "integer"},
        "project_id": {"type": "integer"},
        "document_id": {"type": "integer", "nullable": True},
        "locus": {"type": "string"},
        "change_summary": {"type": "string"},
        "rationale": {"type": "string"},
        "evidence_source_object_ids": {"type": "array", "items": {"type": "integer"}},
        "created_at": {"type": "string", "format": "date-time"},
        "score": {"type": "number", "description": "share of the query's distinct tokens found in the record"},
        "matched_tokens": {"type": "array", "items": {"type": "string"}},
    },
}


def _page(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["hits", "offset", "limit", "has_more"],
        "properties": {
            "hits": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
            "has_more": {"type": "boolean"},
        },
    }


_MODE = {
    "type": "object",
    "description": "which legs ran: the request's `mode`, else the evidence gate's default, and why",
    "properties": {
        "used": {"type": "string", "enum": ["hybrid", "lexical", "semantic"]},
        "requested": {"type": "string", "enum": ["hybrid", "lexical", "semantic"], "nullable": True},
        "reason": {"type": "string"},
        "vectors_pending": {
            "type": "integer",
            "description": "present when some of the answer's hits wait for their vector (written text first): "
            "found by words, names and filters, not yet by the semantic leg",
        },
    },
}


_SUBJECT = {
    "type": "object",
    "description": "a document the query names (only documents the caller may see)",
    "properties": {
        "document_id": {"type": "integer"},
        "version_id": {"type": "integer"},
        "title": {"type": "string"},
        "why": {"type": "string", "enum": ["identifier", "title"]},
        "matched": {"type": "string", "description": "the name as compared (identity key)"},
    },
}

_IDENTITY = {
    "type": "object",
    "description": "the identity preflight (with `explain`): what the query names",
    "properties": {
        "outcome": {"type": "string", "enum": ["unique", "ambiguous", "none", "off"]},
        "subjects": {"type": "array", "items": {"$ref": "#/components/schemas/Subject"}},
        "shadowed": {"type": "array", "items": {"type": "string"}, "description": "names inside a longer named one"},
        "common": {"type": "array", "items": {"type": "string"}, "description": "names too many documents carry"},
        "hit": {"type": "string", "description": "`filtered_out`: the named document is outside the filters"},
    },
}


def _ranked_page(item: str) -> dict[str, Any]:
    page = _page(item)
    page["properties"]["mode"] = {"$ref": "#/components/schemas/Mode"}
    page["properties"]["ambiguous"] = {
        "type": "array",
        "items": {"$ref": "#/components/schemas/Subject"},
        "description": "present when the query names several documents: they are listed, none is picked",
    }
    page["properties"]["identity"] = {"$ref": "#/components/schemas/Identity"}
    page["properties"]["synonyms_added"] = {
        "type": "array",
        "items": {"type": "string"},
        "description": "with `explain`: phrases the synonym list added to the query",
    }
    page["properties"]["semantic_floor"] = {
        "type": "object",
        "description": "with `explain`: the semantic leg's relevance floor (cosine similarity; null when off or "
        "none is stored for the index's embedding signature) and how many of its hits fell below it",
        "properties": {"similarity": {"type": "number", "nullable": True}, "dropped": {"type": "integer"}},
    }
    page["properties"]["answer_gate"] = {
        "type": "object",
        "description": "with `explain`: the answer's first hits as the coverage gate reads them (their best cosine "
        "similarity, null when the semantic leg did not run; their best share of the question's content words, "
        "null without content words), whether one of them matched an identifier, and whether the gate made the answer "
        "empty",
        "properties": {
            "similarity": {"type": "number", "nullable": True},
            "coverage": {"type": "number", "nullable": True},
            "identifier": {"type": "boolean"},
            "empty": {"type": "boolean"},
        },
    }
    page["properties"]["evidence"] = {
        "type": "object",
        "description": "when an evidence budget applies: characters allowed and used, hits left out for it, and "
        "the offset of the next page (hits left out are not skipped)",
        "properties": {
            "budget_chars": {"type": "integer"},
            "used_chars": {"type": "integer"},
            "hits_dropped": {"type": "integer"},
            "next_offset": {"type": "integer"},
        },
    }
    page["properties"]["graph"] = {
        "type": "object",
        "description": "with retrieval.graph_rag_enabled: `status` (ok, or failed: the answer came without it), "
        "seeds, cited and added documents",
        "properties": {
            "status": {"type": "string", "enum": ["ok", "failed"]},
            "seeds": {"type": "integer"},
            "cited": {"type": "integer"},
            "added": {"type": "integer"},
        },
    }
    page["properties"]["reason"] = {
        "type": "string",
        "enum": ["scope_empty", "filtered_out", "no_credible_evidence"],
        "description": "present when nothing is found: the caller may see no document; the filters leave none of "
        "them; or documents are there but nothing matched",
    }
    return page


def _get(summary: str, properties: dict[str, Any], *, forbidden: bool = False) -> dict[str, Any]:
    responses = {
        "200": {
            "description": "ok",
            "content": {"application/json": {"schema": {"type": "object", "properties": properties}}},
        },
        "401": _err("missing or invalid bearer token"),
    }
    if forbidden:
        responses["403"] = _err("the caller is not an administrator")
    return {"get": {"summary": summary, "responses": responses}}


def _err(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _post(summary: str, request: str, response: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    responses = {
        "200": {
            "description": "the requested window",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{response}"}}},
        },
        "400": _err("invalid input; `field` names the offending field"),
        "401": _err("missing or invalid bearer token"),
        "409": _err("`mode` needs the semantic leg, which is switched off on this service"),
        "412": _err("`stale`: the index had not applied the changes up to `consistency_token` in time; retry"),
        "413": _err("request body too large"),
        "422": _err(f"offset + limit exceeds {MAX_RANKED_WINDOW}"),
        "429": _err("at capacity: too many requests in flight and waiting; retry later"),
        "503": _err("a backend is unavailable (never a partial answer), or no capacity within the queue timeout"),
        **(extra or {}),
    }
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}},
            },
            "responses": responses,
        }
    }


def openapi_document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for name, model in _REQUESTS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    schemas.update(
        Error=_ERROR,
        Citation=_CITATION,
        Explain=_EXPLAIN,
        Injection=_INJECTION,
        Hit=_HIT,
        Mode=_MODE,
        Subject=_SUBJECT,
        Identity=_IDENTITY,
        SearchResponse=_ranked_page("Hit"),
        FilterResponse=_page("Hit"),
        Decision=_DECISION,
        DecisionResponse=_page("Decision"),
        DocumentCitation=_DOCUMENT_CITATION,
        DocumentSummary=_DOCUMENT_SUMMARY,
        Document=_DOCUMENT,
        RelatedResponse=_RELATED,
        TextResponse=_TEXT,
        Span=_SPAN,
        HitEvidence=_HIT_EVIDENCE,
        ChunkResponse=_CHUNK,
        LookupResponse=_LOOKUP,
        TraverseResponse=_TRAVERSAL,
    )
    return {
        "openapi": "3.0.3",
        "info": {"title": "ki-sidecar search API", "version": "1"},
        "paths": {
            "/v1/search": _post(
                "Ranked hybrid search within the caller's SQL access scope", "SearchRequest", "SearchResponse"
            ),
            "/v1/search/filter": _post(
                "Metadata-only search (doc_date descending, one hit per version, score 0)",
                "FilterRequest",
                "FilterResponse",
            ),
            "/v1/decisions/search": _post(
                "Decision records by token overlap; only those whose document and evidence the caller may see",
                "DecisionSearchRequest",
                "DecisionResponse",
            ),
            "/v1/documents/{document_id}": _document_get(
                "A document with the versions the caller may see, its identifiers, matter, type and citations",
                "Document",
            ),
            "/v1/documents/{document_id}/related": _document_get(
                "The document's typed, directed relations whose other end the caller may also see",
                "RelatedResponse",
                _query_parameters(RelatedRequest),
            ),
            "/v1/documents/{document_id}/versions/{version_id}/text": _document_get(
                "A slice of a version's text (NFC characters from `offset`), with hashes and a permalink; 404 alike "
                "for a version that does not exist and one the caller may not see",
                "TextResponse",
                [
                    {"name": "version_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}},
                    *_query_parameters(ReadRequest),
                ],
            ),
            "/v1/chunks/{chunk_id}": {
                "get": {
                    "summary": "A hit's chunk by its id: a body chunk's text from the stored version text at its span, "
                    "with hashes and permalinks; 404 alike for a chunk that does not exist and one of a version the "
                    "caller may not see",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {"name": "chunk_id", "in": "path", "required": True, "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {
                            "description": "found",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChunkResponse"}}},
                        },
                        "400": _err("not a chunk id (`version_id:kind:ordinal`); `field` is `chunk_id`"),
                        "401": _err("missing or invalid bearer token"),
                        "404": _err("no chunk the caller may see has this id (whether one exists is not said)"),
                    },
                }
            },
            "/v1/traverse": _post(
                "Documents reachable over relations, every one checked against the caller's access; documents "
                "the caller may not see are cut, not shown",
                "TraverseRequest",
                "TraverseResponse",
            ),
            "/v1/lookup": _post(
                "Exactly one document and version by an identifier (file number, ECLI, statute provision) or an "
                "exact title, or `ambiguous` with the candidates, or `not_found` -- never a ranking",
                "LookupRequest",
                "LookupResponse",
            ),
            "/v1/stats": {
                "get": {
                    "summary": "Retrieval statistics of the last hours, aggregated (administrators only): queries, "
                    "zero-result queries and why, hit sources (lexical only, semantic only, both), identity "
                    "outcomes, fallbacks",
                    "parameters": [
                        {
                            "name": "hours",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 24 * 366, "default": 24},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "the aggregate",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "400": _err("`hours` is not a whole number in range; `field` is `hours`"),
                        "401": _err("missing or invalid bearer token"),
                        "403": _err("the caller is not an administrator"),
                    },
                }
            },
            "/v1/me": _get(
                "The principals the bearer token names and whether they make an administrator",
                {"principals": {"type": "array", "items": {"type": "string"}}, "admin": {"type": "boolean"}},
            ),
            "/v1/ops/overview": _get(
                "The operations dashboard's figures (administrators only): lag per lane and topic, commit -> "
                "indexed p50/p99, slot WAL retained, DLQ records (and those waiting to be handled), rows waiting for a "
                "vector, index size and alias "
                "target, request rate and latency over api.ops.window_s; from the same sources as the API's and "
                "the lanes' /metrics",
                {
                    "api": {"type": "object"},
                    "lanes": {"type": "object"},
                    "index": {"type": "object"},
                    "dlq_records": {"type": "integer", "nullable": True},
                    "dlq_waiting": {
                        "type": "object",
                        "nullable": True,
                        "description": "dead letters no `ki dlq replay` or `ki dlq drop` has handled yet, and the "
                        "oldest one's wait (null when no lane answers)",
                        "properties": {"records": {"type": "integer"}, "oldest_s": {"type": "number"}},
                    },
                    "slot_retained_bytes": {"type": "integer", "nullable": True},
                    "vectors_pending": {
                        "type": "object",
                        "nullable": True,
                        "description": "rows written text first that wait for their vector, and the oldest "
                        "one's wait (from the content lane; null when no content lane answers)",
                        "properties": {"rows": {"type": "integer"}, "oldest_s": {"type": "number"}},
                    },
                },  # fmt: skip
                forbidden=True,
            ),
            "/healthz": {"get": {"summary": "process is up", "responses": {"200": {"description": "ok"}}}},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics: requests and latency by route and status, per-leg OpenSearch "
                    "latency, scope compilation time and size, embedding cache hits and misses",
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/readyz": {
                "get": {
                    "summary": "PostgreSQL and OpenSearch reachable, index alias present",
                    "responses": {"200": {"description": "ready"}, "503": _err("not ready")},
                }
            },
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
    }
