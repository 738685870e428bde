"""The sync worker's checkpoint: the one place that decides when a consumed offset may be committed.

A lane holds every record it consumes (`Checkpoint.hold`) and tells the checkpoint what became of each:
* `applied`: the index acknowledged every write the records lead to (the projector's `apply` returned,
  so OpenSearch answered each `_bulk` without a failure; a partial failure raises and is retried);
* `dead_lettered`: the broker acknowledged the record's dead letter (`streams.app.DeadLetters.send`
  returns only then);
* `skipped`: there is nothing for this lane to do with it (an undecodable record of a content topic on
  the access lane: the content lane dead-letters it).
A record is released to the consumer, which may then commit its offset, once it and every record held
before it on its partition are resolved: a partition is never committed past an unresolved earlier
offset. What is never resolved is never released, so a crash at any point reads it again:
* a batch that raises (`abandon`) leaves its partitions stuck at their earliest unresolved record: nothing
  later of them is released (nor kept) until the consumer reads them again from there (after a restart,
  or a rebalance that hands the partition back from its committed offset; one handed back further on,
  after another member went past, stays stuck until the restart: read again, never lost);
* a worker stopped or killed mid-batch never released the batch.
A record held at or before an offset already held on its partition means the consumer went back (a
rebalance, a seek): what was held from there on is read again and is not released.

Commits themselves are the consumer's: Faust commits the released offsets every `COMMIT_INTERVAL_S` or
after `COMMIT_EVERY` releases (`faust_commit_settings`); a released offset is safe to commit at any moment,
so these only bound how much a restart reads again.

`Checkpoint` itself is pure (no Kafka, no Faust): it reaches the consumer through `Acks`, two calls per
record. `FaustAcks` is Faust's side, and the only code of the worker that acknowledges a Faust message.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # Faust's side only names these types
    import faust

# Faust commits what the checkpoint released this often (seconds), or after this many releases.
COMMIT_INTERVAL_S = 1.0
COMMIT_EVERY = 100


def faust_commit_settings() -> dict[str, Any]:
    """The Faust app settings that decide when released offsets are committed."""
    return {
        "broker_commit_interval": COMMIT_INTERVAL_S,
        "broker_commit_every": COMMIT_EVERY,
        # On the way out Faust would wait for every message taken to be acknowledged: a batch the worker
        # stops in never is (it is read again after the restart), so the wait would only delay the stop.
        "stream_wait_empty": False,
    }


class Record(Protocol):
    """What the checkpoint reads of a consumed record (a Faust message has these)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


class Acks(Protocol):
    """The consumer's side: `hold` keeps a record's offset from being committed, `release` lets it be."""

    def hold(self, record: Any) -> None: ...

    def release(self, record: Any) -> None: ...


class NoAcks:
    """No consumer (tests, or a caller that reads `Checkpoint.committable` itself)."""

    def hold(self, record: Any) -> None:
        pass

    def release(self, record: Any) -> None:
        pass


@dataclass
class _Held:
    record: Any
    resolved: bool = False


@dataclass
class _Partition:
    held: deque[_Held] = field(default_factory=deque)
    stuck_at: int | None = None  # the earliest record of an abandoned batch: nothing from there is released
    newest: int | None = None  # the newest offset held


class Checkpoint:
    """Decides, record by record and in offset order per partition, when an offset may be committed."""

    def __init__(self, acks: Acks | None = None) -> None:
        self._acks: Acks = acks if acks is not None else NoAcks()
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._held: dict[int, _Held] = {}  # id(record) -> its entry, while held and not yet released
        self._committable: dict[tuple[str, int], int] = {}

    def hold(self, records: Iterable[Record]) -> None:
        """Take responsibility for these records (in the order consumed): none is committed before it is
        resolved, nor before every record held earlier on its partition is."""
        for record in records:
            tp = (record.topic, record.partition)
            part = self._partitions.setdefault(tp, _Partition())
            if part.newest is not None and record.offset <= part.newest:
                self._forget(part, from_offset=record.offset)  # read again from here
            if part.stuck_at is not None and record.offset <= part.stuck_at:
                part.stuck_at = None
            self._acks.hold(record)
            part.newest = record.offset
            if part.stuck_at is not None:
                continue  # never released: read again after a restart or a rebalance
            entry = _Held(record)
            part.held.append(entry)
            self._held[id(record)] = entry

    def applied(self, records: Iterable[Record]) -> None:
        """The index acknowledged every write these records lead to."""
        self._resolve(records)

    def dead_lettered(self, record: Record) -> None:
        """The broker acknowledged this record's dead letter."""
        self._resolve([record])

    def skipped(self, record: Record) -> None:
        """There is nothing for this lane to do with this record."""
        self._resolve([record])

    def abandon(self, records: Iterable[Record]) -> None:
        """These records will not be resolved here (their batch raised, or the worker stops): their
        partitions stay uncommitted from the earliest of them that is still unresolved."""
        for record in records:
            entry = self._held.get(id(record))
            if entry is None or entry.record is not record or entry.resolved:
                continue
            part = self._partitions[(record.topic, record.partition)]
            part.stuck_at = record.offset if part.stuck_at is None else min(part.stuck_at, record.offset)
        for part in self._partitions.values():
            if part.stuck_at is not None:
                self._forget(part, from_offset=part.stuck_at)

    def committable(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the offset a commit may record now (the one after the last released)."""
        return dict(self._committable)

    def holding(self) -> int:
        """How many records are held and not yet released."""
        return len(self._held)

    def _resolve(self, records: Iterable[Record]) -> None:
        touched: dict[tuple[str, int], None] = {}  # in the order first resolved
        for record in records:
            entry = self._held.get(id(record))
            if entry is None or entry.record is not record:
                continue  # not held (any more): forgotten, so it will be read again
            entry.resolved = True
            touched[(record.topic, record.partition)] = None
        for tp in touched:
            self._release_resolved(tp)

    def _release_resolved(self, tp: tuple[str, int]) -> None:
        held = self._partitions[tp].held
        while held and held[0].resolved:
            record = held.popleft().record
            del self._held[id(record)]
            self._committable[tp] = record.offset + 1
            self._acks.release(record)

    def _forget(self, part: _Partition, *, from_offset: int) -> None:
        """Drop what is held of a partition from `from_offset` on, without releasing it."""
        while part.held and part.held[-1].record.offset >= from_offset:
            del self._held[id(part.held.pop().record)]


class FaustAcks:
    """Faust's side of the checkpoint, through Faust's public acknowledgement API: a message's offset
    becomes safe to commit when its last reference is dropped (`Message.ack`), and Faust takes one
    reference per stream that reads it. `take_events` drops its own when it moves on to the next batch,
    and also when the worker stops mid-batch (closing the generator); so the checkpoint takes a reference
    of its own (`Message.incref`) and drops it only on release: the offset is committed after whichever of
    the two goes last, and never while the checkpoint holds it. (Without it, a worker stopped while its
    batch waited for OpenSearch committed the unapplied batch on its way out: found by the fault tests.)"""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    def hold(self, record: Any) -> None:
        message: faust.types.Message = record
        message.incref()

    def release(self, record: Any) -> None:
        message: faust.types.Message = record
        message.ack(self.app.consumer)
