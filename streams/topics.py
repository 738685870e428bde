"""Kafka topic names and their creation.

CDC topics are created up front, compacted and partitioned per settings, so neither the worker nor an
empty table can leave a topic to be auto-created with the wrong cleanup policy.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from ki.clients import kafka_error, make_kafka_admin
from ki.db.models import CAPTURED_TABLES
from ki.errors import AlreadyExists
from ki.settings import Settings
from projections.cdc import message_topic, topic_name
from projections.lanes import LANES, Lane, consumer_group, lane_topics

__all__ = ["LANES", "Lane", "cdc_topics", "consumer_group", "ensure_topics", "lane_topics", "lane_web_port"]


def cdc_topics(settings: Settings) -> list[str]:
    """The captured tables' topics and the logical-decoding messages' (the truncate markers)."""
    prefix = settings.kafka.topic_prefix
    return [*(topic_name(prefix, table) for table in CAPTURED_TABLES), message_topic(prefix)]


def lane_web_port(settings: Settings, lane: Lane) -> int:
    return settings.streams.lane_web_port(lane)


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create missing CDC topics (compacted) and the DLQ topic; return the names created."""
    admin = make_kafka_admin(settings)
    existing = set(admin.list_topics(timeout=timeout).topics)
    replicas = settings.kafka.replication_factor
    in_sync = {"min.insync.replicas": str(settings.kafka.min_insync_replicas)}
    wanted = [
        NewTopic(
            name,
            num_partitions=settings.kafka.partitions,
            replication_factor=replicas,
            config={"cleanup.policy": "compact", **in_sync},
        )
        for name in cdc_topics(settings)
        if name not in existing
    ]
    if settings.streams.dlq_topic not in existing:
        wanted.append(
            NewTopic(settings.streams.dlq_topic, num_partitions=1, replication_factor=replicas, config=in_sync)
        )
    created: list[str] = []
    if not wanted:
        return created
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            error = kafka_error(exc)
            if not isinstance(error, AlreadyExists):  # a concurrent creator (Debezium) is fine
                raise error from exc
    return created
