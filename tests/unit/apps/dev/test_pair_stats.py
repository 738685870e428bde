"""The paired timing statistic of `ki bench authz-timing` (`apps.dev.bench.pair_stats`): P(hidden slower)
with ties as halves, its Wilson interval, and how many pairs a case takes."""

from __future__ import annotations

import math
import random

import pytest

from apps.dev.bench.pair_stats import (
    GOAL,
    PairPlan,
    PairSeries,
    pair_outcome,
    pairs_needed,
    wilson_interval,
    within,
)


def test_a_pair_counts_one_when_hidden_is_slower_and_half_on_a_tie() -> None:
    assert pair_outcome(2.0, 1.0) == 1.0
    assert pair_outcome(1.0, 2.0) == 0.0
    assert pair_outcome(1.5, 1.5) == 0.5


def test_wilson_interval_matches_the_textbook_values() -> None:
    # 50 of 100: centre 0.5, half-width 1.96 * sqrt(0.25 / 100) / (1 + 1.96^2 / 100) (+ the z^2 term)
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    lo, hi = wilson_interval(0, 10)  # no success: starts at 0, unlike the normal interval it is not empty
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert lo == pytest.approx(0.7225, abs=1e-4) and hi == pytest.approx(1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_the_interval_narrows_with_the_square_root_of_the_pairs() -> None:
    widths = [wilson_interval(n / 2, n)[1] - wilson_interval(n / 2, n)[0] for n in (1000, 4000)]
    assert widths[0] / widths[1] == pytest.approx(2.0, rel=0.01)
    # 1000 balanced pairs are within [0.45, 0.55]; 300 are not, whatever they show.
    assert within(wilson_interval(500, 1000), GOAL)
    assert not within(wilson_interval(150, 300), GOAL)


def test_series_summary_reports_probability_interval_medians_and_goal() -> None:
    series = PairSeries()
    for hidden, missing in [(3.0, 1.0), (1.0, 3.0), (2.0, 2.0), (5.0, 4.0)]:
        series.add(hidden, missing)
    summary = series.summary()
    assert summary["pairs"] == 4 and summary["ties"] == 1
    assert summary["p_hidden_slower"] == pytest.approx(2.5 / 4)
    lo, hi = wilson_interval(2.5, 4)
    assert summary["interval_95"] == [round(lo, 4), round(hi, 4)]
    assert summary["hidden_ms_p50"] == 2.5 and summary["missing_ms_p50"] == 2.5 and summary["difference_ms"] == 0
    assert summary["met"] is False and summary["excludes_half"] is False
    assert PairSeries().summary() == {"pairs": 0, "met": False}


def test_a_clear_difference_excludes_one_half() -> None:
    series = PairSeries()
    for _ in range(200):
        series.add(2.0, 1.0)
    summary = series.summary()
    assert summary["p_hidden_slower"] == 1.0 and summary["excludes_half"] and not summary["met"]


def test_plan_takes_the_minimum_then_blocks_until_met_or_the_maximum() -> None:
    plan = PairPlan(min_pairs=1000, max_pairs=4000, block=500)
    series = PairSeries()
    assert plan.next_block(series) == 500  # the minimum comes in blocks too
    for _ in range(500):
        series.add(2.0, 1.0)
    assert plan.next_block(series) == 500
    rng = random.Random(1)
    balanced = [(rng.random(), rng.random()) for _ in range(4000)]
    # Indistinguishable sides: the goal is met at the minimum (or a block later, by chance).
    needed = pairs_needed([h for h, _ in balanced], [m for _, m in balanced], plan)
    assert needed in (1000, 1500, 2000)
    # A side always slower: never met; the interval is wholly beyond the goal after the minimum, so it stops
    # there, or (without stopping early) at the maximum.
    assert pairs_needed([2.0] * 4000, [1.0] * 4000, plan) == 1000
    assert plan.stopped(_series(1000, slower=True)) == "outside"
    running = PairPlan(min_pairs=1000, max_pairs=4000, block=500, stop_outside=False)
    assert pairs_needed([2.0] * 4000, [1.0] * 4000, running) == 4000
    assert running.stopped(_series(4000, slower=True)) == "max_pairs"
    # Slightly slower (P = 0.53): neither met nor outside at 1000 pairs: more blocks, up to the maximum.
    mixed = PairSeries()
    for k in range(1000):
        mixed.add(*((2.0, 1.0) if k % 100 < 53 else (1.0, 2.0)))
    assert plan.stopped(mixed) is None and plan.next_block(mixed) == 500
    assert plan.stopped(PairSeries()) is None
    # The last block is cut to the maximum.
    assert PairPlan(10, 25, 10, stop_outside=False).next_block(_series(20, slower=True)) == 5
    assert PairPlan(10, 25, 10, stop_outside=False).next_block(_series(25, slower=True)) == 0


def test_plan_rejects_nonsense() -> None:
    for args in ((0, 10, 5), (10, 5, 5), (5, 10, 0)):
        with pytest.raises(ValueError):
            PairPlan(*args)


def test_p_near_half_needs_about_the_predicted_pairs() -> None:
    """Half-width 1.96 * sqrt(1/4n): 0.05 at ~384 pairs, so a series exactly at 1/2 is within the goal from about
    there on, and one at 0.53 only once the half-width is below 0.02 (~2400 pairs)."""
    assert not within(wilson_interval(0.5 * 380, 380))
    assert within(wilson_interval(0.5 * 390, 390))
    n = math.ceil(1.96**2 * 0.25 / 0.02**2)
    assert within(wilson_interval(0.53 * (n + 100), n + 100)) and not within(wilson_interval(0.53 * 1000, 1000))


def _series(n: int, *, slower: bool) -> PairSeries:
    series = PairSeries()
    for _ in range(n):
        series.add(2.0 if slower else 1.0, 1.0 if slower else 2.0)
    return series
