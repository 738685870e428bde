"""The operations dashboard's pure parts: exposition parsing, bucket quantiles, the rolling window and the
overview built from the API's and the lanes' samples."""

from __future__ import annotations

import math

import pytest

from ki.exposition import minus
from ki.exposition import parse as parse_exposition
from search.telemetry.ops import Reading, Window, api_reading, beyond, overview, quantile

API = """\
# TYPE ki_api_requests_total counter
ki_api_requests_total{route="/v1/search",method="POST",status="200"} 30
ki_api_requests_total{route="/v1/ops/overview",method="GET",status="200"} 500
ki_api_requests_total{route="/metrics",method="GET",status="200"} 70
# TYPE ki_api_request_duration_seconds histogram
ki_api_request_duration_seconds_bucket{route="/v1/search",method="POST",status="200",le="0.1"} 20
ki_api_request_duration_seconds_bucket{route="/v1/search",method="POST",status="200",le="1.0"} 30
ki_api_request_duration_seconds_bucket{route="/v1/search",method="POST",status="200",le="+Inf"} 30
ki_api_request_duration_seconds_count{route="/v1/search",method="POST",status="200"} 30
ki_api_request_duration_seconds_sum{route="/v1/search",method="POST",status="200"} 4
ki_api_request_duration_seconds_bucket{route="/v1/ops/overview",method="GET",status="200",le="0.1"} 0
ki_api_request_duration_seconds_bucket{route="/v1/ops/overview",method="GET",status="200",le="1.0"} 0
ki_api_request_duration_seconds_bucket{route="/v1/ops/overview",method="GET",status="200",le="+Inf"} 500
ki_api_request_duration_seconds_count{route="/v1/ops/overview",method="GET",status="200"} 500
ki_api_request_duration_seconds_sum{route="/v1/ops/overview",method="GET",status="200"} 9000
# TYPE ki_api_requests_in_flight gauge
ki_api_requests_in_flight 2
# TYPE ki_index_size_bytes gauge
ki_index_size_bytes 123456
# TYPE ki_index_rows gauge
ki_index_rows 789
# TYPE ki_index_alias_target gauge
ki_index_alias_target{alias="chunks",index="chunks--old"} 0
ki_index_alias_target{alias="chunks",index="chunks--new"} 1
"""

CONTENT = """\
# TYPE ki_sync_consumer_lag gauge
ki_sync_consumer_lag{lane="content",topic="ki.public.documents",partition="0"} 3
ki_sync_consumer_lag{lane="content",topic="ki.public.documents",partition="1"} 4
ki_sync_consumer_lag{lane="access",topic="ki.public.grants",partition="0"} 9
# TYPE ki_sync_freshness_seconds histogram
ki_sync_freshness_seconds_bucket{lane="content",le="0.5"} 10
ki_sync_freshness_seconds_bucket{lane="content",le="1.0"} 90
ki_sync_freshness_seconds_bucket{lane="content",le="+Inf"} 100
ki_sync_freshness_seconds_count{lane="content"} 100
ki_sync_freshness_seconds_sum{lane="content"} 80
# TYPE ki_sync_dlq_events_total counter
ki_sync_dlq_events_total{lane="content",table="documents"} 2
# TYPE ki_sync_lane_paused gauge
ki_sync_lane_paused{lane="content",reason="index_read_only"} 1
# TYPE ki_sync_dlq_records gauge
ki_sync_dlq_records 5
# TYPE ki_sync_dlq_waiting_records gauge
ki_sync_dlq_waiting_records 2
# TYPE ki_sync_dlq_oldest_waiting_seconds gauge
ki_sync_dlq_oldest_waiting_seconds 61.5
# TYPE ki_sync_replication_slot_retained_bytes gauge
ki_sync_replication_slot_retained_bytes 4096
# TYPE ki_sync_rows_vector_pending gauge
ki_sync_rows_vector_pending 12
# TYPE ki_sync_oldest_vector_pending_seconds gauge
ki_sync_oldest_vector_pending_seconds 3.25
"""


def test_quantile_interpolates_within_a_bucket_like_prometheus() -> None:
    buckets = {0.5: 10.0, 1.0: 90.0, math.inf: 100.0}
    assert quantile(buckets, 0.5) == pytest.approx(0.5 + 0.5 * (50 - 10) / 80)
    assert quantile(buckets, 0.05) == pytest.approx(0.25)  # the first bucket starts at 0
    assert quantile(buckets, 0.99) == 1.0  # in +Inf: the highest finite bound
    assert quantile({0.5: 0.0, math.inf: 0.0}, 0.5) is None and quantile({}, 0.5) is None
    assert beyond(buckets, 0.99) and not beyond(buckets, 0.9) and not beyond({}, 0.99)


