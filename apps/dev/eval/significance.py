"""Is one ranking better than another on these queries, or only on average by chance? Paired per query:
wins, losses and ties; the mean difference with a 95 % paired-bootstrap interval; and
the two-sided p-value of a paired sign-flip permutation test (under "no difference" each query's
difference is as likely negative as positive). Seeded, so a report is reproducible. Pure."""

from __future__ import annotations

import random
from collections.abc import Sequence
from statistics import fmean
from typing import Any

RESAMPLES = 10_000
TIE = 1e-9


def paired_comparison(
    a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """`a` against `b`, query by query (same order): positive differences favour `a`."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need the same queries: {len(a)} against {len(b)}")
    if not a:
        raise ValueError("no queries to compare")
    differences = [x - y for x, y in zip(a, b, strict=True)]
    observed = fmean(differences)
    rng = random.Random(seed)
    n = len(differences)
    means = sorted(fmean(rng.choices(differences, k=n)) for _ in range(resamples))
    low, high = means[int(0.025 * (resamples - 1))], means[int(0.975 * (resamples - 1))]
    # Sign flips: the share of relabelled means at least as far from 0 as the one observed (+1: the
    # observed assignment counts itself, so p is never 0).
    extreme = sum(
        abs(fmean(d if rng.random() < 0.5 else -d for d in differences)) >= abs(observed) - TIE
        for _ in range(resamples)
    )
    return {
        "queries": n,
        "wins": sum(d > TIE for d in differences),
        "losses": sum(d < -TIE for d in differences),
        "ties": sum(abs(d) <= TIE for d in differences),
        "mean_difference": round(observed, 6),
        "ci95": [round(low, 6), round(high, 6)],
        "p_value": round((extreme + 1) / (resamples + 1), 6),
        "test": f"paired sign-flip permutation ({resamples} resamples); bootstrap interval; seed {seed}",
    }


def significant(comparison: dict[str, Any], level: float) -> bool:
    """Is the difference significant at `level` (e.g. 0.05)?"""
    return float(comparison["p_value"]) < level
