"""`ki dlq`: the dead-letter topic read back, its operations log, replay through the projector, drop with a reason.

What a dead letter carries and which ones wait is `streams.dead_letters` (pure); this module reads the topic
(Kafka), the handled marks and the log (`ki_dlq_operations`, PostgreSQL) and replays through the worker's own
`Projector` (`Projector.apply`: the same reads of the index and PostgreSQL, the same conditional writes, so a replay
can never put older state over a newer write). A replay re-projects what the record dirtied from PostgreSQL as it is
now: after the cause is fixed (an embedder, a mapping, a row), the dead letter's rows come out as the live sync
would write them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from ki.clients import kafka_error, make_client, make_kafka_consumer
from ki.embedding import create_embedder
from ki.errors import AlreadyExists
from ki.settings import Settings
from streams.dead_letters import (
    HANDLED_OUTCOMES,
    Backlog,
    DeadLetter,
    Replayable,
    backlog,
    parse,
    replayable,
    unhandled,
)
from streams.sync import Projector
from streams.writer import IndexWriter, indices_with_signature

#: `ki dlq`'s own consumer group (never committed: it assigns partitions and reads them to their end).
GROUP_PREFIX = "ki-dlq-"

_HANDLED = text(
    "SELECT dlq_partition, dlq_offset FROM ki_dlq_operations WHERE dlq_topic = :topic AND outcome = ANY(:outcomes)"
)
_LOG = text(
    "INSERT INTO ki_dlq_operations "
    "(operator, action, dlq_topic, dlq_partition, dlq_offset, record_key, reason, outcome, detail) "
    "VALUES (:operator, :action, :topic, :partition, :offset, :key, :reason, :outcome, :detail)"
)


def handled_positions(engine: Engine, dlq_topic: str) -> set[tuple[int, int]]:
    """The (partition, offset) of every dead letter a replay or drop has handled."""
    with engine.connect() as conn:
        rows = conn.execute(_HANDLED, {"topic": dlq_topic, "outcomes": list(HANDLED_OUTCOMES)})
        return {(row.dlq_partition, row.dlq_offset) for row in rows}


class DlqTail:
    """The dead-letter topic read to its end, and on the next `read` only what came since (a scrape every few
    seconds reads nothing most of the time). Dead letters below the topic's log start (retention) are forgotten.
    Not thread-safe: one reader."""

    def __init__(self, settings: Settings, consumer: Consumer | None = None) -> None:
        self.topic = settings.streams.dlq_topic
        self._consumer = consumer or make_kafka_consumer(
            settings, f"{GROUP_PREFIX}{uuid.uuid4().hex[:8]}", **{"enable.auto.commit": False}
        )
        self._next: dict[int, int] = {}  # partition -> next offset to read
        self.letters: dict[tuple[int, int], DeadLetter] = {}

    def read(self, timeout_s: float = 10.0) -> list[DeadLetter]:
        """Every dead letter the topic holds now (those that arrived since the last read are read), oldest first."""
        metadata = self._consumer.list_topics(self.topic, timeout=timeout_s)
        info = metadata.topics.get(self.topic)
        if info is None or info.error is not None:
            return []  # no dead letter was ever written
        wanted: list[TopicPartition] = []
        ends: dict[int, int] = {}
        for partition in info.partitions:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=timeout_s)
            self.letters = {pos: d for pos, d in self.letters.items() if pos[0] != partition or pos[1] >= low}
            start = max(low, self._next.get(partition, low))
            if start < high:
                wanted.append(TopicPartition(self.topic, partition, start))
                ends[partition] = high
        if wanted:
            self._fetch(wanted, ends, timeout_s)
        return sorted(self.letters.values(), key=lambda d: (d.at_ms, d.position))

    def _fetch(self, wanted: list[TopicPartition], ends: dict[int, int], timeout_s: float) -> None:
        self._consumer.assign(wanted)
        deadline = time.monotonic() + max(timeout_s, 30.0)
        remaining = set(ends)
        try:
            while remaining:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {self.topic} did not reach its end in time")
                for message in self._consumer.consume(num_messages=500, timeout=1.0):
                    error = message.error()
                    if error is not None:
                        raise kafka_error(error)
                    partition, offset = message.partition(), message.offset()
                    _kind, timestamp = message.timestamp()
                    self.letters[(partition, offset)] = parse(partition, offset, timestamp, message.value())
                    self._next[partition] = offset + 1
                    if offset + 1 >= ends[partition]:
                        remaining.discard(partition)
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


def read_waiting(settings: Settings, engine: Engine) -> list[DeadLetter]:
    """The dead letters no replay or drop has handled, oldest first (one-shot: for `ki dlq`)."""
    tail = DlqTail(settings)
    try:
        letters = tail.read()
    finally:
        tail.close()
    return unhandled(letters, handled_positions(engine, settings.streams.dlq_topic)) if letters else []


def waiting_backlog(tail: DlqTail, engine: Engine, now_s: float) -> Backlog:
    """The lanes' DLQ gauges: how many dead letters wait and for how long the oldest has."""
    letters = tail.read()
    return backlog(unhandled(letters, handled_positions(engine, tail.topic)) if letters else [], now_s)


