"""`ki sync status` and consumer lag: how far behind the sync is, end to end, per lane."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupState, TopicPartition
from sqlalchemy import Engine, text

from ki.clients import make_engine, make_kafka_admin, make_kafka_consumer, make_sync_client
from ki.kafka_offsets import PartitionLag, group_lag
from ki.settings import Settings
from streams.topics import LANES, Lane, consumer_group, lane_topics, lane_web_port
from streams.writer import pending_vectors_of, pending_vectors_query


@dataclass(frozen=True)
class LaneLag:
    """One lane's consumer group against the log end of that lane's topics."""

    lane: Lane
    group: str
    known: bool  # the broker knows the group (a worker has joined it, now or before)
    members: int  # consumers in the group now: 0 when no worker runs this lane
    partitions: list[PartitionLag]

    @property
    def running(self) -> bool:
        return self.members > 0

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def lagging(self) -> list[PartitionLag]:
        return [p for p in self.partitions if p.behind]

    @property
    def caught_up(self) -> bool:
        return bool(self.partitions) and not self.lagging


class LagProbe:
    """Reads consumer lag per partition: log end (a consumer's watermarks) minus a group's committed
    offset (the admin API). The two broker clients stay open between reads, so a worker answering a
    `/metrics` scrape every few seconds does not connect anew each time. Not thread-safe: one reader."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._admin = make_kafka_admin(settings)
        self._consumer = make_kafka_consumer(settings, "ki-status-probe")

    def read(self, lane: Lane) -> LaneLag:
        """The lane's consumer group over the lane's topics (`streams.topics`)."""
        group = consumer_group(self.settings, lane)
        described = self._admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        known = described.state not in (ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN)
        partitions = self.read_group(group, lane_topics(self.settings, lane))
        return LaneLag(lane, group, known, len(described.members), partitions)

    def read_all(self) -> list[LaneLag]:
        return [self.read(lane) for lane in LANES]

    def read_group(self, group: str, topics: list[str]) -> list[PartitionLag]:
        """Any group over any topics (only the topics that exist; their partitions as the broker has them)."""
        return group_lag(self._admin, group, topics)

    def topic_records(self, topic: str) -> int | None:
        """Records a topic holds now (log end - log start over its partitions); None if it does not exist."""
        metadata = self._admin.list_topics(timeout=10)
        if topic not in metadata.topics:
            return None
        total = 0
        for p in metadata.topics[topic].partitions:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += max(0, high - low)
        return total

    def brokers(self) -> list[int]:
        """The ids of the brokers in the cluster's metadata."""
        return sorted(self._admin.list_topics(timeout=10).brokers)

    def under_replicated(self) -> int:
        """Partitions of the sidecar's topics (the topic prefix's: CDC, DLQ, Connect's own) with fewer in-sync
        replicas than replicas: a broker is down or behind, and one more loss may stop writes or lose them."""
        metadata = self._admin.list_topics(timeout=10)
        prefix = self.settings.kafka.topic_prefix
        return sum(
            len(p.isrs) < len(p.replicas)
            for name, topic in metadata.topics.items()
            if name.startswith(prefix) or name == self.settings.streams.dlq_topic
            for p in topic.partitions.values()
        )

    def close(self) -> None:
        self._consumer.close()


def lane_lags(settings: Settings) -> list[LaneLag]:
    """One reading of every lane, with clients opened and closed for it (CLI and one-off callers)."""
    probe = LagProbe(settings)
    try:
        return probe.read_all()
    finally:
        probe.close()


def consumer_lag(settings: Settings, lane: Lane) -> list[PartitionLag]:
    """One lane's partitions, one-shot."""
    probe = LagProbe(settings)
    try:
        return probe.read(lane).partitions
    finally:
        probe.close()


def synced(lanes: list[LaneLag]) -> bool:
    """Every lane a worker runs now has committed every partition to its end, and some lane runs (before
    that, nothing has started). A worker starts its lanes together, so a lane without members while
    another one is caught up is one this deployment does not run (a group left by an earlier worker is
    no reason to wait)."""
    running = [lane for lane in lanes if lane.running]
    return bool(running) and all(lane.caught_up for lane in running)


def lag_summary(lanes: list[LaneLag]) -> str:
    """`Kafka lag: content 120, access 0` (events behind, per lane) for a progress line."""
    return "Kafka lag: " + ", ".join(
        f"{lane.lane} {lane.total}" + ("" if lane.running else " (no worker)") for lane in lanes
    )


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


#: How long `ki sync status` waits for a lane worker's /healthz.
HEALTH_TIMEOUT_S = 3.0


def describe_health(answer: dict[str, Any] | None) -> str:
    """One line on a lane worker from its /healthz answer (`streams.liveness`; None: no answer on this machine)."""
    if answer is None:
        return "no answer from a worker on this machine"
    status = answer.get("status")
    idle = answer.get("seconds_idle")
    if status == "paused":
        return f"paused ({answer.get('paused')}): it resumes by itself once the index takes writes again"
    if status == "stalled" and answer.get("recreated_topics"):
        topics = ", ".join(answer["recreated_topics"])
        return f"stalled: its topics were created again under it ({topics}; `ki sync run` restarts it)"
    if status == "stalled":
        return f"stalled: lag and no progress for {idle} s (`ki sync run` restarts it)"
    if status == "ok":
        return "ok"
    return f"unexpected answer {json.dumps(answer)[:200]}"


def lane_health(settings: Settings, lane: Lane) -> dict[str, Any] | None:
    """The lane worker's /healthz answer (a 503's body too), or None when nothing answers."""
    url = f"http://127.0.0.1:{lane_web_port(settings, lane)}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as answer:
            return dict(json.loads(answer.read()))
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(ValueError, TypeError, OSError):
            return dict(json.loads(exc.read()))
        return {"status": f"HTTP {exc.code}"}
    except (OSError, ValueError, TypeError):
        return None


def print_status(settings: Settings) -> int:
    for lane in lane_lags(settings):
        joined = f"{lane.members} member(s)" if lane.known else "unknown to the broker: no worker has joined it"
        print(
            f"{lane.lane} lane, consumer group {lane.group} ({joined}): total lag {lane.total} "
            f"over {len(lane.partitions)} partitions, {len(lane.lagging)} behind"
        )
        for p in lane.lagging:
            print(f"  {p.topic}[{p.partition}]: committed {p.committed}, end {p.end}, lag {p.lag}")
        print(f"  worker: {describe_health(lane_health(settings, lane.lane))}")
    retained = slot_retained_bytes(settings)
    print(
        f"replication slot {settings.connect.slot_name}: "
        + ("missing" if retained is None else f"{retained} bytes of WAL retained")
    )
    client = make_sync_client(settings, timeout_s=settings.opensearch.timeout_s)
    alias = settings.retrieval.index_name
    if client.indices.exists_alias(index=alias, name=alias):
        physical = ", ".join(client.indices.get_alias(index=alias, name=alias))
        count = client.count(index=alias)["count"]
        waiting, oldest_s = pending_vectors_of(client.search(index=alias, body=pending_vectors_query()))
        pending = f", {waiting} waiting for their vector (oldest {oldest_s:.0f} s)" if waiting else ""
        print(f"index {alias} -> {physical}: {count} rows{pending}")
    else:
        print(f"index {alias}: missing (start the worker or run `ki backfill`)")
    return 0 if retained is not None else 1
