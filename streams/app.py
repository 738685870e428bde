"""The Faust app of one sync lane: CDC topics in, conditional index writes out.

The sync runs as three lanes (`streams.topics.Lane`), each its own Faust app, process and consumer group,
so that access changes never queue behind embedding, nor behind a bulk import's text:
* the **access lane** reads every captured table in big batches (`streams.batch_max_events`,
  `streams.batch_linger_ms`) and writes everything that needs no new vector: principal projections,
  soft deletes, and any content change that leaves every embedded string as it is (decided by the rows'
  content hash). A version whose embedded strings changed only gets its projection rewritten here;
* the **content lane** reads the content tables in small batches (`streams.content_batch_max_events`)
  and embeds in micro-batches (`streams.embed_micro_batch_rows`), each written as soon as it is done;
* the **principals lane** reads only the access tables and rewrites the principal projection of the rows
  search can see (`Projector.apply_principals`): a fast path the access lane backs (it applies the same
  changes), so it never dead-letters.
Both lanes read the index before PostgreSQL and write conditionally, so neither can overwrite the other
with older state: a lost race is projected again from fresh reads (keeping the vectors already computed).

A batch is decoded, turned into dirty keys and applied by the `Projector` (`streams.batch.BatchHandler`:
decoding, retries and the dead-letter topic, without Kafka). When an offset may be committed is decided
by the lane's checkpoint (`streams.checkpoint`) alone: only once OpenSearch acknowledged every write its
record leads to, or the broker acknowledged its dead letter, and never past an earlier offset of its
partition that is not; so a crash at any point replays the batch instead of losing it. Transient
failures (OpenSearch or PostgreSQL away) are retried with backoff inside the body: the partition simply
pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any

import faust
from prometheus_client import generate_latest

from ki.clients import kafka_ssl_context, make_client, make_engine, make_kafka_admin
from ki.embedding import Embedder, create_embedder
from ki.errors import IndexSchemaError, KiError
from ki.settings import Settings
from projections.dirty import DirtyKeys
from projections.plan import expiry_sweep_since
from streams import metrics
from streams.batch import BatchHandler
from streams.checkpoint import Checkpoint, FaustAcks, faust_commit_settings
from streams.dead_letters import Failure, letter_value
from streams.liveness import LaneProgress, Liveness, TopicIdentity
from streams.sync import Projector
from streams.topics import Lane, consumer_group, lane_topics, lane_web_port, topic_ids
from streams.writer import IndexWriter, indices_with_signature

log = logging.getLogger(__name__)


# How long a /metrics scrape waits for the broker's lag reading before it answers the previous values.
LAG_READ_WAIT_S = 2.0
# How soon a lane's consumer looks at the cluster's metadata again by itself (Faust's default: 5 minutes). A lane
# whose topics were deleted is left with no partition; only a metadata refresh shows it their new incarnation.
METADATA_MAX_AGE_MS = 15_000

# Exit status of a worker whose settings do not fit the live index.
EXIT_INDEX_MISMATCH = 3


def broker_credentials(settings: Settings) -> faust.auth.Credentials | None:
    """Faust's view of kafka.security_protocol: SASL (PLAIN / SCRAM) over TLS or not, TLS alone, or none."""
    k = settings.kafka
    context = kafka_ssl_context(settings)
    if k.uses_sasl:
        return faust.SASLCredentials(username=k.sasl_username, password=k.sasl_password, ssl_context=context,
                                     mechanism=k.sasl_mechanism)  # fmt: skip
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def create_app(settings: Settings, lane: Lane, embedder: Embedder | None = None) -> faust.App:
    """One lane's app, built from the settings of the process that runs it (`ki --config X sync run`,
    `$KI_CONFIG`, `KI_*` overrides): app id / consumer group, brokers, topics, DLQ, web port, index.
    `embedder`: loaded before the worker joins its group (`ki sync run` does); None loads it on the first batch.

    There is deliberately no module-level app: one built at import time would use the default
    settings whatever `--config` said."""
    # Faust creates its data directory even with in-memory tables (without parents): keep it out of
    # the working directory.
    group = consumer_group(settings, lane)
    datadir = settings.lanes_data_dir() / "faust" / group
    datadir.parent.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        group,
        broker=[f"kafka://{server}" for server in settings.kafka.brokers],
        broker_credentials=broker_credentials(settings),
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        datadir=str(datadir),
        web_port=lane_web_port(settings, lane),
        web_bind=settings.streams.web_bind,
        web_transport="tcp://",
        consumer_auto_offset_reset="earliest",
        # CDC topics are created compacted by `ki stack` / Debezium; never let Faust declare them.
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        # A killed worker's partitions move on after this, not after Faust's 60 s default.
        broker_session_timeout=settings.streams.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.streams.session_timeout_s / 3),
        **faust_commit_settings(),
    )
    source = app.topic(*lane_topics(settings, lane), key_type=bytes, value_type=bytes, allow_empty=True)
    dlq = app.topic(settings.streams.dlq_topic, key_type=bytes, value_type=bytes, internal=False)
    state: dict[str, Any] = {}

    # Signature as mode's handler type wants it: sender positional-only, `signal=` always passed by keyword.
    @app.on_after_configured.connect
    def _configure_logging(app: faust.App, /, *_: Any, signal: Any, **__: Any) -> None:  # pragma: no cover - wiring
        logging.getLogger("opensearch").setLevel(logging.WARNING)

    building = asyncio.Lock()

    async def projector() -> Projector:
        async with building:
            if "projector" not in state:
                # Loading the model takes seconds (more on a busy machine), mostly holding the GIL, so a thread
                # does not keep the event loop -- and the group's heartbeats -- going: `ki sync run` loads it
                # before the worker joins its group. Here only for callers that did not.
                loaded = embedder if embedder is not None else await asyncio.to_thread(create_embedder, settings)
                client = make_client(settings)
                sources = await indices_with_signature(client, settings.streams.vector_sources, loaded.signature)
                if sources:
                    log.info("stored vectors of identical strings are also taken from %s", ", ".join(sources))
                writer = IndexWriter(client, settings, vector_sources=sources, waits_for_refresh=lane == "principals")
                await writer.ensure_index(loaded.signature)
                state["writer"] = writer
                state["projector"] = Projector.on_postgres(settings, make_engine(settings), writer, loaded)
        projector_: Projector = state["projector"]
        return projector_

    async def apply(keys: DirtyKeys) -> Any:
        return await (await projector()).apply(keys, lane)

    async def write_block() -> str | None:
        # The writer's index if the projector is built; else (its ensure_index met the block) one of its own.
        if "writer" not in state and "block_probe" not in state:
            state["block_probe"] = IndexWriter(make_client(settings), settings)
        writer: IndexWriter = state.get("writer") or state["block_probe"]
        block: str | None = await writer.write_block()
        return block

    progress = LaneProgress(lane, time.monotonic())
    handler = BatchHandler(
        lane,
        lane_topics(settings, "content"),
        apply,
        DeadLetters(dlq, lane).send,
        checkpoint=Checkpoint(FaustAcks(app)),
        max_attempts=settings.streams.max_attempts,
        write_block=write_block,
        progress=progress,
        fast_path=lane == "principals",
    )

    @app.agent(source, name=f"cdc-{lane}")
    async def cdc(stream: faust.StreamT) -> None:
        if lane == "content":
            max_events = settings.streams.content_batch_max_events
        else:
            max_events = settings.streams.batch_max_events
        linger = settings.streams.batch_linger_ms / 1000
        # take_events exists on faust.Stream at runtime but is missing from the StreamT stub.
        async for events in stream.take_events(max_events, within=linger):  # type: ignore[attr-defined]
            # The handler's checkpoint holds the batch's offsets from here until each record is applied or
            # dead-lettered (take_events' own acknowledgement alone commits nothing: `FaustAcks`).
            progress.fetched(time.monotonic())
            try:
                await handler.handle([event.message for event in events])
                progress.applied(time.monotonic())
            except IndexSchemaError as exc:
                # The settings do not fit the live index (dimension, embedder, analyzer): no batch can ever
                # apply, and dead-lettering them all would empty the stream. Stop hard, acking nothing, so
                # the operator runs `ki rebuild` (or fixes the settings) and the worker resumes where it was.
                log.critical("index does not match the settings: %s", exc)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_INDEX_MISMATCH)

    if lane == "access":
        swept: dict[str, Any] = {"clock": None}

        @app.timer(settings.streams.expiry_sweep_s, on_leader=False)
        async def expiry_sweep() -> None:
            """Documents whose expiry passed without a change: re-projected, so their rows leave the index (every
            access worker sweeps; the writes are conditional and idempotent). A failure waits for the next tick."""
            since = expiry_sweep_since(swept["clock"], settings.streams.expiry_sweep_s)
            try:
                stats, swept["clock"] = await (await projector()).sweep_expired(since, lane)
            except Exception as exc:  # PostgreSQL or OpenSearch away: the next tick sweeps the same window again
                log.warning("expiry sweep failed, retried in %.0f s: %s", settings.streams.expiry_sweep_s, exc)
                return
            if stats.rows_deleted:
                log.info("expiry sweep: %d rows of expired documents deleted", stats.rows_deleted)

    identity = TopicIdentity()
    identity_lock = threading.Lock()

    def read_topic_ids() -> None:
        """Which of the lane's topics were deleted and created again since it started (streams.liveness)."""
        if not identity_lock.acquire(blocking=False):
            return  # another scrape is reading them
        try:
            admin = state.setdefault("admin", make_kafka_admin(settings))
            before = identity.recreated
            if identity.observe(topic_ids(admin, lane_topics(settings, lane))) != before:
                log.error("%s lane: topics deleted and created again under it: %s; restarting it reads them "
                          "from their start", lane, ", ".join(identity.recreated))  # fmt: skip
        except Exception as exc:  # the broker briefly away: the next scrape looks again
            log.warning("topic ids not read: %s", exc)
        finally:
            identity_lock.release()

    async def read_lag() -> Liveness:
        # Reading the lag asks the broker, which can take many seconds while a group rebalances: wait for
        # it a moment, then answer with the values as they are (the reading lands for the next scrape), so
        # a scrape never hangs on Kafka.
        reading = asyncio.gather(asyncio.to_thread(metrics.update_lag, settings), asyncio.to_thread(read_topic_ids))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), timeout=LAG_READ_WAIT_S)
        verdict = progress.verdict(
            metrics.LANE_LAG.get(lane), time.monotonic(), settings.streams.stall_after_s, identity.recreated
        )
        metrics.SECONDS_IDLE.labels(lane=lane).set(verdict.idle_s)
        metrics.LANE_STALLED.labels(lane=lane).set(int(verdict.stalled))
        return verdict

    @app.page("/healthz")
    async def health_page(self: Any, request: Any) -> Any:
        """Liveness that means progress (streams.liveness): 503 when the lane has lag and did nothing; 200 with
        `"status": "paused"` and why while it waits on purpose (the index refuses writes)."""
        verdict = await read_lag()
        return self.json(verdict.to_json(), status=503 if verdict.stalled else 200)

    @app.page("/metrics")
    async def metrics_page(self: Any, request: Any) -> Any:
        await read_lag()
        if lane == "content" and "writer" in state:  # rows the access lane wrote text first
            with contextlib.suppress(TimeoutError, KiError):  # a scrape answers what it has
                waiting, oldest_s = await asyncio.wait_for(state["writer"].pending_vectors(), LAG_READ_WAIT_S)
                metrics.VECTORS_PENDING.set(waiting)
                metrics.OLDEST_PENDING.set(oldest_s)
        return self.bytes(generate_latest(), content_type="text/plain")

    return app


class DeadLetters:
    """One lane's side of the dead-letter topic: a record that can never be applied, with why (its value:
    `streams.dead_letters.letter_value`). `send` returns once the broker acknowledged the dead letter, and
    raises if it refused it."""

    def __init__(self, topic: Any, lane: Lane) -> None:
        self.topic, self.lane = topic, lane

    async def send(self, message: Any, failure: Failure) -> None:
        value = letter_value(
            self.lane,
            failure,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
            at_ms=int(time.time() * 1000),
        )
        # Faust's `send` only queues the record: its result is the delivery. Until the broker acknowledged it,
        # the record is not handled (its offset must not be committed), and a refused delivery must raise,
        # not pass as a warning in Faust's log.
        delivery = await self.topic.send(key=message.key, value=value)
        await delivery
        metrics.DLQ_EVENTS.labels(lane=self.lane, table=message.topic.rsplit(".", 1)[-1]).inc()
        log.warning("dead-lettered %s[%s]@%s: %s", message.topic, message.partition, message.offset, failure.reason)
