"""One retry schedule for every retry loop: exponential delays with a cap and optional jitter.

The loops themselves differ in what they retry (a bulk request's rejected items, a transient
OpenSearch failure, a sync batch, an embedding request) and when they give up; how long they wait
between attempts is decided here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """Attempt n (from 0) waits `base_s` · 2ⁿ, at most `max_s`, spread by ±`jitter` (a fraction) so that
    many clients failing together do not retry together."""

    base_s: float
    max_s: float
    jitter: float = 0.0
    _random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def delay(self, attempt: int, hint_s: float | None = None) -> float:
        """The wait before retry `attempt`; a server's hint (Retry-After) wins, capped all the same."""
        if hint_s is not None:
            return min(max(hint_s, 0.0), self.max_s)
        raw = self.base_s * 2.0 ** min(attempt, 62)
        spread = 1.0 + self.jitter * (2.0 * self._random() - 1.0)
        return min(raw * spread, self.max_s)
