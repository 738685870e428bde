"""A rate limit per caller: a token bucket per principal set (the token's principals, canonical, sorted).

Against bisection: whatever a single answer hides, a caller who may ask without limit can
probe one hypothesis per request. Each caller's bucket holds `api.limits.rate_burst` requests and refills at
`api.limits.rate_per_s`; a request that finds it empty is refused with 429 and `Retry-After` (whole
seconds until one request's worth has refilled), before any work is done. 0 per second: no limit.

Per process: `ki serve --workers N` gives each worker its own buckets (a caller whose requests the kernel
spreads over N workers gets up to N times the rate); across machines, limit at the load balancer too. The
buckets are bounded (`max_callers`, least recently used evicted), so a flood of distinct tokens costs
memory once, not without bound; an evicted caller starts again with a full bucket.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ki.errors import TransientError
from ki.principals import canonical_principal


class RateLimited(TransientError):
    """A caller asked faster than `api.limits.rate_per_s` (HTTP 429, `Retry-After: retry_after_s`)."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(f"too many requests from this caller; retry in {retry_after_s} s")


class RateLimiter:
    def __init__(
        self,
        per_s: float,
        burst: int,
        max_callers: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_s, self.burst, self.max_callers, self.clock = per_s, burst, max_callers, clock
        self._buckets: OrderedDict[tuple[str, ...], tuple[float, float]] = OrderedDict()  # tokens, when

    @staticmethod
    def key(principals: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted({canonical_principal(p) or p for p in principals}))

    def take(self, principals: Sequence[str]) -> None:
        """Spend one request of this caller's bucket; RateLimited when it is empty."""
        if self.per_s <= 0:
            return
        key, now = self.key(principals), self.clock()
        tokens, then = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            raise RateLimited(max(1, math.ceil((1.0 - tokens) / self.per_s)))
        self._buckets[key] = (tokens - 1.0, now)
        while len(self._buckets) > self.max_callers:
            self._buckets.popitem(last=False)
