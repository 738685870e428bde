"""A ranked candidate as the answer's hit: the verified version's identity and title from SQL, the row's
text and metadata from the index, and with `explain` how its score was made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from search.access.reverify import VerifiedVersion
from search.evidence.citations import chunk_permalink, sha256_hex, stored_span, text_permalink
from search.evidence.injection import Mode, marked
from search.ranking.fusion import Candidate


@dataclass(frozen=True)
class FusionParams:
    """What explains a fused score: score = sum(weights[leg] / (rrf_k + ranks[leg])) * status_boost * decay
    + promoted_bonus."""

    weights: Mapping[str, float]
    rrf_k: int
    mode: str | None = None
    method: str = "rrf"


def explain_json(c: Candidate, params: FusionParams) -> dict[str, Any]:
    rrf_score = sum(c.parts.values())
    return {
        "mode": params.mode,
        "ranks": dict(c.ranks),
        "weights": {leg: params.weights[leg] for leg in c.ranks},
        "rrf_k": params.rrf_k,
        # `rrf_parts` / `rrf_score`: each leg's weighted contribution and their sum, whichever `fusion`
        # made them (weight / (rrf_k + rank), or weight * the leg's score normalised over the caller's rows).
        "fusion": params.method,
        "rrf_parts": dict(c.parts),
        "rrf_score": rrf_score,
        "status_boost": c.boost,
        "decay": c.decay,
        "promoted_bonus": c.bonus,
        "fused_score": c.score,
        "rerank_score": c.rerank_score,
    }


def hit_json(c: Candidate, verified: VerifiedVersion, explain: FusionParams | None) -> dict[str, Any]:
    src = c.source
    hit: dict[str, Any] = {
        "score": c.final_score,
        "project_id": verified.project_id,
        "document_id": verified.document_id,
        "version_id": verified.version_id,
        "chunk_id": c.chunk_id,
        "title": verified.title,
        "version_no": verified.version_no,
        "version_status": src.get("version_status"),
        "chunk_kind": src.get("chunk_kind"),
        "doc_date": src.get("doc_date"),
        "language": src.get("language"),
        "text": src.get("text", ""),
        "identifiers": list(src.get("identifiers") or []),
        "matched_identifiers": list(c.matched_identifiers),
        "match_reason": c.match_reason,
        "citation": {
            "project_id": verified.project_id,
            "document_id": verified.document_id,
            "version_id": verified.version_id,
            "source_object_ids": list(verified.source_object_ids),
            "chunk_id": c.chunk_id,
        },
    }
    # How to read on: the chunk by its id, and (a body chunk) the place in the version's text it came from.
    span = stored_span(src)
    hit["span"] = {"start": span[0], "end": span[1]} if span else None
    hit["evidence"] = {
        "sha256": sha256_hex(hit["text"]),  # of the text as indexed, before any redaction
        "permalink": chunk_permalink(c.chunk_id),
        "text_permalink": text_permalink(verified.document_id, verified.version_id, span[0], span[1] - span[0])
        if span
        else None,
    }
    if src.get("meta", {}).get("locus"):
        hit["locus"] = src["meta"]["locus"]
    if verified.compared is not None:  # the query asked for a comparison: both sides, the caller's versions
        other = verified.compared
        hit["compare"] = {
            "earlier": {
                "side": other.side,
                "version_id": other.version_id,
                "version_no": other.version_no,
                "doc_date": other.doc_date.isoformat() if other.doc_date else None,
            },
            "later": {
                "version_id": verified.version_id,
                "version_no": verified.version_no,
                "doc_date": src.get("doc_date"),
            },
        }
    if explain is not None:
        hit["explain"] = explain_json(c, explain)
    return hit


def mark_injections(hits: list[dict[str, Any]], mode: Mode) -> None:
    """Each hit's text and its neighbours' (`context`) as handed out, with their `injection` field: passages
    that read as instructions to a model flagged or replaced (search.evidence.injection)."""
    for hit in hits:
        hit["text"], hit["injection"] = marked(str(hit.get("text") or ""), mode)
        for neighbour in hit.get("context") or []:
            neighbour["text"], neighbour["injection"] = marked(str(neighbour.get("text") or ""), mode)
