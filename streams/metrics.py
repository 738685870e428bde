"""Prometheus metrics of the sync worker (served at the worker's /metrics)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from ki.clients import make_engine
from ki.settings import Settings
from streams import status
from streams.dlq import DlqTail, waiting_backlog

log = logging.getLogger(__name__)

EVENTS = Counter("ki_sync_events_total", "CDC events consumed", ["lane", "table", "op"])
DLQ_EVENTS = Counter("ki_sync_dlq_events_total", "events sent to the dead-letter topic", ["lane", "table"])
SYNC_RETRIES = Counter("ki_sync_retries_total", "batches retried after a transient failure")
VERSIONS = Counter("ki_sync_versions_projected_total", "versions whose rows were rebuilt")
ACCESS_VERSIONS = Counter("ki_sync_access_versions_total", "versions whose projection was re-checked")
ROWS_WRITTEN = Counter("ki_sync_rows_written_total", "index rows written")
ROWS_EMBEDDED = Counter("ki_sync_rows_embedded_total", "index rows whose text was embedded")
ROWS_REUSED = Counter(
    "ki_sync_rows_vector_reused_total", "index rows given the stored vector of an identical embedded string"
)
ROWS_TEXT_FIRST = Counter(
    "ki_sync_rows_text_first_total", "index rows sent without their vector (searchable by words at once)"
)
ACCESS_ROWS = Counter("ki_sync_access_rows_updated_total", "rows whose principal projection was rewritten")
BULK_SECONDS = Histogram("ki_sync_stage_seconds", "time per sync stage and batch", ["stage"])
FRESHNESS = Histogram(
    "ki_sync_freshness_seconds",
    "commit in PostgreSQL (source.ts_ms) to write acknowledged by OpenSearch",
    ["lane"],
    buckets=(0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300),
)
CONSUMER_LAG = Gauge(
    "ki_sync_consumer_lag", "records behind the log end, per lane's consumer group", ["lane", "topic", "partition"]
)
DLQ_RECORDS = Gauge("ki_sync_dlq_records", "records in the dead-letter topic (every lane's, since it was created)")
DLQ_WAITING = Gauge("ki_sync_dlq_waiting_records", "dead letters no `ki dlq replay` or `ki dlq drop` has handled yet")
DLQ_OLDEST_WAITING = Gauge(
    "ki_sync_dlq_oldest_waiting_seconds", "how long the oldest dead letter not handled yet has waited (0: none)"
)
VECTORS_PENDING = Gauge("ki_sync_rows_vector_pending", "index rows written text first that wait for their vector")
OLDEST_PENDING = Gauge(
    "ki_sync_oldest_vector_pending_seconds", "how long the oldest row waiting for its vector has waited (0: none)"
)
SECONDS_IDLE = Gauge(
    "ki_sync_lane_seconds_idle", "since the lane last received or resolved a batch (streams.liveness)", ["lane"]
)
LANE_STALLED = Gauge(
    "ki_sync_lane_stalled", "1: the lane has lag and made no progress for streams.stall_after_s", ["lane"]
)
LANE_PAUSED = Gauge(
    "ki_sync_lane_paused",
    "1: the lane paused, consuming and committing nothing, until the cause goes (index_read_only: a write block"
    " such as a full disk's flood stage)",
    ["lane", "reason"],
)
THROTTLED = Counter(
    "ki_sync_throttled_total",
    "batches retried because OpenSearch pushed back (bulk items still answered 429/5xx after the writer's retries)",
    ["lane"],
)
SLOT_RETAINED = Gauge("ki_sync_replication_slot_retained_bytes", "WAL retained by the Debezium replication slot")
UNDER_REPLICATED = Gauge(
    "ki_kafka_under_replicated_partitions", "partitions of the sidecar's topics with fewer in-sync than replicas"
)


def record_sync(stats: Any) -> None:
    VERSIONS.inc(stats.versions_projected)
    ACCESS_VERSIONS.inc(stats.access_versions)
    ROWS_WRITTEN.inc(stats.rows_written)
    ROWS_EMBEDDED.inc(stats.rows_embedded)
    ROWS_REUSED.inc(stats.rows_reused)
    ROWS_TEXT_FIRST.inc(stats.rows_text_first)
    ACCESS_ROWS.inc(stats.access_rows_updated)
    for stage, seconds in stats.seconds.items():
        BULK_SECONDS.labels(stage=stage).observe(seconds)


class _LagReader:
    """What a scrape needs to read lag, kept between scrapes: the broker clients and a one-connection
    PostgreSQL pool. Dropped after a failure, so the next scrape starts with fresh connections."""

    def __init__(self, settings: Settings) -> None:
        self.probe = status.LagProbe(settings)
        self.engine = make_engine(settings, pool_size=1, max_overflow=0)
        self.dlq = DlqTail(settings)

    def close(self) -> None:
        self.probe.close()
        self.dlq.close()
        self.engine.dispose()


_reader: _LagReader | None = None
_reader_lock = threading.Lock()


#: Each lane's total lag at the last reading (absent: never read): what the lane's liveness verdict reads.
LANE_LAG: dict[str, int] = {}


def update_lag(settings: Settings) -> None:
    """Consumer lag per lane and partition as the broker sees it (log end - committed offset of the lane's
    group), the records in the dead-letter topic and those waiting to be handled, under-replicated partitions,
    and the WAL the replication slot retains. Blocking: call it from a thread. Failures leave the old values; a
    scrape that finds another one reading skips the reading (its values are as fresh)."""
    global _reader
    if not _reader_lock.acquire(blocking=False):
        return
    try:
        reader = _reader = _reader or _LagReader(settings)
        for lane in reader.probe.read_all():
            for p in lane.partitions:
                CONSUMER_LAG.labels(lane=lane.lane, topic=p.topic, partition=str(p.partition)).set(p.lag)
            LANE_LAG[lane.lane] = lane.total
        dlq = reader.probe.topic_records(settings.streams.dlq_topic)
        if dlq is not None:
            DLQ_RECORDS.set(dlq)
        _update_dlq_waiting(reader)
        UNDER_REPLICATED.set(reader.probe.under_replicated())
        retained = status.slot_retained_bytes(settings, reader.engine)
        if retained is not None:
            SLOT_RETAINED.set(retained)
    except Exception as exc:  # a scrape must not fail because Kafka or PostgreSQL is briefly away
        log.warning("metrics: lag not updated: %s", exc)
        if _reader is not None:
            with contextlib.suppress(Exception):  # closing a broken client is best effort
                _reader.close()
            _reader = None
    finally:
        _reader_lock.release()


def _update_dlq_waiting(reader: _LagReader) -> None:
    """The dead letters waiting for `ki dlq` (the topic read since the last scrape, the handled marks from
    PostgreSQL); a failure here leaves these two figures as they were and the others go on."""
    try:
        waiting = waiting_backlog(reader.dlq, reader.engine, time.time())
    except Exception as exc:  # e.g. a schema before migration 0012, or no read access to the DLQ topic
        log.warning("metrics: dead letters waiting not updated: %s", exc)
        return
    DLQ_WAITING.set(waiting.count)
    DLQ_OLDEST_WAITING.set(waiting.oldest_s)