# -- the operations log ----------------------------------------------------------------------------------


@dataclass
class Operation:
    """One `ki dlq replay` / `drop`: who, why, and each selected dead letter's outcome (with what failed)."""

    action: str
    operator: str
    reason: str | None = None
    outcomes: list[tuple[DeadLetter, str, str | None]] = field(default_factory=list)  # (letter, outcome, detail)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, outcome, _ in self.outcomes:
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    @property
    def failed(self) -> list[tuple[DeadLetter, str | None]]:
        return [(d, detail) for d, outcome, detail in self.outcomes if outcome == "failed"]


def record(engine: Engine, dlq_topic: str, op: Operation) -> None:
    """Writes the operation's rows in one transaction. A dead letter another operator handled meanwhile violates
    the handled index: nothing of this operation is written, and the error says so."""
    rows = [
        {"operator": op.operator, "action": op.action, "topic": dlq_topic, "partition": d.partition,
         "offset": d.offset, "key": d.key, "reason": op.reason, "outcome": outcome, "detail": detail}
        for d, outcome, detail in op.outcomes
    ]  # fmt: skip
    if not rows:
        return
    try:
        with engine.begin() as conn:
            conn.execute(_LOG, rows)
    except IntegrityError as exc:
        if "ix_ki_dlq_operations_handled" not in str(exc):
            raise
        raise AlreadyExists(
            f"dlq {op.action}: another operator handled some of these dead letters meanwhile; nothing was logged "
            "for this one (`ki dlq list` shows what still waits)",
            service="postgres",
        ) from None


def drop(engine: Engine, dlq_topic: str, letters: Sequence[DeadLetter], operator: str, reason: str) -> Operation:
    op = Operation("drop", operator, reason, [(d, "dropped", None) for d in letters])
    record(engine, dlq_topic, op)
    return op


async def replay(
    settings: Settings, engine: Engine, letters: Sequence[DeadLetter], operator: str, reason: str | None = None
) -> Operation:
    """Project what the selected dead letters' records dirtied, once, through the worker's projector (both lanes'
    work: access and content), and log each dead letter as replayed, or failed with why (then it keeps waiting)."""
    op = Operation("replay", operator, reason)
    split = replayable(letters)
    op.outcomes += [(d, "failed", why) for d, why in split.undecodable]
    if split.decodable:
        outcome, detail = "replayed", None
        try:
            await _project(settings, engine, split)
        except Exception as exc:  # noqa: BLE001 - any failure is this replay's outcome, logged and shown
            outcome, detail = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0]
        op.outcomes += [(d, outcome, detail) for d in split.decodable]
    record(engine, settings.streams.dlq_topic, op)
    return op


async def _project(settings: Settings, engine: Engine, split: Replayable) -> None:
    """The worker's wiring (`streams.app`), once: the embedder, the one writer, the projector over both lanes."""
    embedder = await asyncio.to_thread(create_embedder, settings)
    client = make_client(settings)
    try:
        sources = await indices_with_signature(client, settings.streams.vector_sources, embedder.signature)
        writer = IndexWriter(client, settings, vector_sources=sources)
        await writer.ensure_index(embedder.signature)
        await Projector.on_postgres(settings, engine, writer, embedder).apply(split.keys)
    finally:
        await client.close()
