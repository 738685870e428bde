"""Summary statistics the benchmarks share (one percentile definition for every figure they print)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample: the smallest value with at least
    q % of the sample at or below it."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def machine(load_start: Sequence[float], **extra: object) -> dict[str, object]:
    """What a benchmark's figures were measured on: the cores and the load average at start and end (the
    machine is shared; a busy one explains slow rounds)."""
    return {
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in load_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        **extra,
    }
