"""Writers that wait for their own writes: a consistency token.

A writer that wants its next search to reflect what it just committed reads `SELECT pg_current_wal_lsn()`
after its commit and passes the answer (`0/16B3748`) as the request's `consistency_token`. The request then
waits, at most `api.consistency.max_wait_s`, until the access lane -- which writes the keyword rows and the
principal projection -- has applied every change committed up to that position, and is answered with
`consistency: {"consistent": true, ...}`; past the bound it is answered `stale` (412: the caller's precondition
does not hold yet; retry), never silently older.

How "applied up to the token" is known, without trusting clocks or per-partition LSN order:
1. Debezium writes its heartbeat row (`debezium_heartbeat`) every `connect.heartbeat_interval_ms` and streams
   it like any change. A heartbeat whose change LSN is at or past the token (the WAL position read after the
   writer's commit, where the next record starts) was written after that commit,
   so Debezium (which emits transactions in commit order) had already handed the writer's changes to Kafka.
2. The lanes' topics' log ends, read after that heartbeat was seen, therefore cover those changes.
3. Once the lane's consumer group has committed up to those ends, every one of them is applied: a lane
   commits an offset only after the index acknowledged every write it carries (`streams.checkpoint`).
4. Acknowledged is not yet searchable (the index publishes writes at its periodic refresh), so the index is
   refreshed once then.
The heartbeat's LSN is then remembered as proven, so any later token below it is answered at once. The
content lane (vectors) is looked at in the same reading but never waited for: an answer says whether the
vectors are `current` too or still `pending` (the keyword rows are there either way).

Nothing here depends on the caller: the wait is decided by the token and the lanes only, so it cannot tell
one caller anything about rows they may not see. The index's position itself is never shown to callers (a
global write counter would tell every caller how busy the database is). A request with a token also skips
the process's scope and name caches (`reading_fresh`), so a grant committed before the token counts.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from opensearchpy import AsyncOpenSearch

from ki.clients import kafka_errors, make_kafka_admin, make_kafka_consumer, opensearch_errors
from ki.errors import RequestInvalid, TransientError
from ki.kafka_offsets import committed_offsets, log_ends, topic_partitions
from ki.settings import Settings
from ki.table_roles import HEARTBEAT_TABLE
from projections.cdc import ChangeEvent, PoisonEvent, decode, topic_name
from projections.lanes import Lane, consumer_group, lane_topics

_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
TOKEN_FIELD = "consistency_token"

Offsets = Mapping[tuple[str, int], int]  # (topic, partition) -> offset
#: How many of the heartbeat topic's newest records are read first for the newest heartbeat's LSN, and how long
#: the first fetch of them may take.
HEARTBEAT_RECORDS = 3
FIRST_FETCH_S = 2.0


def parse_token(raw: str) -> int:
    """A PostgreSQL LSN as `pg_current_wal_lsn()` prints it (`16/B374D848`), as the number it stands for."""
    match = _LSN.fullmatch(raw.strip())
    if match is None:
        raise RequestInvalid(
            TOKEN_FIELD,
            f"must be an LSN as `SELECT pg_current_wal_lsn()` answers it (e.g. 0/16B3748), got {raw[:40]!r}",
        )
    return (int(match[1], 16) << 32) | int(match[2], 16)


_FRESH: ContextVar[bool] = ContextVar("ki_reading_fresh", default=False)


def reading_fresh() -> bool:
    """This request carries a consistency token: compile the scope and look names up in SQL, past any cache."""
    return _FRESH.get()


@contextmanager
def fresh_reads() -> Iterator[None]:
    token = _FRESH.set(True)
    try:
        yield
    finally:
        _FRESH.reset(token)


class Stale(TransientError):
    """The access lane had not applied the token's changes within `api.consistency.max_wait_s`."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"the index had not applied the changes up to the consistency token after {waited_s:.1f} s")
        self.waited_s = waited_s


@dataclass(frozen=True)
class Consistency:
    """What a request with a token was answered after: the lanes it waited for, and the vectors' state."""

    waited_for: tuple[Lane, ...]
    vectors: Literal["current", "pending"]

    def to_json(self) -> dict[str, object]:
        return {"consistent": True, "waited_for": list(self.waited_for), "vectors": self.vectors}


class LanePositions(Protocol):
    """The Kafka port (blocking calls; the gate runs them in a thread)."""

    def heartbeat_lsn(self) -> int | None:
        """The newest heartbeat's change LSN Debezium has streamed (None: none yet)."""
        ...

    def log_ends(self, lane: Lane) -> Offsets: ...

    def committed(self, lane: Lane) -> Offsets: ...


def caught_up(ends: Offsets, committed: Offsets) -> bool:
    """The group has committed every partition at least to the log end read before."""
    return all(end <= 0 or committed.get(key, -1) >= end for key, end in ends.items())


