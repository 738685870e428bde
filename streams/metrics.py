"""Prometheus metrics of the sync worker (served at the worker's /metrics)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("ki_sync_events_total", "CDC events consumed", ["table", "op"])
DLQ_EVENTS = Counter("ki_sync_dlq_events_total", "events sent to the dead-letter topic", ["table"])
SYNC_RETRIES = Counter("ki_sync_retries_total", "batches retried after a transient failure")
VERSIONS = Counter("ki_sync_versions_projected_total", "versions whose rows were rebuilt")
ACCESS_VERSIONS = Counter("ki_sync_access_versions_total", "versions whose projection was re-checked")
ROWS_WRITTEN = Counter("ki_sync_rows_written_total", "index rows written")
ROWS_EMBEDDED = Counter("ki_sync_rows_embedded_total", "index rows whose text was embedded")
ACCESS_ROWS = Counter("ki_sync_access_rows_updated_total", "rows whose principal projection was rewritten")
BULK_SECONDS = Histogram("ki_sync_stage_seconds", "time per sync stage and batch", ["stage"])
FRESHNESS = Histogram(
    "ki_sync_freshness_seconds",
    "commit in PostgreSQL (source.ts_ms) to write acknowledged by OpenSearch",
    buckets=(0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300),
)
CONSUMER_LAG = Gauge("ki_sync_consumer_lag", "records behind the log end", ["topic", "partition"])


def record_sync(stats: Any) -> None:
    VERSIONS.inc(stats.versions_projected)
    ACCESS_VERSIONS.inc(stats.access_versions)
    ROWS_WRITTEN.inc(stats.rows_written)
    ROWS_EMBEDDED.inc(stats.rows_embedded)
    ACCESS_ROWS.inc(stats.access_rows_updated)
    for stage, seconds in stats.seconds.items():
        BULK_SECONDS.labels(stage=stage).observe(seconds)


def update_lag(app: Any) -> None:
    """Consumer lag per partition from the consumer's own view (highwater - committed position)."""
    consumer = app.consumer
    try:
        assignment = consumer.assignment()
    except Exception:  # not started yet
        return
    for tp in assignment:
        highwater = consumer.highwater(tp)
        position = consumer._committed_offset.get(tp) if hasattr(consumer, "_committed_offset") else None
        if highwater is None:
            continue
        CONSUMER_LAG.labels(topic=tp.topic, partition=str(tp.partition)).set(max(0, highwater - (position or 0)))
