"""Operator jobs: rebuild by replaying the topics, backfill from PostgreSQL, reconcile drift.

All three reuse the worker's `Projector`, so they write exactly what the live sync would. They report
through two callbacks: `progress` takes a line of text, `on_progress(unit, done, total)` how far the
current long step is (events read, versions projected); the CLI turns the latter into a progress bar or
plain lines (`apps.runtime.progress`), which this layer may not import.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from opensearchpy import AsyncOpenSearch
from sqlalchemy import Engine, text

from ki.clients import kafka_error, make_client, make_engine, make_kafka_consumer
from ki.embedding import create_embedder
from ki.settings import Settings
from projections.cdc import PoisonEvent, decode
from projections.dirty import DirtyKeys, dirty_keys
from projections.mapping import physical_index_name
from streams.sync import Projector, SyncStats
from streams.topics import cdc_topics
from streams.writer import IndexWriter, indices_with_signature

Progress = Callable[[str], None]
OnProgress = Callable[[str, int, int], None]  # (unit, done, total)
REPORT_EVERY_EVENTS = 500  # on_progress while reading the topics: often enough, not per event


def _print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _end_offsets(consumer: Consumer, topics: list[str]) -> dict[tuple[str, int], int]:
    metadata = consumer.list_topics(timeout=10)
    ends: dict[tuple[str, int], int] = {}
    for topic in topics:
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            continue  # no rows were ever written to that table
        for partition in info.partitions:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ends[(topic, partition)] = high
    return ends


def _no_progress(unit: str, done: int, total: int) -> None:
    pass


def read_topics(
    settings: Settings,
    *,
    start: dict[tuple[str, int], int] | None = None,
    progress: Progress = _print_progress,
    on_progress: OnProgress = _no_progress,
) -> tuple[DirtyKeys, dict[tuple[str, int], int], int, int]:
    """Read every CDC topic from `start` (default: the beginning) up to the end offsets seen now.

    Returns the accumulated dirty keys, the end offsets, and the counts of events and poison events.
    """
    consumer = make_kafka_consumer(
        settings, f"ki-replay-{uuid.uuid4().hex[:8]}", **{"enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    try:
        ends = _end_offsets(consumer, cdc_topics(settings))
        begin = start or {}
        assignment = [
            TopicPartition(t, p, begin.get((t, p), OFFSET_BEGINNING))
            for (t, p), high in ends.items()
            if high > begin.get((t, p), 0)
        ]
        keys = DirtyKeys()
        remaining = {(tp.topic, tp.partition) for tp in assignment}
        events = poison = 0
        total = sum(high - begin.get(tp, 0) for tp, high in ends.items())
        if not assignment:
            return keys, ends, 0, 0
        consumer.assign(assignment)
        on_progress("events", 0, total)
        while remaining:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                raise kafka_error(error)
            tp = (message.topic(), message.partition())
            if message.offset() < ends[tp]:
                events += 1
                try:
                    keys.update(dirty_keys(decode(message.topic(), message.key(), message.value())))
                except (PoisonEvent, ValueError, TypeError):
                    poison += 1
                if events % REPORT_EVERY_EVENTS == 0:
                    on_progress("events", events, total)
            if message.offset() + 1 >= ends[tp]:
                remaining.discard(tp)
        on_progress("events", events, total)
        progress(f"replay: read {events} events ({poison} undecodable, left to the worker's DLQ)")
        return keys, ends, events, poison
    finally:
        consumer.close()


def live_version_ids(engine: Engine) -> set[int]:
    """The versions that have rows in a correct index: of documents neither deleted nor expired, with some text."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT dv.id FROM document_versions dv JOIN documents d ON d.id = dv.document_id "
                "WHERE d.deleted_at IS NULL AND (d.expires_at IS NULL OR d.expires_at > now()) "
                "AND btrim(dv.text) <> ''"
            )
        )
        return {row.id for row in rows}


#: Batches of a rebuild, backfill or reconcile projected at once (`ki bench sync` measured 2 and 3).
REBUILD_IN_FLIGHT = 2


async def project_in_batches(
    projector: Projector,
    version_ids: set[int],
    on_progress: OnProgress,
    batch: int = 64,
    in_flight: int = REBUILD_IN_FLIGHT,
) -> SyncStats:
    """Project these versions `batch` at a time, `in_flight` batches at once: while one batch is written,
    the next is read from PostgreSQL and looks up its stored vectors (batches are disjoint versions, so
    they never race for a row). Progress is reported in version order."""
    total = SyncStats()
    ordered = sorted(version_ids)
    on_progress("versions", 0, len(ordered))
    running: deque[tuple[int, asyncio.Task[SyncStats]]] = deque()  # (the batch's last position, its task)

    async def settle_oldest() -> None:
        end, task = running.popleft()
        total.add(await task)
        on_progress("versions", end, len(ordered))

    try:
        for i in range(0, len(ordered), batch):
            ids = ordered[i : i + batch]
            running.append((i + len(ids), asyncio.create_task(projector.project_versions(ids))))
            if len(running) >= in_flight:
                await settle_oldest()
        while running:
            await settle_oldest()
    finally:
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
    return total


