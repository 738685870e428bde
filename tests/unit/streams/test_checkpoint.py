"""The sync worker's checkpoint (streams.checkpoint) without Kafka: an offset is released for commit only
once its record is resolved (applied, dead-lettered, skipped) and every earlier record of its partition
is; what is abandoned or read again is never released. And Faust's side: a message the checkpoint holds
is not acknowledged to the consumer by the stream alone."""

from __future__ import annotations

from dataclasses import dataclass

from faust.types.tuples import ConsumerMessage

from streams.checkpoint import COMMIT_EVERY, COMMIT_INTERVAL_S, Checkpoint, FaustAcks, faust_commit_settings

TOPIC = "ki.public.document_versions"
GRANTS = "ki.public.grants"


@dataclass(frozen=True, eq=False)  # two reads of one offset are two records
class Record:
    topic: str
    partition: int
    offset: int


class Consumer:
    """Records what was held and what was released, in order."""

    def __init__(self) -> None:
        self.held: list[tuple[str, int, int]] = []
        self.released: list[tuple[str, int, int]] = []

    def hold(self, record: Record) -> None:
        self.held.append((record.topic, record.partition, record.offset))

    def release(self, record: Record) -> None:
        self.released.append((record.topic, record.partition, record.offset))


def records(topic: str, partition: int, *offsets: int) -> list[Record]:
    return [Record(topic, partition, offset) for offset in offsets]


def checkpoint() -> tuple[Checkpoint, Consumer]:
    consumer = Consumer()
    return Checkpoint(consumer), consumer


def test_an_offset_is_released_only_once_its_record_is_resolved() -> None:
    cp, consumer = checkpoint()
    batch = records(TOPIC, 0, 3, 4, 7)  # a compacted topic has gaps
    cp.hold(batch)
    assert consumer.held == [(TOPIC, 0, 3), (TOPIC, 0, 4), (TOPIC, 0, 7)]
    assert consumer.released == [] and cp.committable() == {} and cp.holding() == 3
    cp.applied(batch)
    assert consumer.released == consumer.held
    assert cp.committable() == {(TOPIC, 0): 8} and cp.holding() == 0


def test_a_partition_is_never_released_past_an_unresolved_earlier_offset() -> None:
    cp, consumer = checkpoint()
    first, second, third = records(TOPIC, 0, 10, 11, 12)
    other = Record(TOPIC, 1, 10)
    grant = Record(GRANTS, 0, 10)
    cp.hold([first, second, other, third, grant])
    cp.dead_lettered(second)
    cp.skipped(third)
    cp.applied([other, grant])
    # The later records of partition 0 are resolved, but the first is not: nothing of it is released,
    # while the other partitions (of this topic and of another one) are not held up by it.
    assert consumer.released == [(TOPIC, 1, 10), (GRANTS, 0, 10)]
    assert cp.committable() == {(TOPIC, 1): 11, (GRANTS, 0): 11}
    cp.applied([first])
    assert consumer.released[2:] == [(TOPIC, 0, 10), (TOPIC, 0, 11), (TOPIC, 0, 12)]  # in offset order
    assert cp.committable()[(TOPIC, 0)] == 13


def test_each_record_is_released_once_and_a_record_never_held_is_ignored() -> None:
    cp, consumer = checkpoint()
    batch = records(TOPIC, 0, 1, 2)
    cp.hold(batch)
    cp.dead_lettered(batch[0])
    cp.applied(batch)
    cp.applied(batch)
    cp.skipped(Record(TOPIC, 0, 3))
    assert consumer.released == [(TOPIC, 0, 1), (TOPIC, 0, 2)]
    assert cp.committable() == {(TOPIC, 0): 3}


