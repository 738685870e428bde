"""Where a consumer group stands in its topics: each partition's committed offset against its log end. Read by
`ki sync status` and the lanes' lag metrics (`streams.status`) and by the search API's wait for a writer's
consistency token (`search.consistency`). The admin client's failures come out as `ki.errors` (`kafka_errors`)."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ki.clients import kafka_errors


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int  # -1: the group has committed nothing for this partition
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - max(self.committed, 0))

    @property
    def behind(self) -> bool:
        """Events to go, or a partition with events the group has never committed (not even 0)."""
        return self.lag > 0 or (self.committed < 0 and self.end > 0)


def topic_partitions(admin: AdminClient, topics: list[str], timeout_s: float = 10) -> list[TopicPartition]:
    """Every partition of the topics that exist, as the broker has them."""
    with kafka_errors():
        metadata = admin.list_topics(timeout=timeout_s)
    return [TopicPartition(t, p) for t in topics if t in metadata.topics for p in metadata.topics[t].partitions]


def committed_offsets(admin: AdminClient, group: str, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """The group's committed offset per partition (-1: none)."""
    if not partitions:
        return {}
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    with kafka_errors():
        listed = admin.list_consumer_group_offsets(request)[group].result().topic_partitions
    return {(tp.topic, tp.partition): tp.offset for tp in listed}


def log_ends(admin: AdminClient, partitions: list[TopicPartition], timeout_s: float = 10) -> dict[tuple[str, int], int]:
    """Each partition's log end offset (the next offset to be written), in one request (a consumer's watermark
    call per partition costs a round trip each: seconds for a few dozen partitions)."""
    if not partitions:
        return {}
    asked = {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in partitions}
    with kafka_errors():
        answered = admin.list_offsets(asked, request_timeout=timeout_s)
        return {(tp.topic, tp.partition): int(future.result().offset) for tp, future in answered.items()}


def group_lag(admin: AdminClient, group: str, topics: list[str]) -> list[PartitionLag]:
    """Any group over any topics (only the topics that exist)."""
    partitions = topic_partitions(admin, topics)
    committed = committed_offsets(admin, group, partitions)
    ends = log_ends(admin, partitions)
    return [PartitionLag(t, p, committed.get((t, p), -1), ends[(t, p)]) for t, p in ends]
