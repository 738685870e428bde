"""The semantic leg's relevance floor: a nearest neighbour is not evidence just because it is nearest.

An off-corpus question still has nearest chunks; without a floor their least-bad match is fused like any
other hit. The floor is a cosine similarity per embedding signature (`retrieval.semantic_floor`), since
every model spreads its similarities differently (multilingual-e5 rarely goes below 0.7 for unrelated
German text, MiniLM does). `ki eval --tune` proposes one from a train split (`floor_from_train`).

OpenSearch reports a kNN hit's score, not its similarity; `cosine_from_score` inverts the engine's score
for the index's space type (vectors are L2-normalised, so inner product and L2 distance are cosine too).
Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ki.settings import RetrievalSettings
from search.ranking.legs import LegHit

# The train queries whose relevant document's best similarity stays at or above the proposed floor.
FLOOR_KEEPS = 0.99


def cosine_from_score(score: float, space_type: str) -> float:
    """The cosine similarity behind an OpenSearch kNN score (Lucene/Faiss scoring of each space type)."""
    if space_type == "cosinesimil":  # score = (1 + cos) / 2
        return 2.0 * score - 1.0
    if space_type == "innerproduct":  # score = 1 + ip for ip >= 0, else 1 / (1 - ip)
        return score - 1.0 if score >= 1.0 else 1.0 - 1.0 / score
    if space_type == "l2":  # score = 1 / (1 + d^2), and d^2 = 2 - 2 cos for unit vectors
        return 1.0 - (1.0 / score - 1.0) / 2.0
    raise ValueError(f"no similarity for vector space type {space_type!r}")


def floor_for(retrieval: RetrievalSettings, signature: str) -> float | None:
    """The floor in force for an index of `signature`, None when off or none is stored for it."""
    if not retrieval.semantic_floor_enabled:
        return None
    return retrieval.semantic_floor.get(signature)


def apply_floor(hits: Sequence[LegHit], floor: float | None, space_type: str) -> tuple[list[LegHit], int]:
    """The semantic hits at or above `floor` (in rank order) and how many fell below it."""
    if floor is None:
        return list(hits), 0
    kept = [h for h in hits if cosine_from_score(h.score, space_type) >= floor]
    return kept, len(hits) - len(kept)


def floor_empties_answer(legs_before: Mapping[str, Sequence[LegHit]], semantic_kept: int) -> bool:
    """`retrieval.semantic_floor_gates_answer`: the answer is empty when the semantic leg ran and found hits, the
    floor kept none of them, and the identifier leg matched nothing. A lexical match alone is then not taken as
    evidence: on a real word that no document is about, BM25 still finds the documents that use it."""
    semantic = legs_before.get("semantic")
    if not semantic or semantic_kept:
        return False
    return not legs_before.get("identifier")


def floor_from_train(best_relevant: Sequence[float], keeps: float = FLOOR_KEEPS) -> float | None:
    """A floor that `keeps` of the train queries pass: the similarity of each query's best-ranked relevant
    hit, sorted, read at the (1 - keeps) quantile (rounded down to 3 decimals, so the floor never sits just
    above a kept query's value). None without train queries."""
    if not best_relevant:
        return None
    if not 0.0 < keeps <= 1.0:
        raise ValueError(f"keeps must be in (0, 1], got {keeps}")
    ordered = sorted(best_relevant)
    index = min(int(math.floor((1.0 - keeps) * len(ordered))), len(ordered) - 1)
    return math.floor(ordered[index] * 1000.0) / 1000.0
