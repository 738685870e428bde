"""Graph augmentation of the candidate pool (`retrieval.graph_rag_enabled`, off by default).

The best-ranked documents (seeds) cite others: their forward `references` relations pull the cited
documents into the pool, each with its best chunk for the query, scored as the citing seed's score times
a hop penalty. Bounded at every step (seeds, documents added), scoped like the legs (the scope filter and
the request's filters go into the one OpenSearch query; the scope admits each document; the re-verify
checks each hit in SQL as it does every other), and additive: a ranked candidate is never dropped, only
moved down by an added document that scores above it. Pure parts here; the SQL reads are in
`search.ranking.sql_reads`, the OpenSearch query runs through `search.ranking.scoped` (search.stages.augment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from search.ranking.fusion import Candidate


@dataclass(frozen=True)
class Cited:
    document_id: int
    project_id: int
    seed_score: float  # the best score among the seeds that cite it


def plan_additions(
    seeds: Sequence[Candidate], edges: Sequence[tuple[int, int, int]], present: set[int], max_added: int
) -> list[Cited]:
    """The documents to pull in: cited by a seed, not in the pool yet, at most `max_added`, those cited by the
    best seeds first (then by id)."""
    seed_score: dict[int, float] = {}
    for c in seeds:
        seed_score[c.document_id] = max(seed_score.get(c.document_id, c.score), c.score)
    best: dict[int, Cited] = {}
    for citing, cited, project in edges:
        if cited in present or citing not in seed_score:
            continue
        score = seed_score[citing]
        if cited not in best or score > best[cited].seed_score:
            best[cited] = Cited(cited, project, score)
    ordered = sorted(best.values(), key=lambda c: (-c.seed_score, c.document_id))
    return ordered[:max_added]


def best_chunk_body(
    query: str, strict: dict[str, Any], documents: Sequence[int], source_includes: list[str]
) -> dict[str, Any]:
    """One query: each added document's chunk that best matches the query, within the scope filter."""
    return {
        "size": len(documents),
        "track_total_hits": False,
        "_source": {"includes": source_includes},
        "query": {
            "bool": {
                "filter": [strict, {"terms": {"document_id": [str(d) for d in documents]}}],
                "should": [{"match": {"text": {"query": query}}}],
            }
        },
        "collapse": {"field": "document_id"},
        "sort": ["_score", {"document_version_id": "asc"}],
    }


def added_candidates(hits: Sequence[dict[str, Any]], cited: Sequence[Cited], hop_penalty: float) -> list[Candidate]:
    score_of = {c.document_id: c.seed_score * hop_penalty for c in cited}
    out = []
    for hit in hits:
        source = hit.get("_source") or {}
        try:
            document = int(source["document_id"])
        except (KeyError, TypeError, ValueError):
            continue
        if document in score_of:
            out.append(Candidate(hit["_id"], score_of[document], source, match_reason="graph"))
    return out


def merge(kept: Sequence[Candidate], added: Sequence[Candidate]) -> list[Candidate]:
    """Ranked and added candidates by score; on a tie the ranked one stays ahead (a stable sort). Nothing is
    dropped."""
    return sorted([*kept, *added], key=lambda c: -c.score)


def authoritative_body(query: str, strict: dict[str, Any], node_id: int, source_includes: list[str]) -> dict[str, Any]:
    """The best lexical matches for the query among the documents of one type's subtree, within the scope."""
    return {
        "size": 3,
        "track_total_hits": False,
        "_source": {"includes": source_includes},
        "query": {
            "bool": {
                "filter": [strict, {"term": {"doc_type_ancestors": str(node_id)}}],
                "must": [{"match": {"text": {"query": query}}}],
            }
        },
    }