def test_an_abandoned_batch_sticks_its_partitions_until_they_are_read_again_from_there() -> None:
    cp, consumer = checkpoint()
    batch = records(TOPIC, 0, 5, 6, 7) + records(TOPIC, 1, 5)
    cp.hold(batch)
    cp.dead_lettered(batch[0])  # resolved before the batch failed: released
    cp.abandon(batch)
    assert consumer.released == [(TOPIC, 0, 5)]
    later = records(TOPIC, 0, 8, 9) + records(TOPIC, 1, 6)
    cp.hold(later)
    cp.applied(later)  # applied, but after an unresolved offset of their partitions
    assert consumer.released == [(TOPIC, 0, 5)] and cp.holding() == 0  # nor kept: a stuck partition holds nothing
    assert cp.committable() == {(TOPIC, 0): 6}
    again = records(TOPIC, 0, 6, 7, 8, 9)  # partition 0 read again from its committed offset
    cp.hold(again)
    cp.applied(again)
    cp.applied(batch + later)  # the first reads resolving late release nothing
    assert consumer.released[1:] == [(TOPIC, 0, 6), (TOPIC, 0, 7), (TOPIC, 0, 8), (TOPIC, 0, 9)]
    assert cp.committable() == {(TOPIC, 0): 10}  # partition 1 stays stuck until it is read again


def test_a_partition_read_again_forgets_what_it_held_from_there_on() -> None:
    cp, consumer = checkpoint()
    first_read = records(TOPIC, 0, 1, 2, 3)
    cp.hold(first_read)
    cp.applied(first_read[:1])
    second_read = records(TOPIC, 0, 2, 3)  # a rebalance handed the partition back from offset 2
    cp.hold(second_read)
    cp.applied(first_read[1:])  # the first read of offsets 2 and 3 is not the one held any more
    assert consumer.released == [(TOPIC, 0, 1)]
    cp.applied(second_read)
    assert consumer.released == [(TOPIC, 0, 1), (TOPIC, 0, 2), (TOPIC, 0, 3)]


def test_a_partition_read_again_still_waits_for_what_it_held_before_that_offset() -> None:
    cp, consumer = checkpoint()
    first, second = records(TOPIC, 0, 1, 2)
    cp.hold([first, second])
    again = Record(TOPIC, 0, 2)
    cp.hold([again])
    cp.applied([again])
    assert consumer.released == []  # offset 1 is still unresolved
    cp.applied([first])
    assert consumer.released == [(TOPIC, 0, 1), (TOPIC, 0, 2)]


def test_faust_commits_released_offsets_on_the_checkpoint_s_cadence() -> None:
    settings = faust_commit_settings()
    assert settings["broker_commit_interval"] == COMMIT_INTERVAL_S
    assert settings["broker_commit_every"] == COMMIT_EVERY
    assert settings["stream_wait_empty"] is False


class FaustConsumer:
    """What Faust's consumer learns: `ack` marks an offset safe to commit."""

    def __init__(self) -> None:
        self.acked: list[int] = []

    def ack(self, message: ConsumerMessage) -> bool:
        self.acked.append(message.offset)
        return True


class FaustApp:
    def __init__(self) -> None:
        self.consumer = FaustConsumer()


def delivered(offset: int) -> ConsumerMessage:
    """A message as Faust's conductor hands it to the one stream that reads it (one reference)."""
    message = ConsumerMessage(TOPIC, 0, offset, 0.0, 0, None, b"k", b"v", None)
    message.incref()
    return message


def test_faust_commits_a_held_message_only_once_the_checkpoint_and_the_stream_both_let_go() -> None:
    app = FaustApp()
    cp = Checkpoint(FaustAcks(app))  # type: ignore[arg-type]
    stream_first, checkpoint_first, never = delivered(1), delivered(2), delivered(3)
    cp.hold([stream_first, checkpoint_first, never])
    # take_events acknowledges a batch when it moves on to the next one, or when the worker stops
    # mid-batch and closes it: alone, that commits nothing.
    stream_first.ack(app.consumer)  # type: ignore[arg-type]
    never.ack(app.consumer)  # type: ignore[arg-type]
    assert app.consumer.acked == []
    cp.applied([stream_first, checkpoint_first])
    assert app.consumer.acked == [1]
    checkpoint_first.ack(app.consumer)  # type: ignore[arg-type]
    assert app.consumer.acked == [1, 2]
    cp.abandon([never])
    assert app.consumer.acked == [1, 2]  # a message never resolved is never acknowledged
