"""The one retry schedule (ki.backoff)."""

from __future__ import annotations

import pytest

from ki.backoff import Backoff


def test_delays_double_up_to_the_cap() -> None:
    schedule = Backoff(base_s=0.5, max_s=15.0)
    assert [schedule.delay(n) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert schedule.delay(10_000) == 15.0  # no overflow however long a partition keeps failing


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999])
def test_jitter_spreads_within_its_fraction(draw: float) -> None:
    schedule = Backoff(base_s=1.0, max_s=100.0, jitter=0.25, _random=lambda: draw)
    assert 0.75 <= schedule.delay(2) / 4.0 <= 1.25
    assert schedule.delay(2) == pytest.approx(4.0 * (1 + 0.25 * (2 * draw - 1)))


def test_a_server_hint_wins_but_stays_capped() -> None:
    schedule = Backoff(base_s=0.5, max_s=20.0, jitter=0.25)
    assert schedule.delay(0, hint_s=7.0) == 7.0
    assert schedule.delay(0, hint_s=600.0) == 20.0
    assert schedule.delay(3, hint_s=-1.0) == 0.0
