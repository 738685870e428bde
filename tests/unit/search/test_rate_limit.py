"""The per-caller rate limit (search.rate_limit): a token bucket per principal set."""

from __future__ import annotations

import pytest

from search.rate_limit import RateLimited, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_caller_gets_the_burst_then_the_rate_and_a_retry_after() -> None:
    clock = Clock()
    limiter = RateLimiter(per_s=2.0, burst=3, clock=clock)
    for _ in range(3):
        limiter.take(["user:anna"])
    with pytest.raises(RateLimited) as refused:
        limiter.take(["user:anna"])
    assert refused.value.retry_after_s == 1  # half a second until one request has refilled: whole seconds
    clock.now += 0.5
    limiter.take(["user:anna"])
    with pytest.raises(RateLimited):
        limiter.take(["user:anna"])


def test_callers_are_principal_sets_and_spelling_does_not_make_a_new_one() -> None:
    limiter = RateLimiter(per_s=0.001, burst=1, clock=Clock())
    limiter.take(["user:anna", "group:partner"])
    with pytest.raises(RateLimited) as refused:
        limiter.take([" GROUP:Partner", "User:Anna"])
    assert refused.value.retry_after_s == 1000
    limiter.take(["user:anna"])  # another principal set, another bucket
    limiter.take(["user:ben", "group:partner"])


def test_zero_per_second_is_no_limit_and_buckets_are_bounded() -> None:
    unlimited = RateLimiter(per_s=0, burst=1, clock=Clock())
    for _ in range(1000):
        unlimited.take(["user:anna"])
    bounded = RateLimiter(per_s=1, burst=1, max_callers=10, clock=Clock())
    for i in range(100):
        bounded.take([f"user:u{i}"])
    assert len(bounded._buckets) == 10
    bounded.take(["user:u0"])  # evicted long ago: a full bucket again
