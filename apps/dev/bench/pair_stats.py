"""The statistics of a paired timing comparison (`ki bench authz-timing`): pure, no I/O.

Each pair times the same request shape twice, once on the "hidden" side (something the caller may not
see exists) and once on the "missing" side (it does not), in random order, back to back. What a caller
could exploit is not a difference of medians but how often one side is slower: the per-pair probability

    P(hidden slower) = mean over pairs of [hidden_ms > missing_ms]   (a tie counts 1/2)

is 1/2 when the two sides cannot be told apart. Its 95 % Wilson score interval says how sure that is; the
goal is an interval inside [0.45, 0.55]: a caller who tries a pair learns at most 5 points over a coin toss.
A run takes pairs in blocks until the interval is within the goal or the maximum is reached (`PairPlan`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.dev.bench.stats import percentile

#: Two-sided 95 % normal quantile.
Z95 = 1.959963984540054
#: The goal: the whole interval of P(hidden slower) within these bounds.
GOAL = (0.45, 0.55)


def pair_outcome(hidden_ms: float, missing_ms: float) -> float:
    """1 when the hidden side was slower, 0 when faster, 1/2 on a tie."""
    if hidden_ms > missing_ms:
        return 1.0
    if hidden_ms < missing_ms:
        return 0.0
    return 0.5


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `successes / n` (successes may be fractional: ties count 1/2,
    which makes the interval a little conservative). (0, 1) without observations."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} not within 0..{n}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def within(interval: tuple[float, float], goal: tuple[float, float] = GOAL) -> bool:
    return goal[0] <= interval[0] and interval[1] <= goal[1]


@dataclass
class PairSeries:
    """The timed pairs of one case."""

    hidden_ms: list[float] = field(default_factory=list)
    missing_ms: list[float] = field(default_factory=list)

    def add(self, hidden_ms: float, missing_ms: float) -> None:
        self.hidden_ms.append(hidden_ms)
        self.missing_ms.append(missing_ms)

    @property
    def pairs(self) -> int:
        return len(self.hidden_ms)

    @property
    def hidden_slower(self) -> float:
        """Pairs in which the hidden side was slower (ties count 1/2)."""
        return sum(pair_outcome(h, m) for h, m in zip(self.hidden_ms, self.missing_ms, strict=True))

    @property
    def ties(self) -> int:
        return sum(1 for h, m in zip(self.hidden_ms, self.missing_ms, strict=True) if h == m)

    @property
    def p_hidden_slower(self) -> float:
        return self.hidden_slower / self.pairs if self.pairs else 0.5

    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.hidden_slower, self.pairs)

    def met(self, goal: tuple[float, float] = GOAL) -> bool:
        return self.pairs > 0 and within(self.interval(), goal)

    def summary(self, goal: tuple[float, float] = GOAL) -> dict[str, Any]:
        if not self.pairs:
            return {"pairs": 0, "met": False}
        hidden, missing = statistics.median(self.hidden_ms), statistics.median(self.missing_ms)
        lo, hi = self.interval()
        differences = [h - m for h, m in zip(self.hidden_ms, self.missing_ms, strict=True)]
        return {
            "pairs": self.pairs,
            "p_hidden_slower": round(self.p_hidden_slower, 4),
            "interval_95": [round(lo, 4), round(hi, 4)],
            "ties": self.ties,
            "hidden_ms_p50": round(hidden, 3),
            "missing_ms_p50": round(missing, 3),
            "difference_ms": round(hidden - missing, 3),
            "pair_difference_ms_p50": round(statistics.median(differences), 3),
            # The tails: an answer held to a release grid leaves a quantum later when its work overran one.
            "hidden_ms_p90_p99": [round(percentile(self.hidden_ms, q), 3) for q in (90, 99)],
            "missing_ms_p90_p99": [round(percentile(self.missing_ms, q), 3) for q in (90, 99)],
            "met": within((lo, hi), goal),
            # The interval leaves out 1/2: the sides differ (which one is slower: p above or below 1/2).
            "excludes_half": not lo <= 0.5 <= hi,
        }


def outside(interval: tuple[float, float], goal: tuple[float, float] = GOAL) -> bool:
    """The whole interval lies beyond the goal: one side is slower by more than the goal allows."""
    return interval[0] > goal[1] or interval[1] < goal[0]


@dataclass(frozen=True)
class PairPlan:
    """How many pairs a case gets: at least `min_pairs`, then blocks of `block` while the interval is not
    within the goal, never more than `max_pairs`. With `stop_outside`, also no more once the interval lies
    wholly beyond the goal (more pairs would only narrow it there: the case has missed the goal)."""

    min_pairs: int
    max_pairs: int
    block: int
    stop_outside: bool = True

    def __post_init__(self) -> None:
        if self.min_pairs < 1 or self.block < 1 or self.max_pairs < self.min_pairs:
            raise ValueError(f"need 1 <= min_pairs <= max_pairs and block >= 1, got {self}")

    def stopped(self, series: PairSeries, goal: tuple[float, float] = GOAL) -> str | None:
        """Why this case takes no more pairs (`met`, `outside`, `max_pairs`), or None while it does."""
        done = series.pairs
        if done < self.min_pairs:
            return None
        if series.met(goal):
            return "met"
        if self.stop_outside and outside(series.interval(), goal):
            return "outside"
        return "max_pairs" if done >= self.max_pairs else None

    def next_block(self, series: PairSeries, goal: tuple[float, float] = GOAL) -> int:
        """Pairs to take next (0: this case is done)."""
        done = series.pairs
        if done < self.min_pairs:
            return min(self.block, self.min_pairs - done)
        if self.stopped(series, goal) is not None:
            return 0
        return min(self.block, self.max_pairs - done)


def pairs_needed(hidden_ms: Sequence[float], missing_ms: Sequence[float], plan: PairPlan) -> int:
    """The pairs `plan` would have stopped at on these timings, in this order (for tests and replays)."""
    series = PairSeries()
    while (take := plan.next_block(series)) > 0:
        start = series.pairs
        if start + take > len(hidden_ms):
            raise ValueError("not enough timings for the plan")
        for i in range(start, start + take):
            series.add(hidden_ms[i], missing_ms[i])
    return series.pairs