def test_minus_is_what_was_counted_between_readings_and_a_reset_starts_over() -> None:
    assert minus({1.0: 5.0, math.inf: 7.0}, {1.0: 2.0, math.inf: 3.0}) == {1.0: 3.0, math.inf: 4.0}
    assert minus({1.0: 1.0, math.inf: 1.0}, {1.0: 2.0, math.inf: 3.0}) == {1.0: 1.0, math.inf: 1.0}


def test_window_keeps_the_base_just_before_its_span() -> None:
    window = Window(60, started=0.0)
    assert window.add(Reading(10.0, requests=5)).at == 0.0  # the zero reading at start
    window.add(Reading(10.5, requests=6))  # under min_gap_s: not kept
    window.add(Reading(40.0, requests=9))
    assert window.add(Reading(65.0, requests=12)).at == 0.0  # the newest reading at or before the cutoff (5 s)
    assert window.add(Reading(75.0, requests=14)).at == 10.0
    assert window.add(Reading(100.0, requests=20)).at == 40.0
    assert len(window._readings) <= 4


def test_overview_counts_the_apis_work_not_the_dashboards_polling() -> None:
    api, content = parse_exposition(API), parse_exposition(CONTENT)
    base = Reading(0.0)
    reading = api_reading(api, {"content": content}, at=10.0)
    assert reading.requests == 30  # /v1/ops and /metrics are not counted
    out = overview(api, {"content": content, "access": "http://x/metrics: refused"}, reading, base, window_s=300)
    assert out["api"]["requests"] == 30 and out["api"]["requests_per_s"] == 3.0 and out["api"]["in_flight"] == 2
    assert out["api"]["latency_p99_s"] == pytest.approx(0.1 + 0.9 * (29.7 - 20) / 10, abs=1e-4)
    assert out["index"] == {"alias": "chunks", "targets": ["chunks--new"], "size_bytes": 123456, "rows": 789,
                            "error": None}  # fmt: skip
    lane = out["lanes"]["content"]
    assert lane["lag"] == 7 and lane["topics"] == [{"topic": "ki.public.documents", "lag": 7}]  # its own lane only
    assert lane["freshness_events"] == 100 and lane["freshness_p50_s"] == pytest.approx(0.75)
    assert lane["dlq_events"] == 2
    assert lane["paused"] == "index_read_only"  # the index refuses writes: the lane waits, it is not failing
    assert out["lanes"]["access"] == {"up": False, "error": "http://x/metrics: refused"}
    assert out["dlq_records"] == 5 and out["slot_retained_bytes"] == 4096
    assert out["dlq_waiting"] == {"records": 2, "oldest_s": 61.5}  # not replayed or dropped yet
    assert out["vectors_pending"] == {"rows": 12, "oldest_s": 3.25}
    # Every lane's process has the gauge; only the content lane's counts (the others' reads 0, and sorts first).
    idle = parse_exposition("# TYPE ki_sync_rows_vector_pending gauge\nki_sync_rows_vector_pending 0\n")
    three = overview(api, {"access": idle, "content": content, "principals": idle}, reading, base, window_s=300)
    assert three["vectors_pending"] == {"rows": 12, "oldest_s": 3.25}


def test_overview_over_a_window_uses_only_what_happened_in_it() -> None:
    api, content = parse_exposition(API), parse_exposition(CONTENT)
    earlier = Reading(0.0, requests=10, latency={0.1: 10.0, 1.0: 10.0, math.inf: 10.0},
                      freshness={"content": {0.5: 10.0, 1.0: 10.0, math.inf: 10.0}})  # fmt: skip
    reading = api_reading(api, {"content": content}, at=20.0)
    out = overview(api, {"content": content}, reading, earlier, window_s=300)
    assert out["api"]["requests"] == 20 and out["api"]["requests_per_s"] == 1.0
    assert out["api"]["latency_p50_s"] == pytest.approx(0.1)  # 10 of the 20 new ones took at most 0.1 s
    assert out["api"]["latency_p99_s"] == pytest.approx(0.1 + 0.9 * (19.8 - 10) / 10, abs=1e-4)
    assert out["lanes"]["content"]["freshness_events"] == 90
    assert out["lanes"]["content"]["freshness_p50_s"] == pytest.approx(0.5 + 0.5 * 45 / 80, abs=1e-4)
    # Without any lane: no DLQ or slot figure rather than a made-up zero.
    none = overview(api, {"content": "down"}, reading, earlier, window_s=300)
    assert none["dlq_records"] is None and none["slot_retained_bytes"] is None and none["vectors_pending"] is None
    assert none["dlq_waiting"] is None
