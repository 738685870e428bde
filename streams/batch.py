"""One lane's handling of a batch of CDC messages, apart from Faust and Kafka.

Decode every message into dirty keys; dead-letter what cannot be read (a message on a content topic
only by the content lane: both lanes read those topics, one record is enough); apply the batch's keys
through the projector, retrying transient failures for as long as they last (the partition pauses,
nothing is acknowledged) and anything else up to `streams.max_attempts`; then dead-letter the batch's
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
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

from ki.backoff import Backoff
from ki.clients import as_ki_error
from ki.errors import IndexSchemaError, PermanentError, TransientError
from projections.cdc import ChangeEvent, PoisonEvent, Tombstone, decode
from projections.dirty import DirtyKeys, dirty_keys
from streams import metrics
from streams.checkpoint import Checkpoint
from streams.dead_letters import Failure
from streams.topics import Lane

log = logging.getLogger(__name__)

# Between attempts at a failing batch (the partition pauses meanwhile).
SYNC_BACKOFF = Backoff(base_s=0.5, max_s=15.0)


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
    ) -> None:
        self.lane, self.content_topics = lane, frozenset(content_topics)
        self.apply, self.dead_letter, self.checkpoint = apply, dead_letter, checkpoint
        self.max_attempts, self.backoff, self.sleep, self.clock = max_attempts, backoff, sleep, clock

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
                event_keys = dirty_keys(decoded)
            except (PoisonEvent, ValueError, TypeError) as exc:
                if self.lane == "content" or message.topic not in self.content_topics:
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
        attempts made in all)."""
        attempt = 0
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
                attempt += 1
                # Decided by type: ki.errors says which failures go away by themselves; a foreign
                # exception is read once, in ki.clients, and anything unknown counts as permanent.
                transient = isinstance(as_ki_error(exc), TransientError)
                if not transient and attempt >= self.max_attempts:
                    raise GaveUp(exc, attempt) from exc
                metrics.SYNC_RETRIES.inc()
                delay = self.backoff.delay(attempt - 1)
                log.warning(
                    "sync failed (%s: %s); %s retry in %.1fs",
                    type(exc).__name__,
                    str(exc).splitlines()[0],
                    "transient," if transient else "",
                    delay,
                )
                await self.sleep(delay)


SLOW_BATCH_S = 1.0  # a batch that took longer is logged with where its time went


def _log_if_slow(lane: Lane, stats: Any, seconds: float) -> None:
    if seconds < SLOW_BATCH_S:
        return
    stages = ", ".join(f"{stage} {spent:.2f}s" for stage, spent in stats.seconds.items())
    log.info(
        "%s lane: batch took %.2fs (%d version(s) projected, %d access-only, %d row(s) written): %s",
        lane, seconds, stats.versions_projected, stats.access_versions, stats.rows_written, stages,
    )  # fmt: skip
