"""The invalidation feed's decisions without Kafka (search.access.invalidation): when the caches may be
used, what each record does to the subscribers, and that a gap empties them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from ki.settings import Settings
from projections.cdc import topic_name
from search.access.invalidation import AT_END, InvalidationFeed

SETTINGS = Settings()
PREFIX = SETTINGS.kafka.topic_prefix
GRANTS = topic_name(PREFIX, "grants")
HEARTBEAT = topic_name(PREFIX, "debezium_heartbeat")
NOW = 1_800_000_000.0


class Subscriber:
    def __init__(self) -> None:
        self.changes: list[str] = []
        self.cleared = 0

    def on_change(self, event: Any) -> None:
        self.changes.append(event.table)

    def clear(self) -> None:
        self.cleared += 1


class Eof:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF


class Record:
    """What the feed reads of a consumed record (confluent_kafka.Message's accessors)."""

    def __init__(self, topic: str, value: bytes | None = None, *, eof: bool = False, partition: int = 0) -> None:
        self._topic, self._value, self._eof, self._partition = topic, value, eof, partition

    def error(self) -> Eof | None:
        return Eof() if self._eof else None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def key(self) -> bytes:
        return b'{"id": 1}'

    def value(self) -> bytes | None:
        return self._value


def change(committed_s: float, after: dict[str, Any] | None = None) -> bytes:
    source = {"ts_ms": int(committed_s * 1000), "lsn": 1, "snapshot": "false"}
    return json.dumps({"op": "c", "before": None, "after": after or {"id": 1}, "source": source}).encode()


@pytest.fixture
def clock() -> list[float]:
    return [NOW]


@pytest.fixture
def feed(clock: list[float]) -> Iterator[tuple[InvalidationFeed, Subscriber, Subscriber]]:
    scopes, names = Subscriber(), Subscriber()
    feed = InvalidationFeed(SETTINGS, [scopes, names], clock=lambda: clock[0])
    alive = threading.Event()
    feed._thread = threading.Thread(target=alive.wait, daemon=True)  # the polling thread, alive
    feed._thread.start()
    feed._complete_until = {(t, 0): 0.0 for t in (*feed.scope_topics, HEARTBEAT)}  # as `_assign` leaves it
    yield feed, scopes, names
    alive.set()


def caught_up(feed: InvalidationFeed, heartbeat_s: float) -> None:
    feed._handle([Record(HEARTBEAT, change(heartbeat_s))])
    feed._handle([Record(t, eof=True) for t in (*feed.scope_topics, HEARTBEAT)])


def test_nothing_is_trusted_before_every_partition_reached_its_end(feed: Any) -> None:
    f, _, _ = feed
    assert not f.health().usable
    f._handle([Record(GRANTS, eof=True)])
    assert not f.health().usable  # the other partitions are not known complete yet
    caught_up(f, NOW)
    health = f.health()
    assert health.usable and health.reason == "current" and health.lag_s == 0.0


def test_every_subscriber_sees_each_change_and_the_heartbeat_is_not_one(feed: Any) -> None:
    f, scopes, names = feed
    caught_up(f, NOW)
    f._handle([Record(GRANTS, change(NOW, {"id": 1, "principal": "user:anna"}))])
    assert scopes.changes == names.changes == ["grants"]
    assert f._complete_until[(GRANTS, 0)] == NOW  # complete up to the event's commit


def test_an_undecodable_record_drops_everything(feed: Any) -> None:
    f, scopes, names = feed
    f._handle([Record(GRANTS, b"{not json")])
    assert scopes.cleared == names.cleared == 1 and scopes.changes == []


def test_a_silent_debezium_makes_the_caches_unusable_and_empties_them(feed: Any, clock: list[float]) -> None:
    f, scopes, names = feed
    caught_up(f, NOW)
    assert f.health().usable
    clock[0] = NOW + f.heartbeat_bound_s + 1
    f._handle([Record(t, eof=True) for t in (*f.scope_topics, HEARTBEAT)])  # polling, at the end, no heartbeat
    health = f.health()
    assert not health.usable and "Debezium is not known to be current" in health.reason
    assert scopes.cleared == names.cleared == 1  # entries from before the gap are never trusted again


def test_a_partition_behind_by_more_than_the_bound_is_not_current(feed: Any, clock: list[float]) -> None:
    f, _, _ = feed
    caught_up(f, NOW)
    old = NOW - f.max_lag_s - 5
    f._handle([Record(GRANTS, change(old)), Record(HEARTBEAT, change(NOW))])
    health = f.health()
    assert not health.usable and "behind" in health.reason and health.lag_s is not None
    assert f._complete_until[(GRANTS, 0)] == old and f._complete_until[(HEARTBEAT, 0)] == NOW
    f._handle([Record(GRANTS, eof=True)])
    assert f._complete_until[(GRANTS, 0)] == AT_END and f.health().usable


def test_a_feed_that_stopped_polling_is_not_current(feed: Any, clock: list[float]) -> None:
    f, _, _ = feed
    caught_up(f, NOW)
    clock[0] = NOW + f.max_lag_s + 1
    assert f.health().reason == "the invalidation feed is not polling"
