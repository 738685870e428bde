"""Paired comparison of two rankings per query (apps.dev.eval.significance)."""

from __future__ import annotations

import random

import pytest

from apps.dev.eval.significance import paired_comparison, significant


def test_a_consistent_gain_is_significant_and_its_interval_excludes_zero() -> None:
    rng = random.Random(1)
    b = [rng.random() * 0.5 for _ in range(100)]
    a = [x + 0.1 + rng.random() * 0.02 for x in b]
    result = paired_comparison(a, b, resamples=2000)
    assert (result["wins"], result["losses"], result["ties"]) == (100, 0, 0)
    assert result["ci95"][0] > 0 and significant(result, 0.05)
    assert result["mean_difference"] == pytest.approx(0.11, abs=0.01)


def test_noise_around_zero_is_not_significant() -> None:
    rng = random.Random(2)
    b = [rng.random() for _ in range(60)]
    a = [x + rng.choice((-0.05, 0.05)) for x in b]
    result = paired_comparison(a, b, resamples=2000)
    assert result["ci95"][0] < 0 < result["ci95"][1] and not significant(result, 0.05)


def test_identical_rankings_tie_everywhere_and_p_is_one() -> None:
    result = paired_comparison([0.5, 1.0, 0.0], [0.5, 1.0, 0.0], resamples=500)
    assert result["ties"] == 3 and result["p_value"] == 1.0 and result["ci95"] == [0.0, 0.0]


def test_the_same_seed_gives_the_same_report_and_bad_input_is_refused() -> None:
    a, b = [0.1, 0.9, 0.4, 0.7], [0.2, 0.5, 0.4, 0.1]
    assert paired_comparison(a, b, resamples=300, seed=5) == paired_comparison(a, b, resamples=300, seed=5)
    with pytest.raises(ValueError, match="same queries"):
        paired_comparison([0.1], [0.1, 0.2])
    with pytest.raises(ValueError, match="no queries"):
        paired_comparison([], [])
