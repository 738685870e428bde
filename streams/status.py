"""`ki sync status`: how far behind the sync is, end to end."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from sqlalchemy import Engine, text

from ki.clients import make_engine, make_kafka_admin, make_kafka_consumer, make_sync_client
from ki.settings import Settings
from streams.topics import Lane, consumer_group, lane_topics


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - max(self.committed, 0))


class LagProbe:
    """Reads consumer lag per partition: log end (a consumer's watermarks) minus the group's committed
    offset (the admin API). The two broker clients stay open between reads, so a worker answering a
    `/metrics` scrape every few seconds does not connect anew each time. Not thread-safe: one reader."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._admin = make_kafka_admin(settings)
        self._consumer = make_kafka_consumer(settings, "ki-status-probe")

    def read(self, lane: Lane = "content") -> list[PartitionLag]:
        group = consumer_group(self.settings, lane)
        metadata = self._admin.list_topics(timeout=10)
        partitions = [
            TopicPartition(topic, p)
            for topic in lane_topics(self.settings, lane)
            if topic in metadata.topics
            for p in metadata.topics[topic].partitions
        ]
        if not partitions:
            return []
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in self._admin.list_consumer_group_offsets(request)[group].result().topic_partitions
        }
        out = []
        for tp in partitions:
            _low, high = self._consumer.get_watermark_offsets(tp, timeout=10)
            out.append(PartitionLag(tp.topic, tp.partition, committed.get((tp.topic, tp.partition), -1), high))
        return out

    def close(self) -> None:
        self._consumer.close()


def consumer_lag(settings: Settings, lane: Lane = "content") -> list[PartitionLag]:
    """One reading of one lane's group, with clients opened and closed for it (CLI and one-off callers)."""
    probe = LagProbe(settings)
    try:
        return probe.read(lane)
    finally:
        probe.close()


_SLOT_RETAINED_SQL = text(
    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots "
    "WHERE slot_name = :slot"
)


def slot_retained_bytes(settings: Settings, engine: Engine | None = None) -> int | None:
    """WAL the replication slot holds back; through `engine` if given (kept by the caller), else one-shot."""
    own = engine is None
    engine = engine or make_engine(settings, pooled=False)
    try:
        with engine.connect() as conn:
            return conn.execute(_SLOT_RETAINED_SQL, {"slot": settings.connect.slot_name}).scalar()
    finally:
        if own:
            engine.dispose()


def print_status(settings: Settings) -> int:
    lags = consumer_lag(settings)
    total = sum(p.lag for p in lags)
    for p in lags:
        if p.lag or p.committed < 0:
            print(f"  {p.topic}[{p.partition}]: committed {p.committed}, end {p.end}, lag {p.lag}")
    print(f"consumer group {settings.streams.app_id}: total lag {total} over {len(lags)} partitions")
    retained = slot_retained_bytes(settings)
    print(
        f"replication slot {settings.connect.slot_name}: "
        + ("missing" if retained is None else f"{retained} bytes of WAL retained")
    )
    client = make_sync_client(settings, timeout_s=settings.opensearch.timeout_s)
    alias = settings.retrieval.index_name
    if client.indices.exists_alias(name=alias):
        physical = ", ".join(client.indices.get_alias(name=alias))
        count = client.count(index=alias)["count"]
        print(f"index {alias} -> {physical}: {count} rows")
    else:
        print(f"index {alias}: missing (start the worker or run `ki backfill`)")
    return 0 if retained is not None else 1
