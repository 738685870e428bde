"""The operations dashboard's figures (`GET /v1/ops/overview`), read from the same sources Prometheus
scrapes: the API's own exposition (`GET /metrics`, which also carries the index gauges), and each sync
lane's `/metrics`. So a figure that is not moving reads the same on the dashboard and in `/metrics`.

Pure parts first (bucket quantiles, the rolling window, the overview itself), then
the reads (`OpsReader`). Quantiles follow Prometheus' `histogram_quantile`: linear within a bucket, the
highest finite bound when the rank falls into `+Inf`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ki.exposition import Buckets, Labels, Sample, first, histogram, minus, total
from ki.exposition import parse as parse_exposition


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """The q-quantile of cumulative buckets; None without observations."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower  # beyond the highest finite bucket: its bound is all that is known
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def beyond(buckets: Mapping[float, float], q: float) -> bool:
    """Whether the q-quantile lies past the highest finite bound (`quantile` then answers that bound)."""
    finite = [count for bound, count in buckets.items() if not math.isinf(bound)]
    every = max(buckets.values(), default=0.0)
    return every > 0 and max(finite, default=0.0) < q * every


@dataclass(frozen=True)
class Reading:
    """The cumulative figures a rate or a window quantile is taken between."""

    at: float
    requests: float = 0.0
    latency: Buckets = field(default_factory=dict)
    freshness: Mapping[str, Buckets] = field(default_factory=dict)  # lane -> buckets


class Window:
    """Readings of the last `seconds`, and the one just before them: the base every figure over the window is
    measured from. Starts with an all-zero reading at `started`, so the first overview already has rates."""

    def __init__(self, seconds: float, started: float, min_gap_s: float = 1.0) -> None:
        self.seconds, self.min_gap_s = seconds, min_gap_s
        self._readings: deque[Reading] = deque([Reading(started)])

    def add(self, reading: Reading) -> Reading:
        """Keep `reading` (at most one per `min_gap_s`) and answer the base for it."""
        if reading.at - self._readings[-1].at >= self.min_gap_s:
            self._readings.append(reading)
        cutoff = reading.at - self.seconds
        while len(self._readings) > 1 and self._readings[1].at <= cutoff:
            self._readings.popleft()
        return self._readings[0]


def _counted(route: str) -> bool:
    """The requests the dashboard reports: the API's work, not the dashboard's own polling."""
    return route.startswith("/v1/") and not route.startswith(("/v1/ops", "/v1/me"))


def _api_route(labels: Labels) -> bool:
    return _counted(labels.get("route", ""))


def _lane_freshness(lane: str, samples: list[Sample]) -> Buckets:
    return histogram(samples, "ki_sync_freshness_seconds", lambda labels: labels.get("lane") == lane)


def api_reading(samples: list[Sample], lanes: Mapping[str, list[Sample]], at: float) -> Reading:
    return Reading(
        at,
        requests=total(samples, "ki_api_requests_total", _api_route),
        latency=histogram(samples, "ki_api_request_duration_seconds", _api_route),
        freshness={lane: _lane_freshness(lane, lane_samples) for lane, lane_samples in lanes.items()},
    )


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def index_state(samples: list[Sample]) -> dict[str, Any]:
    targets = sorted(s.labels["index"] for s in samples if s.name == "ki_index_alias_target" and s.value == 1)
    alias = next((s.labels["alias"] for s in samples if s.name == "ki_index_alias_target"), None)
    size, rows = first(samples, "ki_index_size_bytes"), first(samples, "ki_index_rows")
    return {
        "alias": alias,
        "targets": targets,
        "size_bytes": None if size is None else int(size),
        "rows": None if rows is None else int(rows),
    }


def lane_figures(lane: str, samples: list[Sample], reading: Reading, base: Reading) -> dict[str, Any]:
    """One lane's own figures: its lag by topic (as its /metrics reports it), commit -> indexed quantiles
    over the window, DLQ events since the lane started, and why it is paused (the `reason` labels of
    `ki_sync_lane_paused` at 1, e.g. "index_read_only"; null: it is not)."""
    of_lane = [s for s in samples if s.labels.get("lane") == lane]
    topics: dict[str, float] = {}
    for s in of_lane:
        if s.name == "ki_sync_consumer_lag":
            topics[s.labels["topic"]] = topics.get(s.labels["topic"], 0.0) + s.value
    window = minus(reading.freshness.get(lane, {}), base.freshness.get(lane, {}))
    paused = sorted(s.labels.get("reason", "") for s in of_lane if s.name == "ki_sync_lane_paused" and s.value)
    return {
        "up": True,
        "lag": int(sum(topics.values())),
        "topics": [{"topic": t, "lag": int(v)} for t, v in sorted(topics.items())],
        "freshness_p50_s": _rounded(quantile(window, 0.5)),
        "freshness_p99_s": _rounded(quantile(window, 0.99)),
        # true: the p99 is only known to exceed freshness_p99_s (the histogram's highest bucket)
        "freshness_p99_beyond": beyond(window, 0.99),
        "freshness_events": int(max(window.values(), default=0.0)),
        "dlq_events": int(total(of_lane, "ki_sync_dlq_events_total")),
        "paused": ", ".join(paused) or None,
    }


