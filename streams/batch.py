"""One lane's handling of a batch of CDC messages, apart from Faust and Kafka.

Decode every message into dirty keys; dead-letter what cannot be read (a message on a content topic
only by the content lane: both lanes read those topics, one record is enough); apply the batch's keys
through the projector, retrying transient failures for as long as they last (the partition pauses,
nothing is acknowledged) and anything else up to `streams.max_attempts`. OpenSearch pushing back
(`BulkThrottled`: items still answered 429 after the writer's own retries) is retried with backoff without
counting as an attempt: the lane slows down. An index that refuses writes (`IndexReadOnly`: a full disk's
flood-stage block) pauses the lane -- `ki_sync_lane_paused{reason="index_read_only"}`, `paused` on /healthz --
and it checks the block with backoff until it is lifted, then applies the same batch: no attempt counted,
nothing dead-lettered (the DLQ is for records that can never be applied, not for a full disk). Otherwise,
after the last attempt, dead-letter the batch's
records (each once: those dead-lettered as unreadable are not sent again, nor are the access lane's
unreadable content records). A settings/index mismatch (`IndexSchemaError`) is never retried nor
dead-lettered: it goes up to the app, which stops the worker without acknowledging anything.

Every record is held by the lane's checkpoint (`streams.checkpoint.Checkpoint`) from the moment the batch
arrives and reported to it as applied, dead-lettered (once the broker acknowledged the dead letter) or
skipped; the checkpoint alone decides when its offset may be committed. A batch that raises is abandoned:
none of it is committed, so it is read again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

from ki.backoff import Backoff
from ki.clients import as_ki_error
from ki.errors import BulkThrottled, IndexReadOnly, IndexSchemaError, PermanentError, TransientError
from projections.cdc import ChangeEvent, PoisonEvent, Tombstone, decode
from projections.dirty import DirtyKeys, dirty_keys
from streams import metrics
from streams.checkpoint import Checkpoint
from streams.dead_letters import Failure
from streams.liveness import LaneProgress
from streams.topics import Lane

log = logging.getLogger(__name__)

# Between attempts at a failing batch (the partition pauses meanwhile).
SYNC_BACKOFF = Backoff(base_s=0.5, max_s=15.0)
# Between checks whether a paused lane may go on (the index's write block lifted).
PAUSE_POLL = Backoff(base_s=0.5, max_s=5.0)
# The `reason` label of `ki_sync_lane_paused` while the index refuses writes.
READ_ONLY = "index_read_only"

# Asks OpenSearch whether the index written still blocks writes: the block's description, or None.
WriteBlock = Callable[[], Awaitable[str | None]]


class Message(Protocol):
    """What the handler reads of a consumed record (a Faust message has these)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


Apply = Callable[[DirtyKeys], Awaitable[Any]]
# Sends a record to the dead-letter topic with why it failed; returns once the broker acknowledged it.
DeadLetter = Callable[[Message, Failure], Awaitable[None]]


class GaveUp(PermanentError):
    """`apply_until_done` stopped trying: `cause` failed the last of `attempts` attempts."""

    def __init__(self, cause: Exception, attempts: int) -> None:
        super().__init__(str(cause))
        self.cause, self.attempts = cause, attempts


