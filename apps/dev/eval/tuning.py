"""The hybrid fusion grid `ki eval --tune` searches on the train split (never on test).

Weighted RRF ranks by sum_leg w_leg / (k + rank); multiplying the lexical and semantic weights by one
constant changes no order between them, so the lexical weight stays 1 and the semantic weight (well
below 1 included: a weak embedder on German text should be able to lose most of its say) and `k` vary.
The identifier leg keeps its configured weight.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SEMANTIC_WEIGHTS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5)
RRF_KS: tuple[int, ...] = (10, 20, 40, 60, 100)
MAX_TRAIN_QUERIES = 1000  # sampled (fixed seed) from a larger train split, for speed


@dataclass(frozen=True, order=True)
class FusionConfig:
    weight_lexical: float
    weight_semantic: float
    rrf_k: int

    def label(self) -> str:
        return f"w_lex={self.weight_lexical:g} w_sem={self.weight_semantic:g} k={self.rrf_k}"


def grid(semantic_weights: Sequence[float] = SEMANTIC_WEIGHTS, rrf_ks: Sequence[int] = RRF_KS) -> list[FusionConfig]:
    """Every (semantic weight, k) pair with lexical weight 1, weights outer; duplicates dropped, order kept."""
    if not semantic_weights or not rrf_ks:
        raise ValueError("the grid needs at least one weight and one k")
    if any(w < 0 for w in semantic_weights) or any(k < 1 for k in rrf_ks):
        raise ValueError("weights must be >= 0 and k >= 1")
    configs = [FusionConfig(1.0, float(w), int(k)) for w in semantic_weights for k in rrf_ks]
    return list(dict.fromkeys(configs))


def sample_queries(query_ids: Sequence[str], limit: int = MAX_TRAIN_QUERIES, seed: int = 13) -> list[str]:
    """At most `limit` ids, a fixed-seed sample kept in their original order."""
    if len(query_ids) <= limit:
        return list(query_ids)
    chosen = set(random.Random(seed).sample(list(query_ids), limit))
    return [qid for qid in query_ids if qid in chosen]


def pick_best(scored: Iterable[tuple[FusionConfig, float]], default: FusionConfig) -> tuple[FusionConfig, float]:
    """The highest score; a tie goes to the configured default, then to the earliest in grid order,
    so the choice never depends on floating-point noise between equal configurations."""
    best: tuple[FusionConfig, float] | None = None
    for config, score in scored:
        if best is None or score > best[1] or (score == best[1] and config == default):
            best = (config, score)
    if best is None:
        raise ValueError("nothing was scored")
    return best
