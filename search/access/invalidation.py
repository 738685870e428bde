"""The scope cache's invalidation feed: every API process follows the CDC topics of the tables that decide
access, itself, and drops what each change can affect (`search.access.scope_cache.invalidation_for`).

Why each process reads the topics directly (rather than the sync worker publishing invalidations): the
events are the same ones the worker consumes, a process needs nothing but Kafka to stay correct, and any
number of API processes on any number of machines each invalidate their own cache. The consumer has no
group and commits nothing: it is assigned every partition at its end when it starts, with an empty cache.
Every cache that depends on these tables subscribes to the feed (`ChangeSubscriber`: the scope cache, the
identity look-up cache of `search.names.cache`); each drops what an event can alter, and all are cleared
together when the feed cannot vouch for them.

Health, and why the cache is bypassed without it. The cache is used only while the feed is known to be
current, i.e. all of these hold:

* the feed thread is polling (its last poll is recent);
* every partition it follows is caught up: at its end at the last poll, or its last event was committed
  in PostgreSQL no longer than `api.caches.scope_max_feed_lag_s` ago (an upper bound of its lag);
* Debezium is alive: its heartbeat (a row it writes every `connect.heartbeat_interval_ms`) was committed
  within two heartbeat intervals plus that lag -- otherwise PostgreSQL may hold changes no topic carries yet.

When any fails (Kafka away, the connector stopped, a topic missing, the thread dead), `usable()` is false and
every request compiles its scope in SQL as if there were no cache, counted in
`ki_search_scope_cache_total{result="bypass"}`, and the cache is emptied, so entries from before the gap
are never trusted again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import OFFSET_END, KafkaError, Message, TopicPartition

from ki import table_roles
from ki.clients import make_kafka_consumer
from ki.settings import Settings
from ki.table_roles import HEARTBEAT_TABLE
from projections.cdc import ChangeEvent, PoisonEvent, decode, message_topic, topic_name

log = logging.getLogger(__name__)

#: The captured tables whose changes can alter a scope or a caller's resolution (those with a scope role in
#: `ki.table_roles`): the topics the feed follows.
SCOPE_TABLES: tuple[str, ...] = table_roles.SCOPE_TABLES
_POLL_S = 0.2
AT_END = float("inf")
_METADATA_RETRY_S = 2.0


class ChangeSubscriber(Protocol):
    """A cache fed by the feed: drops what one change can alter, or everything."""

    def on_change(self, event: ChangeEvent) -> None: ...

    def clear(self) -> None: ...


@dataclass(frozen=True)
class FeedHealth:
    usable: bool
    reason: str
    lag_s: float | None  # the bound on how far behind PostgreSQL the feed is (None: unknown)


class InvalidationFeed:
    """A daemon thread consuming the scope tables' topics and the heartbeat topic into its subscribers."""

    def __init__(
        self,
        settings: Settings,
        subscribers: Sequence[ChangeSubscriber],
        *,
        clock: Callable[[], float] = time.time,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        prefix = settings.kafka.topic_prefix
        self.settings, self.subscribers, self.clock = settings, tuple(subscribers), clock
        # And the logical-decoding messages: a truncate marker (`projections.cdc`) drops every cached scope.
        self.scope_topics = [*(topic_name(prefix, t) for t in SCOPE_TABLES), message_topic(prefix)]
        self.heartbeat_topic = topic_name(prefix, HEARTBEAT_TABLE)
        self.max_lag_s = settings.api.caches.scope_max_feed_lag_s
        self.heartbeat_bound_s = 2 * settings.connect.heartbeat_interval_ms / 1000 + self.max_lag_s
        self.on_event = on_event or (lambda table: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Per partition: AT_END (at its end at the last poll), or the commit time (wall clock) of its last
        # event, up to which it is known complete (0.0: nothing known yet).
        self._complete_until: dict[tuple[str, int], float] = {}
        self._last_poll: float | None = None
        self._heartbeat_ts: float | None = None
        self._was_usable = False
        self.events = 0
        self.error: str | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="scope-invalidation", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- health --------------------------------------------------------------------------------

    def health(self) -> FeedHealth:
        now = self.clock()
        with self._lock:
            complete, last_poll, beat = dict(self._complete_until), self._last_poll, self._heartbeat_ts
        alive = self._thread is not None and self._thread.is_alive()
        if not alive or last_poll is None or now - last_poll > self.max_lag_s:
            return self._verdict(False, self.error or "the invalidation feed is not polling", None)
        if not complete:
            return self._verdict(False, self.error or "the invalidation feed has no partitions yet", None)
        lag = max(0.0, max(now - last_poll if until == AT_END else now - until for until in complete.values()))
        if lag > self.max_lag_s:
            return self._verdict(False, f"the invalidation feed is {lag:.1f} s behind", lag)
        if beat is None or now - beat > self.heartbeat_bound_s:
            seen = "no heartbeat seen" if beat is None else f"last heartbeat {now - beat:.1f} s ago"
            return self._verdict(False, f"Debezium is not known to be current ({seen})", lag)
        return self._verdict(True, "current", lag)

    def _verdict(self, usable: bool, reason: str, lag: float | None) -> FeedHealth:
        if self._was_usable and not usable:
            # Entries from before a gap are never trusted again: events may have been missed.
            log.warning("scope cache bypassed: %s", reason)
            self._drop_everything()
        elif usable and not self._was_usable:
            log.info("scope cache in use: the invalidation feed is current")
        self._was_usable = usable
        return FeedHealth(usable, reason, lag)

    def _drop_everything(self) -> None:
        for subscriber in self.subscribers:
            subscriber.clear()

    # --- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except Exception as exc:  # noqa: BLE001 - the feed reports and restarts; the cache is bypassed
                self.error = f"invalidation feed failed: {type(exc).__name__}: {exc}"
                log.warning("%s; restarting it", self.error)
                with self._lock:
                    self._complete_until.clear()
                self._drop_everything()
                self._stop.wait(_METADATA_RETRY_S)

    def _consume(self) -> None:
        consumer = make_kafka_consumer(
            self.settings,
            f"{self.settings.streams.app_id}-api-scope-{uuid.uuid4().hex[:12]}",
            **{"enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "latest"},
        )
        try:
            partitions = self._assign(consumer)
            while partitions is None and not self._stop.wait(_METADATA_RETRY_S):
                partitions = self._assign(consumer)
            while not self._stop.is_set():
                messages = consumer.consume(num_messages=500, timeout=_POLL_S)
                self._handle(messages)
        finally:
            consumer.close()

    def _assign(self, consumer: object) -> list[TopicPartition] | None:
        """Every partition of the wanted topics, at their end; None while a topic does not exist yet."""
        metadata = consumer.list_topics(timeout=5)  # type: ignore[attr-defined]
        wanted = [*self.scope_topics, self.heartbeat_topic]
        missing = [t for t in wanted if t not in metadata.topics]
        with self._lock:
            self._last_poll = self.clock()
        if missing:
            self.error = f"topics not there yet: {', '.join(missing)}"
            return None
        partitions = [TopicPartition(t, p, OFFSET_END) for t in wanted for p in sorted(metadata.topics[t].partitions)]
        consumer.assign(partitions)  # type: ignore[attr-defined]
        with self._lock:  # nothing is known complete until its end is reported
            self._complete_until = {(tp.topic, tp.partition): 0.0 for tp in partitions}
        self.error = None
        return partitions

    def _handle(self, messages: list[Message]) -> None:
        now = self.clock()
        updates: dict[tuple[str, int], float] = {}
        for message in messages:
            error = message.error()
            key = (str(message.topic()), int(message.partition() or 0))
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    updates[key] = AT_END
                    continue
                raise RuntimeError(f"Kafka: {error.str()}")
            committed = self._apply(message)
            # Not at its end: complete up to its last event's commit (unknown: no better than before).
            updates[key] = committed if committed is not None else self._complete_until.get(key, 0.0)
        with self._lock:
            self._last_poll = now
            self._complete_until.update(updates)

    def _apply(self, message: Message) -> float | None:
        """Invalidate what the event changes; its commit time (seconds), if it carries one."""
        self.events += 1
        try:
            event = decode(str(message.topic()), message.key(), message.value(), known_tables=None)
        except PoisonEvent as exc:
            log.warning("undecodable event on %s (%s): dropping every cached scope", message.topic(), exc.reason)
            self._drop_everything()
            return None
        if not isinstance(event, ChangeEvent):
            return None
        committed = event.source.ts_ms / 1000 if event.source.ts_ms is not None else None
        if event.table == HEARTBEAT_TABLE:
            if committed is not None:
                with self._lock:
                    self._heartbeat_ts = max(self._heartbeat_ts or 0.0, committed)
            return committed
        for subscriber in self.subscribers:
            subscriber.on_change(event)
        self.on_event(event.table)
        return committed
