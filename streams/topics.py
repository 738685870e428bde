"""Kafka topic names and their creation.

CDC topics are created up front, compacted and partitioned per settings, so neither the worker nor an
empty table can leave a topic to be auto-created with the wrong cleanup policy.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from ki.clients import kafka_error, make_kafka_admin, make_kafka_consumer
from ki.db.models import CAPTURED_TABLES
from ki.errors import AlreadyExists
from ki.settings import Settings
from projections.cdc import message_topic, topic_name
from projections.lanes import LANES, Lane, consumer_group, lane_topics

log = logging.getLogger(__name__)

__all__ = [
    "LANES",
    "Lane",
    "cdc_topics",
    "compact_cdc_topics",
    "consumer_group",
    "ensure_topics",
    "lane_topics",
    "lane_web_port",
    "not_compacted",
    "start_new_partitions_at_end",
    "topic_ids",
]


def cdc_topics(settings: Settings) -> list[str]:
    """The captured tables' topics and the logical-decoding messages' (the truncate markers)."""
    prefix = settings.kafka.topic_prefix
    return [*(topic_name(prefix, table) for table in CAPTURED_TABLES), message_topic(prefix)]


def lane_web_port(settings: Settings, lane: Lane) -> int:
    return settings.streams.lane_web_port(lane)


def start_new_partitions_at_end(settings: Settings, lane: Lane, timeout: float = 30.0) -> int:
    """Commit the log end for each partition of the lane's topics its group holds no offset for; returns how many.

    For the principals lane, a fast path: what was written before it first ran (an upgrade's years of grants)
    is the access lane's, which reads it anyway. A consumer-side "latest" would not do: a group without
    committed offsets counts its whole log as lag (status, liveness). Partitions of a group already consuming
    have offsets, so a running group is never moved.

    Never fatal: when it cannot (topics just created again, whose leaders are not elected yet; a restarted
    lane whose predecessor is still a member, so the group refuses a commit from outside), the lane reads those
    partitions from their start instead, which is slower, never wrong."""
    consumer = make_kafka_consumer(settings, consumer_group(settings, lane), **{"enable.auto.commit": False})
    try:
        partitions = []
        for topic in lane_topics(settings, lane):
            metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
            partitions += [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
        unset = [tp for tp in consumer.committed(partitions, timeout=timeout) if tp.offset < 0]
        ends = [TopicPartition(tp.topic, tp.partition, consumer.get_watermark_offsets(tp, timeout=timeout)[1])
                for tp in unset]  # fmt: skip
        if ends:
            consumer.commit(offsets=ends, asynchronous=False)
        return len(ends)
    except (KafkaException, KeyError) as exc:
        log.warning("%s lane: new partitions not positioned at their end (%s); it reads them from their start",
                    lane, kafka_error(exc) if isinstance(exc, KafkaException) else f"topic {exc} missing")  # fmt: skip
        return 0
    finally:
        consumer.close()


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


def not_compacted(policies: dict[str, str]) -> list[str]:
    """The topics (name -> `cleanup.policy`) a broker's auto-creation left deleting old records: a CDC topic
    that is not compacted loses rows once its retention passes, so it can no longer rebuild the index."""
    return sorted(name for name, policy in policies.items() if "compact" not in policy.split(","))


def compact_cdc_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Set `cleanup.policy=compact` on every CDC topic that is not (one the broker auto-created after the
    topics were deleted, when Debezium or a consumer asked for it first); return the names changed."""
    admin = make_kafka_admin(settings)
    existing = set(admin.list_topics(timeout=timeout).topics)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in cdc_topics(settings) if name in existing]
    if not resources:
        return []
    policies: dict[str, str] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
        entry = future.result().get("cleanup.policy")
        policies[resource.name] = entry.value if entry is not None and entry.value else "delete"
    changed = not_compacted(policies)
    if not changed:
        return []
    compact = [ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)]
    altered = [ConfigResource(ResourceType.TOPIC, name, incremental_configs=compact) for name in changed]
    for _resource, future in admin.incremental_alter_configs(altered, request_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            raise kafka_error(exc) from exc
    return changed


def topic_ids(admin: AdminClient, topics: list[str], timeout: float = 10.0) -> dict[str, str]:
    """Each existing topic's id (a new one each time a topic is created; missing topics are left out)."""
    existing = [t for t in topics if t in admin.list_topics(timeout=timeout).topics]
    if not existing:
        return {}
    described = admin.describe_topics(TopicCollection(existing), request_timeout=timeout)
    ids: dict[str, str] = {}
    for name, future in described.items():
        try:
            ids[name] = str(future.result().topic_id)
        except KafkaException:
            continue  # deleted between the two requests
    return ids
