"""The hybrid fusion grid `ki eval --tune` searches on the train split (never on test).

Weighted RRF ranks by sum_leg w_leg / (k + rank); multiplying every weight by one constant does not
change any order, so the semantic weight stays 1 and only the lexical:semantic ratio and `k` vary.
The identifier leg keeps its configured weight (SciFact has no identifiers for it to match).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LEXICAL_RATIOS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
RRF_KS: tuple[int, ...] = (5, 20, 60, 120)


@dataclass(frozen=True, order=True)
class FusionConfig:
    weight_lexical: float
    weight_semantic: float
    rrf_k: int

    def label(self) -> str:
        return f"w_lex={self.weight_lexical:g} w_sem={self.weight_semantic:g} k={self.rrf_k}"


def grid(lexical_ratios: Sequence[float] = LEXICAL_RATIOS, rrf_ks: Sequence[int] = RRF_KS) -> list[FusionConfig]:
    """Every (ratio, k) pair, ratios outer; duplicates dropped, order kept."""
    if not lexical_ratios or not rrf_ks:
        raise ValueError("the grid needs at least one ratio and one k")
    if any(r < 0 for r in lexical_ratios) or any(k < 1 for k in rrf_ks):
        raise ValueError("ratios must be >= 0 and k >= 1")
    configs = [FusionConfig(float(r), 1.0, int(k)) for r in lexical_ratios for k in rrf_ks]
    return list(dict.fromkeys(configs))


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