class BatchHandler:
    def __init__(
        self,
        lane: Lane,
        content_topics: Collection[str],
        apply: Apply,
        dead_letter: DeadLetter,
        *,
        checkpoint: Checkpoint,
        max_attempts: int,
        backoff: Backoff = SYNC_BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.time,
        write_block: WriteBlock | None = None,
        progress: LaneProgress | None = None,
        pause_poll: Backoff = PAUSE_POLL,
        monotonic: Callable[[], float] = time.monotonic,
        fast_path: bool = False,
    ) -> None:
        """`fast_path`: another lane applies every record of this one too (the principals lane's are the access
        lane's), so this lane dead-letters nothing: what it cannot read or apply it skips, with a warning."""
        self.lane, self.content_topics, self.fast_path = lane, frozenset(content_topics), fast_path
        self.apply, self.dead_letter, self.checkpoint = apply, dead_letter, checkpoint
        self.max_attempts, self.backoff, self.sleep, self.clock = max_attempts, backoff, sleep, clock
        self.write_block, self.progress, self.pause_poll, self.monotonic = write_block, progress, pause_poll, monotonic
        metrics.LANE_PAUSED.labels(lane=lane, reason=READ_ONLY).set(0)  # the series exists before any pause

    async def handle(self, messages: Sequence[Message]) -> None:
        """Apply one batch; returns once every record of it is applied, dead-lettered or skipped."""
        self.checkpoint.hold(messages)
        try:
            await self._handle(messages)
        except BaseException:  # a failure, or the worker stopping mid-batch: read the batch again
            self.checkpoint.abandon(messages)
            raise

    async def _handle(self, messages: Sequence[Message]) -> None:
        keys = DirtyKeys()
        to_apply: list[Message] = []
        newest_commit_ms: int | None = None
        for message in messages:
            try:
                decoded = decode(message.topic, message.key, message.value)
                event_keys = dirty_keys(decoded, fast_path=self.fast_path)
            except (PoisonEvent, ValueError, TypeError) as exc:
                if self.fast_path:
                    log.warning("%s lane skips an unreadable record of %s (the access lane has it too): %s",
                                self.lane, message.topic, exc)  # fmt: skip
                    self.checkpoint.skipped(message)
                elif self.lane == "content" or message.topic not in self.content_topics:
                    await self.dead_letter(message, Failure.undecodable(exc))
                    self.checkpoint.dead_lettered(message)
                else:
                    self.checkpoint.skipped(message)  # the content lane dead-letters it
                continue
            if isinstance(decoded, ChangeEvent):
                metrics.EVENTS.labels(lane=self.lane, table=decoded.table, op=decoded.op).inc()
                if decoded.source.ts_ms and not decoded.source.snapshot:
                    newest_commit_ms = max(newest_commit_ms or 0, decoded.source.ts_ms)
            elif isinstance(decoded, Tombstone):
                metrics.EVENTS.labels(lane=self.lane, table=decoded.table, op="tombstone").inc()
            keys.update(event_keys)
            to_apply.append(message)
        try:
            await self.apply_until_done(keys)
        except GaveUp as gave_up:
            if self.fast_path:
                log.warning("%s lane skips %d record(s) it could not apply (the access lane has them too): %s",
                            self.lane, len(to_apply), gave_up.cause)  # fmt: skip
                for message in to_apply:
                    self.checkpoint.skipped(message)
                return
            failure = Failure.not_applied(gave_up.cause, gave_up.attempts)
            for message in to_apply:
                await self.dead_letter(message, failure)
                self.checkpoint.dead_lettered(message)
        else:
            self.checkpoint.applied(to_apply)
        if newest_commit_ms:
            metrics.FRESHNESS.labels(lane=self.lane).observe(max(0.0, self.clock() - newest_commit_ms / 1000))

    async def apply_until_done(self, keys: DirtyKeys) -> None:
        """Retry transient failures forever; give up on anything else after `max_attempts` (`GaveUp`, with the
        attempts made in all). Back-pressure (`BulkThrottled`) is not an attempt; a write block
        (`IndexReadOnly`) pauses the lane until it is lifted (`wait_until_writable`), and is not one either."""
        attempt = 0  # the failures that count against max_attempts
        failed = 0  # failures in a row other than a pause: the backoff's step
        pauses = 0
        while True:
            try:
                started = time.perf_counter()
                stats = await self.apply(keys)
                metrics.record_sync(stats)
                _log_if_slow(self.lane, stats, time.perf_counter() - started)
                return
            except IndexSchemaError:
                raise
            except Exception as exc:
                # Decided by type: ki.errors says which failures go away by themselves; a foreign
                # exception is read once, in ki.clients, and anything unknown counts as permanent.
                error = as_ki_error(exc)
                if isinstance(error, IndexReadOnly):
                    await self.wait_until_writable(error, pauses)
                    pauses += 1
                    continue
                failed += 1
                throttled = isinstance(error, BulkThrottled)
                if throttled:
                    metrics.THROTTLED.labels(lane=self.lane).inc()
                else:
                    attempt += 1
                transient = isinstance(error, TransientError)
                if not transient and attempt >= self.max_attempts:
                    raise GaveUp(exc, attempt) from exc
                metrics.SYNC_RETRIES.inc()
                delay = self.backoff.delay(failed - 1)
                log.warning(
                    "sync failed (%s: %s); %s retry in %.1fs",
                    type(exc).__name__,
                    str(exc).splitlines()[0],
                    "transient," if transient else "",
                    delay,
                )
                await self.sleep(delay)

    async def wait_until_writable(self, blocked: IndexReadOnly, pauses: int = 0) -> None:
        """Pause the lane while the index refuses writes: the batch stays held (nothing consumed after it,
        nothing committed), the lane says why (`ki_sync_lane_paused`, its liveness), and it checks the block
        with backoff (`pause_poll`, from the `pauses` step: a block that its check does not see cannot make
        the lane spin) until the check finds none; then the caller applies the batch again. A check that fails
        (OpenSearch away) keeps the lane paused."""
        reason = str(blocked)
        gauge = metrics.LANE_PAUSED.labels(lane=self.lane, reason=READ_ONLY)
        gauge.set(1)
        log.error("%s lane paused: %s; nothing is consumed or committed until writes are allowed", self.lane, reason)
        try:
            for check in itertools.count(pauses):
                if self.progress is not None:
                    self.progress.paused(reason, self.monotonic())
                await self.sleep(self.pause_poll.delay(check))
                if self.write_block is None:
                    return  # no way to look: try the write itself again
                try:
                    still = await self.write_block()
                except Exception as exc:  # OpenSearch away too: still paused, check again later
                    log.warning("%s lane paused: the write block could not be checked (%s)", self.lane, exc)
                    continue
                if still is None:
                    log.warning("%s lane resumes: the index accepts writes again", self.lane)
                    return
                reason = f"index read-only: {still}"
        finally:
            gauge.set(0)
            if self.progress is not None:
                self.progress.resumed()


SLOW_BATCH_S = 1.0  # a batch that took longer is logged with where its time went


def _log_if_slow(lane: Lane, stats: Any, seconds: float) -> None:
    if seconds < SLOW_BATCH_S:
        return
    stages = ", ".join(f"{stage} {spent:.2f}s" for stage, spent in stats.seconds.items())
    skipped = f", {stats.inserts_skipped} insert(s) skipped" if getattr(stats, "inserts_skipped", 0) else ""
    log.info(
        "%s lane: batch took %.2fs (%d version(s) projected, %d access-only, %d row(s) written%s): %s",
        lane, seconds, stats.versions_projected, stats.access_versions, stats.rows_written, skipped, stages,
    )  # fmt: skip
