"""One lane's batch handling (streams.batch.BatchHandler) without Kafka: decoding, the dead-letter
topic, retries by failure type, the index mismatch that stops the worker instead, and what it reports to
the checkpoint (which offsets may be committed, and when)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from ki.backoff import Backoff
from ki.errors import IndexReadOnly, IndexSchemaError, ItemFailure, PermanentError, TransientError, bulk_error
from projections.dirty import DirtyKeys, WrittenWith
from streams import metrics
from streams.batch import BatchHandler
from streams.checkpoint import Checkpoint
from streams.dead_letters import Failure
from streams.liveness import LaneProgress
from streams.sync import SyncStats
from streams.writer import item_outcome
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


class Released:
    """The consumer's side of the checkpoint: the offsets it may commit, in the order released."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def hold(self, record: Record) -> None:
        pass

    def release(self, record: Record) -> None:
        self.offsets.append(record.offset)


class Lane:
    """A handler with recorded applies, dead letters, waits and released offsets (with what was released
    when each apply, dead letter and wait began); `failures` are raised in turn, by `apply` or, with
    `dead_letter_failures`, by the dead-letter topic."""

    def __init__(
        self,
        lane: str = "content",
        failures: list[BaseException] | None = None,
        max_attempts: int = 3,
        dead_letter_failures: list[BaseException] | None = None,
        **extra: Any,  # further BatchHandler arguments (the pause's)
    ):
        self.applied: list[DirtyKeys] = []
        self.dead: list[tuple[Record, str]] = []
        self.failures_sent: list[Failure] = []
        self.waits: list[float] = []
        self.failures = list(failures or [])
        self.dead_letter_failures = list(dead_letter_failures or [])
        self.released = Released()
        self.checkpoint = Checkpoint(self.released)
        self.released_at: list[tuple[str, list[int]]] = []  # (what began, the offsets released before)

        async def apply(keys: DirtyKeys) -> SyncStats:
            self.released_at.append(("apply", list(self.released.offsets)))
            if self.failures:
                raise self.failures.pop(0)
            self.applied.append(keys)
            return SyncStats()

        async def dead_letter(message: Record, failure: Failure) -> None:
            self.released_at.append((f"dead letter {message.offset}", list(self.released.offsets)))
            if self.dead_letter_failures:
                raise self.dead_letter_failures.pop(0)
            self.dead.append((message, failure.reason))
            self.failures_sent.append(failure)

        async def sleep(seconds: float) -> None:
            self.released_at.append(("wait", list(self.released.offsets)))
            self.waits.append(seconds)

        self.handler = BatchHandler(
            lane,  # type: ignore[arg-type]
            CONTENT_TOPICS,
            apply,
            dead_letter,  # type: ignore[arg-type]
            checkpoint=self.checkpoint,
            max_attempts=max_attempts,
            backoff=Backoff(base_s=0.5, max_s=15.0),
            sleep=sleep,
            **extra,
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
    # Each dead letter says what failed and how often the lane tried, for `ki dlq list`.
    assert {(f.error_class, f.attempts) for f in lane.failures_sent} == {("PermanentError", 3)}


def test_back_pressure_is_retried_with_backoff_and_never_counts_as_an_attempt() -> None:
    """OpenSearch answering 429 (a full write queue, shard indexing pressure) after the writer's own retries: the
    lane slows down, and however long it lasts, it does not use up the batch's attempts."""
    throttled = bulk_error({"1:chunk:0": ItemFailure(429, "es_rejected_execution_exception", "queue full")})
    lane = Lane(failures=[throttled] * 4 + [PermanentError("refused")], max_attempts=2)
    lane.handle(GOOD)
    assert len(lane.applied) == 1 and lane.dead == []  # the one permanent failure is the first attempt of two
    assert lane.waits == [0.5, 1.0, 2.0, 4.0, 8.0]


# What a `_bulk` item on a blocked index is answered: OpenSearch 2.x's flood stage, an operator's block.
FLOOD_STAGE = {"status": 429, "error": {"type": "cluster_block_exception", "reason": "[TOO_MANY_REQUESTS/12/…]"}}
READ_ONLY_API = {"status": 403, "error": {"type": "cluster_block_exception", "reason": "[FORBIDDEN/12/read-only]"}}


@pytest.mark.parametrize("answer", [FLOOD_STAGE, READ_ONLY_API], ids=["429-flood-stage", "403-read-only-api"])
def test_a_read_only_index_dead_letters_nothing_however_long_it_lasts(answer: dict[str, Any]) -> None:
    """The data-loss bug: a 403 block was a permanent failure, so after `max_attempts` the batch went to the DLQ
    (and a 429 one made the lane look stalled). A full disk is not a poison record."""
    blocked = bulk_error({"1:chunk:0": item_outcome("index", answer)})  # type: ignore[arg-type]
    lane = Lane(failures=[blocked] * 6, max_attempts=2)
    lane.handle(GOOD)
    assert lane.dead == [] and len(lane.applied) == 1
    assert lane.released.offsets == [1]  # committed once applied, never before


def test_a_paused_lane_says_why_checks_the_block_with_backoff_and_resumes_when_it_is_lifted() -> None:
    clock = [100.0]
    checks = iter(["index read-only (flood stage) on ki--1", "index read-only (flood stage) on ki--1", None])
    seen: list[tuple[str | None, dict[str, Any], int]] = []  # at each check: the pause, the healthz body, the gauge
    progress = LaneProgress("content", started=0.0)

    async def write_block() -> str | None:
        # Records wait (lag 5) and the lane fetched nothing for far longer than stall_after_s: paused, not stalled,
        # since it marked its pause 10 s ago.
        verdict = progress.verdict(lag=5, now=(progress.last_pause_check or 0.0) + 10, stall_after_s=300)
        paused = metrics.LANE_PAUSED.labels(lane="content", reason="index_read_only")._value.get()
        seen.append((progress.pause_reason, verdict.to_json(), int(paused)))
        clock[0] += 1000.0
        return next(checks)

    blocked = IndexReadOnly("429 cluster_block_exception: index [ki--1] blocked by: [TOO_MANY_REQUESTS/12/…]")
    lane = Lane(
        failures=[blocked],
        max_attempts=1,
        write_block=write_block,
        progress=progress,
        monotonic=lambda: clock[0],
        pause_poll=Backoff(base_s=1.0, max_s=4.0),
    )
    lane.handle(GOOD)
    assert len(lane.applied) == 1 and lane.dead == [] and lane.released.offsets == [1]
    assert lane.waits == [1.0, 2.0, 4.0]  # the checks back off
    assert [paused for _, _, paused in seen] == [1, 1, 1]
    assert seen[0][0] == f"index read-only: {blocked.reason}"
    assert seen[2][0] == "index read-only: index read-only (flood stage) on ki--1"  # the last check's finding
    for _, health, _ in seen:
        assert health["status"] == "paused" and health["paused"].startswith("index read-only")
        assert health["seconds_idle"] == 10
    # Resumed: the gauge is back at 0 and the lane no longer reports a pause.
    assert metrics.LANE_PAUSED.labels(lane="content", reason="index_read_only")._value.get() == 0
    assert progress.pause_reason is None


def test_a_pause_whose_check_fails_stays_paused() -> None:
    answers: list[BaseException | str | None] = [TransientError("opensearch away"), None]

    async def write_block() -> str | None:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    lane = Lane(failures=[IndexReadOnly("blocked")], max_attempts=1, write_block=write_block)
    lane.handle(GOOD)
    assert len(lane.applied) == 1 and answers == [] and len(lane.waits) == 2


def test_transient_attempts_before_a_permanent_failure_count_as_attempts() -> None:
    lane = Lane(failures=[TransientError("opensearch away"), *[PermanentError("refused")] * 2], max_attempts=2)
    lane.handle(GOOD)
    assert [(f.error_class, f.attempts) for f in lane.failures_sent] == [("PermanentError", 2)]


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
    assert [(f.error_class, f.attempts) for f in content.failures_sent] == [("undecodable", 1), ("PermanentError", 3)]
    access = Lane("access", failures=[PermanentError("mapping rejects the row")] * 3)
    access.handle(GOOD, POISON)
    # The undecodable content record is the content lane's to dead-letter, whatever happens to this batch.
    assert [(m.offset, why.split(":")[0]) for m, why in access.dead] == [(1, "cannot be applied")]


def test_a_batch_s_offsets_are_released_only_once_the_index_acknowledged_it() -> None:
    lane = Lane(failures=[TransientError("opensearch away")] * 2)
    second = Record(TOPIC, KEY, envelope(after={**VERSION_ROW, "id": 43}), offset=9)
    lane.handle(GOOD, second)
    assert lane.released_at == [("apply", []), ("wait", []), ("apply", []), ("wait", []), ("apply", [])]
    assert lane.released.offsets == [1, 9]
    assert lane.checkpoint.committable() == {(TOPIC, 0): 10}


def test_a_dead_lettered_record_is_released_after_its_dead_letter_and_never_before_an_earlier_record() -> None:
    lane = Lane()
    poison_first = Record(TOPIC, KEY, b"{not json", offset=1)
    good_then = Record(TOPIC, KEY, envelope(after=VERSION_ROW), offset=2)
    poison_last = Record(TOPIC, KEY, b"{not json", offset=3)
    lane.handle(poison_first, good_then, poison_last)
    assert lane.released_at == [
        ("dead letter 1", []),
        ("dead letter 3", [1]),  # the first is released once its dead letter is acknowledged
        ("apply", [1]),  # the third waits for the second, which waits for the index
    ]
    assert lane.released.offsets == [1, 2, 3]


def test_the_access_lane_releases_an_undecodable_content_record_it_leaves_to_the_content_lane() -> None:
    lane = Lane("access")
    lane.handle(POISON)
    assert lane.dead == [] and lane.released.offsets == [2]


def test_the_principals_lane_dead_letters_nothing_and_releases_what_it_cannot_read_or_apply() -> None:
    """Every record of the principals lane is the access lane's too, which dead-letters what can never be applied:
    the fast path skips it (a second dead letter would be a duplicate) and goes on."""
    poison_grant = Record(ACCESS_TOPIC, b'{"id": 2}', b"{not json", offset=4)
    grant = Record(ACCESS_TOPIC, b'{"id": 1}', envelope(after={"id": 1}), offset=5)
    lane = Lane("principals", failures=[PermanentError("mapping rejects the update")] * 3, fast_path=True)
    lane.handle(poison_grant, grant)
    assert lane.dead == [] and lane.applied == [] and len(lane.waits) == 2  # tried max_attempts times
    assert lane.released.offsets == [4, 5]
    transient = Lane("principals", failures=[TransientError("opensearch away")] * 4, fast_path=True)
    transient.handle(grant)
    assert len(transient.applied) == 1 and transient.dead == []  # transient failures are waited out as anywhere


def test_only_the_fast_path_lane_reads_an_insert_as_conditional_on_the_row_it_points_at() -> None:
    grant = Record(ACCESS_TOPIC, b'{"id": 1}', envelope(after={"id": 1, "document_id": 20, "principal": "u:a"}))
    principals, access = Lane("principals", fast_path=True), Lane("access")
    principals.handle(grant)
    access.handle(grant)
    assert principals.applied == [DirtyKeys(unless_written_with={WrittenWith("documents", 20, 777): DirtyKeys(
        access_documents={20})})]  # fmt: skip
    assert access.applied == [DirtyKeys(access_documents={20})]
    assert principals.released.offsets == access.released.offsets == [grant.offset]


def test_a_failing_batch_is_released_after_its_dead_letters() -> None:
    lane = Lane(failures=[PermanentError("mapping rejects the row")] * 3)
    lane.handle(GOOD)
    assert lane.released_at[-1] == ("dead letter 1", [])
    assert lane.released.offsets == [1]


def test_a_batch_whose_dead_letter_is_refused_is_never_released_nor_anything_after_it_until_read_again() -> None:
    lane = Lane(dead_letter_failures=[RuntimeError("the broker refused the dead letter")])
    with pytest.raises(RuntimeError):
        lane.handle(GOOD, POISON)
    later = Record(TOPIC, KEY, envelope(after={**VERSION_ROW, "id": 43}), offset=5)
    lane.handle(later)  # the worker carries on (Faust restarts the agent) but commits nothing past offset 1
    assert lane.released.offsets == [] and lane.checkpoint.committable() == {}
    again = [Record(r.topic, r.key, r.value, offset=r.offset) for r in (GOOD, POISON, later)]
    lane.handle(*again)  # read again from the first unreleased offset (a restart, or a rebalance)
    assert lane.released.offsets == [1, 2, 5]


def test_an_index_mismatch_or_a_worker_stopping_mid_batch_releases_nothing() -> None:
    for failure in (IndexSchemaError("dimension 384 != 768"), asyncio.CancelledError()):
        lane = Lane(failures=[failure])
        with pytest.raises(type(failure)):
            lane.handle(GOOD)
        assert lane.released.offsets == [] and lane.checkpoint.holding() == 0