def overview(
    api: list[Sample],
    lanes: Mapping[str, list[Sample] | str],
    reading: Reading,
    base: Reading,
    *,
    window_s: float,
    index_error: str | None = None,
) -> dict[str, Any]:
    """The dashboard's answer. `lanes`: each lane's parsed /metrics, or why it could not be read."""
    covered = max(reading.at - base.at, 1e-9)
    latency = minus(reading.latency, base.latency)
    restarted = reading.requests < base.requests
    requests = reading.requests if restarted else reading.requests - base.requests
    lane_out: dict[str, Any] = {}
    answering = []
    for lane, got in sorted(lanes.items()):
        if isinstance(got, str):
            lane_out[lane] = {"up": False, "error": got}
        else:
            lane_out[lane] = lane_figures(lane, got, reading, base)
            answering.append(got)
    # Every lane's process reads the slot and the DLQ topic alike: the first that answers is enough.
    slot = next((v for v in (first(s, "ki_sync_replication_slot_retained_bytes") for s in answering) if v is not None),
                None)  # fmt: skip
    dlq = next((v for v in (first(s, "ki_sync_dlq_records") for s in answering) if v is not None), None)
    # Dead letters no `ki dlq replay` / `drop` has handled yet, and the oldest one's wait: every lane reads them.
    waiting = next((s for s in answering if first(s, "ki_sync_dlq_waiting_records") is not None), None)
    # Rows written text first that wait for their vector: the content lane (which adds them) reports it; every
    # other lane's process has the gauge too, at 0.
    content = lanes.get("content")
    pending = content if not isinstance(content, str) and content is not None else None
    return {
        "at": round(reading.at, 3),
        "window_s": window_s,
        "covered_s": round(covered, 3),
        "api": {
            "requests": int(requests),
            "requests_per_s": round(requests / covered, 4),
            "latency_p50_s": _rounded(quantile(latency, 0.5)),
            "latency_p99_s": _rounded(quantile(latency, 0.99)),
            "in_flight": int(total(api, "ki_api_requests_in_flight")),
        },
        "lanes": lane_out,
        "slot_retained_bytes": None if slot is None else int(slot),
        "dlq_records": None if dlq is None else int(dlq),
        "dlq_waiting": None
        if waiting is None
        else {
            "records": int(first(waiting, "ki_sync_dlq_waiting_records") or 0),
            "oldest_s": _rounded(first(waiting, "ki_sync_dlq_oldest_waiting_seconds"), 3),
        },
        "vectors_pending": None
        if pending is None
        else {
            "rows": int(first(pending, "ki_sync_rows_vector_pending") or 0),
            "oldest_s": _rounded(first(pending, "ki_sync_oldest_vector_pending_seconds"), 3),
        },
        "index": {**index_state(api), "error": index_error},
    }


class OpsReader:
    """Reads what `overview` needs: each lane's /metrics over HTTP (concurrently, each bounded by a timeout),
    the index gauges refreshed from OpenSearch, and the API's own exposition."""

    def __init__(self, lane_urls: Mapping[str, str], window_s: float, timeout_s: float) -> None:
        self.lane_urls, self.window_s, self.timeout_s = dict(lane_urls), window_s, timeout_s
        self.window = Window(window_s, time.time())
        self._lock = asyncio.Lock()

    async def _lane(self, session: Any, url: str) -> list[Sample] | str:
        import aiohttp

        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
                if response.status != 200:
                    return f"{url}: HTTP {response.status}"
                return parse_exposition(await response.text())
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            return f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")

    async def read(self, exposition: Callable[[], bytes], index_error: str | None) -> dict[str, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            got = await asyncio.gather(*(self._lane(session, url) for url in self.lane_urls.values()))
        lanes = dict(zip(self.lane_urls, got, strict=True))
        api = parse_exposition(exposition().decode())
        parsed = {lane: s for lane, s in lanes.items() if not isinstance(s, str)}
        async with self._lock:
            reading = api_reading(api, parsed, time.time())
            base = self.window.add(reading)
        return overview(api, lanes, reading, base, window_s=self.window_s, index_error=index_error)
