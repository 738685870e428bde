"""One lane's batch handling (streams.batch.BatchHandler) without Kafka: decoding, the dead-letter
topic, retries by failure type, and the index mismatch that stops the worker instead."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from ki.backoff import Backoff
from ki.errors import IndexSchemaError, PermanentError, TransientError
from projections.dirty import DirtyKeys
from streams.batch import BatchHandler
from streams.sync import SyncStats
from tests.unit.projections.test_cdc import KEY, TOPIC, VERSION_ROW, envelope

CONTENT_TOPICS = {TOPIC}
ACCESS_TOPIC = "ki.public.grants"


@dataclass
class Record:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int = 0
    offset: int = 0


class Lane:
    """A handler with recorded applies, dead letters and waits; `failures` are raised in turn."""

    def __init__(self, lane: str = "content", failures: list[Exception] | None = None, max_attempts: int = 3):
        self.applied: list[DirtyKeys] = []
        self.dead: list[tuple[Record, str]] = []
        self.waits: list[float] = []
        self.failures = list(failures or [])

        async def apply(keys: DirtyKeys) -> SyncStats:
            if self.failures:
                raise self.failures.pop(0)
            self.applied.append(keys)
            return SyncStats()

        async def dead_letter(message: Record, reason: str) -> None:
            self.dead.append((message, reason))

        async def sleep(seconds: float) -> None:
            self.waits.append(seconds)

        self.handler = BatchHandler(
            lane,  # type: ignore[arg-type]
            CONTENT_TOPICS,
            apply,
            dead_letter,  # type: ignore[arg-type]
            max_attempts=max_attempts,
            backoff=Backoff(base_s=0.5, max_s=15.0),
            sleep=sleep,
        )

    def handle(self, *records: Record) -> None:
        asyncio.run(self.handler.handle(list(records)))


GOOD = Record(TOPIC, KEY, envelope(after=VERSION_ROW), offset=1)
POISON = Record(TOPIC, KEY, b"{not json", offset=2)


def test_a_batch_is_applied_as_the_dirty_keys_of_its_events() -> None:
    lane = Lane()
    lane.handle(GOOD)
    assert len(lane.applied) == 1 and 42 in lane.applied[0].content_versions and lane.dead == []


def test_an_undecodable_content_record_is_dead_lettered_by_the_content_lane_only() -> None:
    content, access = Lane("content"), Lane("access")
    content.handle(GOOD, POISON)
    access.handle(GOOD, POISON)
    assert [(m.offset, why.split(":")[0]) for m, why in content.dead] == [(2, "undecodable")]
    assert access.dead == []  # both lanes read the content topics: one dead letter is enough
    assert len(content.applied) == len(access.applied) == 1  # the rest of the batch is applied
    poison_grant = Record(ACCESS_TOPIC, b'{"id": 1}', b"{not json", offset=3)
    access.handle(poison_grant)
    assert [m.offset for m, _ in access.dead] == [3]  # an access topic is the access lane's own


def test_transient_failures_are_retried_for_as_long_as_they_last() -> None:
    lane = Lane(failures=[TransientError("opensearch away")] * 6, max_attempts=2)
    lane.handle(GOOD)
    assert len(lane.applied) == 1 and lane.dead == []
    assert lane.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0]  # the partition pauses, backing off


def test_a_permanent_failure_dead_letters_the_whole_batch_after_the_last_attempt() -> None:
    lane = Lane(failures=[PermanentError("mapping rejects the row")] * 3, max_attempts=3)
    second = Record(TOPIC, KEY, envelope(after={**VERSION_ROW, "id": 43}), offset=9)
    lane.handle(GOOD, second)
    assert lane.applied == [] and len(lane.waits) == 2
    assert [m.offset for m, _ in lane.dead] == [1, 9]
    assert all(why.startswith("cannot be applied: PermanentError") for _, why in lane.dead)


def test_an_index_that_does_not_fit_the_settings_is_neither_retried_nor_dead_lettered() -> None:
    lane = Lane(failures=[IndexSchemaError("dimension 384 != 768")])
    with pytest.raises(IndexSchemaError):
        lane.handle(GOOD)
    assert lane.waits == [] and lane.dead == [] and lane.applied == []


def test_a_failing_batch_dead_letters_each_record_once_and_leaves_the_other_lane_s_records_alone() -> None:
    content = Lane("content", failures=[PermanentError("mapping rejects the row")] * 3)
    content.handle(GOOD, POISON)
    # The poison record was dead-lettered for what it is; the batch's failure does not send it a second time.
    assert [(m.offset, why.split(":")[0]) for m, why in content.dead] == [(2, "undecodable"), (1, "cannot be applied")]
    access = Lane("access", failures=[PermanentError("mapping rejects the row")] * 3)
    access.handle(GOOD, POISON)
    # The undecodable content record is the content lane's to dead-letter, whatever happens to this batch.
    assert [(m.offset, why.split(":")[0]) for m, why in access.dead] == [(1, "cannot be applied")]