async def _fresh_index(
    settings: Settings, client: AsyncOpenSearch, physical: str, signature: str, progress: Progress
) -> IndexWriter:
    """The new physical index `physical` created and the writer into it. The live index's vectors are ours to reuse
    when it was built with the same embedder (an analyzer or mapping change): then only rows whose embedded string
    changed are embedded."""
    sources = await indices_with_signature(client, [settings.retrieval.index_name], signature)
    writer = IndexWriter(client, settings, index=physical, vector_sources=sources)
    await writer.create_physical(physical, signature)
    for source in sources:  # rows from before `embedding_key` get it first (none left: one search)
        await writer.key_older_rows(source)
    if sources:
        progress(f"rebuild: vectors of unchanged inputs are taken from {', '.join(sources)}")
    return writer


async def rebuild(
    settings: Settings, progress: Progress = _print_progress, on_progress: OnProgress = _no_progress
) -> str:
    """Replay the topics into a fresh physical index, verify it against PostgreSQL, swap the alias."""
    embedder = create_embedder(settings)
    client = make_client(settings)
    engine = make_engine(settings)
    try:
        physical = physical_index_name(settings, embedder.signature, generation=time.strftime("%Y%m%d%H%M%S"))
        writer = await _fresh_index(settings, client, physical, embedder.signature, progress)
        progress(f"rebuild: replaying the CDC topics into {physical}")
        keys, ends, _, _ = await asyncio.to_thread(read_topics, settings, progress=progress, on_progress=on_progress)
        projector = Projector.on_postgres(settings, engine, writer, embedder)
        content, access = await projector.resolve(keys)
        # Nobody searches the new index yet: no periodic refresh while it is loaded (each would write a
        # segment and build its HNSW graph); the sync's own refreshes still run where a read needs one.
        await writer.pause_refresh()
        try:
            stats = await project_in_batches(projector, content | access, on_progress)
        finally:
            await writer.resume_refresh()
        progress(
            f"rebuild: {stats.versions_projected} versions, {stats.rows_written} rows written, "
            f"{stats.rows_embedded} embedded, {stats.rows_reused} with a reused vector"
        )
        previous = await _verify_and_swap(settings, engine, writer, physical, progress)
        await _catch_up(settings, writer, projector, ends, previous, progress, on_progress)
        return physical
    finally:
        await client.close()
        engine.dispose()


async def _verify_and_swap(
    settings: Settings,
    engine: Engine,
    writer: IndexWriter,
    physical: str,
    progress: Progress,
    *,
    within: set[int] | None = None,
) -> list[str]:
    """Check every live version (of `within`, when given: the versions read; newer ones come with the
    catch-up) has rows in the new index, then swap the alias to it; return the indices it pointed at."""
    await writer.refresh()
    expected = await asyncio.to_thread(live_version_ids, engine)
    if within is not None:
        expected &= within
    indexed = await writer.indexed_versions("document_version_id", expected) if expected else set()
    missing = expected - indexed
    if missing:
        raise RuntimeError(
            f"rebuild: {len(missing)} live version(s) are missing from {physical} "
            f"(e.g. {sorted(missing)[:5]}); alias left unchanged"
        )
    previous = await writer.swap_alias(physical)
    progress(f"rebuild: alias {settings.retrieval.index_name} -> {physical} ({len(expected)} versions checked)")
    return previous


async def _catch_up(
    settings: Settings,
    writer: IndexWriter,
    projector: Projector,
    ends: dict[tuple[str, int], int],
    previous: list[str],
    progress: Progress,
    on_progress: OnProgress,
) -> None:
    """Project the events from `ends` on into the new index, then drop the indices it replaced."""
    # Changes that arrived while we rebuilt were written to the old index by the worker: replay them.
    catch_up, _, count, _ = await asyncio.to_thread(
        read_topics, settings, start=ends, progress=progress, on_progress=on_progress
    )
    if catch_up:
        await projector.apply(catch_up)
        progress(f"rebuild: caught up on {count} event(s) that arrived during the rebuild")
    for old in previous:
        await writer.delete_index(old)
        progress(f"rebuild: deleted the previous index {old}")


def stream_position(settings: Settings) -> dict[tuple[str, int], int]:
    """Every CDC partition's log end now: what the lanes have yet to read starts at or after it."""
    group = f"ki-replay-position-{uuid.uuid4().hex[:8]}"  # never joined: only its metadata and watermarks
    consumer = make_kafka_consumer(settings, group, **{"enable.auto.commit": False})
    try:
        return _end_offsets(consumer, cdc_topics(settings))
    finally:
        consumer.close()