class ConsistencyGate:
    """Waits for tokens; one reading of Kafka at a time, shared by every request waiting meanwhile."""

    def __init__(
        self,
        positions: LanePositions,
        refresh: Callable[[], Awaitable[object]],
        max_wait_s: float,
        poll_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.positions, self.refresh = positions, refresh
        self.max_wait_s, self.poll_s, self.clock = max_wait_s, poll_s, clock
        # Per lane: every change committed before this heartbeat LSN is applied (a token at or below it holds).
        self.proven: dict[Lane, int] = {"access": 0, "content": 0}
        self._lock = asyncio.Lock()

    def close(self) -> None:
        close = getattr(self.positions, "close", None)
        if close is not None:
            close()

    async def wait(self, token: int) -> Consistency:
        deadline = self.clock() + self.max_wait_s
        started = self.clock()
        while self.proven["access"] < token:
            if self.clock() >= deadline:
                raise Stale(self.clock() - started)
            async with self._lock:
                if self.proven["access"] < token:
                    await self._prove(token, deadline)
        return Consistency(("access",), "current" if self.proven["content"] >= token else "pending")

    async def _prove(self, token: int, deadline: float) -> None:
        """Advance `proven` past `token` if the lanes get there before `deadline` (else leave it)."""
        while True:
            beat = await asyncio.to_thread(self.positions.heartbeat_lsn)
            if beat is not None and beat >= token:
                break
            if self.clock() >= deadline:
                return
            await asyncio.sleep(self.poll_s)
        lanes: tuple[Lane, ...] = ("access", "content")
        ends = {lane: await asyncio.to_thread(self.positions.log_ends, lane) for lane in lanes}
        while True:
            if caught_up(ends["access"], await asyncio.to_thread(self.positions.committed, "access")):
                await self.refresh()  # what the lane wrote, searchable now rather than at the next refresh
                self.proven["access"] = max(self.proven["access"], beat)
                break
            if self.clock() >= deadline:
                return
            await asyncio.sleep(self.poll_s)
        # The vectors: looked at once, never waited for.
        if caught_up(ends["content"], await asyncio.to_thread(self.positions.committed, "content")):
            self.proven["content"] = max(self.proven["content"], beat)


class KafkaLanePositions:
    """`LanePositions` over the broker: the heartbeat topic's newest records, the lanes' topics' log ends and
    their consumer groups' committed offsets (`ki.kafka_offsets`). Needs only DESCRIBE on the lanes' topics and
    groups, and READ on the heartbeat topic. Not thread-safe: the gate calls it one reading at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.heartbeat_topic = topic_name(settings.kafka.topic_prefix, HEARTBEAT_TABLE)
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self._partitions: dict[Lane, list[TopicPartition]] = {}
        self._following = False
        self._newest_heartbeat: int | None = None

    def _clients(self) -> tuple[AdminClient, Consumer]:
        if self._admin is None or self._consumer is None:
            self._admin = make_kafka_admin(self.settings)
            self._consumer = make_kafka_consumer(
                self.settings,
                f"{self.settings.streams.app_id}-api-consistency-{uuid.uuid4().hex[:12]}",
                **{"enable.auto.commit": False, "enable.partition.eof": True},
            )
        return self._admin, self._consumer

    def heartbeat_lsn(self) -> int | None:
        with kafka_errors():
            return self._heartbeat_lsn()

    def _heartbeat_lsn(self) -> int | None:
        admin, consumer = self._clients()
        if not self._following:
            # Assigned once, a few records before the end (a tombstone may follow a delete); from then on the
            # client fetches new heartbeats in the background and each reading only drains what has arrived.
            partitions = topic_partitions(admin, [self.heartbeat_topic])
            if not partitions:
                return None
            starts = []
            for tp in partitions:
                low, high = consumer.get_watermark_offsets(tp, timeout=10)
                starts.append(TopicPartition(tp.topic, tp.partition, max(low, high - HEARTBEAT_RECORDS)))
            consumer.assign(starts)
            self._following = True
            self._drain(consumer, FIRST_FETCH_S)
        self._drain(consumer, 0)
        return self._newest_heartbeat

    def _drain(self, consumer: Consumer, timeout_s: float) -> None:
        """Every heartbeat that has arrived; with a timeout, wait for them until the end of the topic."""
        while (message := consumer.poll(timeout_s)) is not None:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                continue
            try:
                event = decode(str(message.topic()), message.key(), message.value(), known_tables=None)
            except PoisonEvent:
                continue
            if isinstance(event, ChangeEvent) and event.source.lsn is not None:
                self._newest_heartbeat = max(self._newest_heartbeat or 0, event.source.lsn)

    def _lane_partitions(self, lane: Lane) -> list[TopicPartition]:
        if lane not in self._partitions:  # topics and partitions are fixed once the stack runs
            admin, _ = self._clients()
            found = topic_partitions(admin, lane_topics(self.settings, lane))
            if not found:
                return []
            self._partitions[lane] = found
        return self._partitions[lane]

    def log_ends(self, lane: Lane) -> Offsets:
        with kafka_errors():
            admin, _ = self._clients()
            return log_ends(admin, self._lane_partitions(lane))

    def committed(self, lane: Lane) -> Offsets:
        with kafka_errors():
            admin, _ = self._clients()
            return committed_offsets(admin, consumer_group(self.settings, lane), self._lane_partitions(lane))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


async def answer_consistent(
    gate: ConsistencyGate, request: object, answer: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """`answer()`, after waiting for the request's `consistency_token` if it has one (then read past the caches,
    and with `consistency` in the answer)."""
    raw = getattr(request, TOKEN_FIELD, None)
    if raw is None:
        return await answer()
    consistency = await gate.wait(parse_token(raw))
    with fresh_reads():
        out = await answer()
    return {**out, "consistency": consistency.to_json()}


def consistency_gate(settings: Settings, client: AsyncOpenSearch) -> ConsistencyGate:
    """The gate over the broker and the index, as `api.consistency` sets it (Kafka clients made on the first
    token)."""
    limits = settings.api.consistency
    alias = settings.retrieval.index_name

    async def refresh() -> object:
        with opensearch_errors():
            return await client.indices.refresh(index=alias)

    return ConsistencyGate(KafkaLanePositions(settings), refresh, limits.max_wait_s, limits.poll_ms / 1000)