def all_version_ids(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return {row.id for row in conn.execute(text("SELECT id FROM document_versions"))}


async def rebuild_from_postgres(
    settings: Settings, progress: Progress = _print_progress, on_progress: OnProgress = _no_progress
) -> str:
    """Rebuild without the topics' history (they were lost): PostgreSQL is read into a fresh physical index
    while the lanes keep writing the live one, then the alias is swapped and the events since the start are
    projected into the new index.

    Why nothing is missed: the CDC topics' log ends are recorded *before* PostgreSQL is read. A change
    committed before the read is in what the read sees; one committed after it reaches Kafka after the
    recorded ends, so the catch-up from those ends (after the swap) or the lanes (at the alias) project it.
    A change both see is projected twice, which is harmless: every write is the projection of PostgreSQL's
    current state, conditional on the sequence numbers it read (the stale-write guard)."""
    from streams.topics import compact_cdc_topics, ensure_topics

    # The topics first (a broker away fails here, before the model is loaded): the lanes and Debezium need them.
    created = await asyncio.to_thread(ensure_topics, settings)
    compacted = await asyncio.to_thread(compact_cdc_topics, settings)
    progress(
        f"rebuild: CDC topics: {len(created)} created, {len(compacted)} set to compaction"
        + (f" ({', '.join(created + compacted)})" if created or compacted else "")
    )
    embedder = create_embedder(settings)
    client = make_client(settings)
    engine = make_engine(settings)
    physical = ""
    swapped = False
    try:
        physical = physical_index_name(settings, embedder.signature, generation=time.strftime("%Y%m%d%H%M%S"))
        writer = await _fresh_index(settings, client, physical, embedder.signature, progress)
        ends = await asyncio.to_thread(stream_position, settings)
        progress(f"rebuild: stream position recorded ({len(ends)} partitions, {sum(ends.values())} events)")
        progress(f"rebuild: reading PostgreSQL into {physical}")
        ids = await asyncio.to_thread(all_version_ids, engine)
        projector = Projector.on_postgres(settings, engine, writer, embedder)
        await writer.pause_refresh()
        try:
            stats = await project_in_batches(projector, ids, on_progress)
        finally:
            await writer.resume_refresh()
        progress(
            f"rebuild: {stats.versions_projected} versions, {stats.rows_written} rows written, "
            f"{stats.rows_embedded} embedded, {stats.rows_reused} with a reused vector"
        )
        previous = await _verify_and_swap(settings, engine, writer, physical, progress, within=ids)
        swapped = True
        await _catch_up(settings, writer, projector, ends, previous, progress, on_progress)
        return physical
    finally:
        if physical and not swapped:  # failed or interrupted before the swap: the half-built index goes
            with contextlib.suppress(Exception):
                await client.indices.delete(index=physical, ignore_unavailable=True)
        await client.close()
        engine.dispose()


async def backfill(
    settings: Settings, on_progress: OnProgress = _no_progress, version_ids: Iterable[int] | None = None
) -> SyncStats:
    """Project every version (or only `version_ids`) straight from PostgreSQL (for topics without history)."""
    embedder = create_embedder(settings)
    client = make_client(settings)
    engine = make_engine(settings)
    try:
        writer = IndexWriter(client, settings)
        await writer.ensure_index(embedder.signature)
        if version_ids is not None:
            ids = set(version_ids)
        else:
            with engine.connect() as conn:
                ids = {row.id for row in conn.execute(text("SELECT id FROM document_versions"))}
        return await project_in_batches(Projector.on_postgres(settings, engine, writer, embedder), ids, on_progress)
    finally:
        await client.close()
        engine.dispose()


@dataclass
class ReconcileReport:
    missing_versions: int = 0
    stale_versions: int = 0
    rows_repaired: int = 0


async def reconcile(
    settings: Settings, progress: Progress = _print_progress, on_progress: OnProgress = _no_progress
) -> ReconcileReport:
    """Diff PostgreSQL against the index and repair: missing or stale versions are projected again,
    rows whose principal projection drifted are rewritten, rows of a version that lost some are rebuilt."""
    embedder = create_embedder(settings)
    client = make_client(settings)
    engine = make_engine(settings)
    report = ReconcileReport()
    try:
        writer = IndexWriter(client, settings)
        await writer.ensure_index(embedder.signature)
        await writer.refresh()
        expected = await asyncio.to_thread(live_version_ids, engine)
        indexed = await writer.all_indexed_versions()
        missing, stale = expected - indexed, indexed - expected
        report.missing_versions, report.stale_versions = len(missing), len(stale)
        progress(
            f"reconcile: {len(expected)} live versions, {len(indexed)} indexed; "
            f"{len(missing)} missing, {len(stale)} stale"
        )
        projector = Projector.on_postgres(settings, engine, writer, embedder)
        # Re-projecting every indexed version is cheap when nothing changed: unchanged rows are not
        # re-embedded and identical rows are not written at all.
        stats = await project_in_batches(projector, expected | indexed, on_progress)
        report.rows_repaired = stats.rows_written
        progress(f"reconcile: {stats.rows_written} row(s) repaired, {stats.rows_embedded} embedded")
        return report
    finally:
        await client.close()
        engine.dispose()
