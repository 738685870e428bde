"""Rebuild by replay, duplicated and shuffled delivery, and a worker killed mid-batch — on the real stack."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, TopicPartition
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from apps.dev.checkout import REPO_ROOT
from ki.clients import make_client
from ki.embedding import create_embedder
from ki.settings import Settings
from projections.cdc import PoisonEvent, decode
from projections.dirty import DirtyKeys, dirty_keys
from streams.replay import read_topics
from streams.sync import Projector
from streams.topics import cdc_topics
from streams.writer import IndexWriter
from tests.conftest import wait_for
from tests.integration.sync_harness import Worker, dump
from tests.integration.test_sync import LONG_TEXT, make_world
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.second_lane]


def wait_until_replayable(settings: Settings, version_ids: set[int]) -> None:
    """Rebuild replays what is in Kafka now: wait until Debezium published our rows."""

    def published() -> bool:
        keys, *_ = read_topics(settings, progress=lambda _line: None)
        return version_ids <= keys.content_versions

    wait_for(published, timeout=60, interval=1.0, what=f"CDC events of versions {sorted(version_ids)}")


def end_offsets(consumer: Consumer, settings: Settings) -> dict[tuple[str, int], int]:
    """Each CDC topic partition's high watermark (topics not created yet are absent)."""
    metadata = consumer.list_topics(timeout=10)
    return {
        (topic, partition): consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        for topic in cdc_topics(settings)
        if topic in metadata.topics
        for partition in metadata.topics[topic].partitions
    }


def run_rebuild() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "apps.cli", "rebuild"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "alias" in result.stderr
    return result.stderr


def test_rebuild_twice_gives_an_identical_index(engine: Engine, search: OpenSearch, settings: Settings) -> None:
    worlds = [make_world(engine) for _ in range(2)]
    docs = {w["doc"] for w in worlds}
    wait_until_replayable(settings, {w["version"] for w in worlds})
    alias = settings.retrieval.index_name

    run_rebuild()
    first_index = set(search.indices.get_alias(name=alias))
    first = dump(search, alias, docs)
    log = run_rebuild()
    second_index = set(search.indices.get_alias(name=alias))
    second = dump(search, alias, docs)

    assert first_index != second_index  # a fresh physical index each time, swapped behind the alias
    assert first and first.keys() == second.keys()
    assert first == second
    assert not search.indices.exists(index=sorted(first_index)[0])  # the old index was dropped after the swap
    # Same embedder, same inputs: every vector is taken over from the index being replaced.
    assert f"vectors of unchanged inputs are taken from {sorted(first_index)[0]}" in log
    assert re.search(r"rows written, 0 embedded, [1-9][0-9]* with a reused vector", log), log[-2000:]


def test_duplicated_and_shuffled_events_converge_to_the_rebuilt_index(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "shuffle-test", "enable.auto.commit": False}
    )
    # Where each topic ended before the world was made: the replay below starts there. Everything before it is
    # other tests' history (the lane's fault tests leave thousands of events), which the projector would read
    # back from PostgreSQL for rows this test never compares.
    before = end_offsets(consumer, settings)
    world = make_world(engine)
    wait_until_replayable(settings, {world["version"]})
    run_rebuild()
    expected = dump(search, settings.retrieval.index_name, {world["doc"]})

    # Every CDC message since, delivered twice and in random order, one small batch at a time.
    messages = []
    try:
        for (topic, partition), high in end_offsets(consumer, settings).items():
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            start = max(low, before.get((topic, partition), 0))
            if high <= start:
                continue
            consumer.assign([TopicPartition(topic, partition, start)])
            while True:
                message = consumer.poll(5.0)
                assert message is not None, f"could not read {topic}[{partition}]"
                messages.append((message.topic(), message.key(), message.value()))
                if message.offset() + 1 >= high:
                    break
    finally:
        consumer.close()
    assert messages, "the world's rows published no CDC events"
    deliveries = messages * 2
    random.Random(1234).shuffle(deliveries)

    async def replay_into(index: str) -> None:
        client = make_client(settings)
        writer = IndexWriter(client, settings, index=index)
        await writer.create_physical(index)
        projector = Projector.on_postgres(settings, engine, writer, create_embedder(settings))
        try:
            for start in range(0, len(deliveries), 7):
                keys = DirtyKeys()
                for topic, key, value in deliveries[start : start + 7]:
                    try:
                        keys.update(dirty_keys(decode(topic, key, value)))
                    except PoisonEvent:  # another test's poison record: the worker dead-letters it too
                        continue
                await projector.apply(keys)
        finally:
            await client.close()

    index = f"shuffle-test-{random.Random().randrange(1 << 30)}"
    try:
        asyncio.run(replay_into(index))
        assert dump(search, index, {world["doc"]}) == expected
    finally:
        search.indices.delete(index=index, ignore=[404])


def test_a_worker_killed_mid_batch_loses_nothing_and_duplicates_nothing(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    worker = Worker(settings)
    worker.start()
    try:
        docs: dict[int, int] = {}
        with engine.begin() as conn:
            w = World(conn)
            project, source = w.project(), w.source("local_fs")
            w.grant("project", project, "group:kill-test")
            for n in range(12):
                obj = w.source_object(source)
                doc = w.document(project, f"Kündigung {n} {w.tag}")
                version = w.version(doc, LONG_TEXT.replace("Absatz", f"Absatz {n}-"))
                w.observe(version, obj)
                docs[doc] = version

        def some_rows_indexed() -> bool:
            found = dump_rows(search, settings, set(docs))
            return 0 < len({r["document_id"] for r in found.values()}) < len(docs) or len(found) > 0

        wait_for(some_rows_indexed, timeout=90, interval=0.05, what="the first rows of the batch")
        worker.kill()  # SIGKILL: no shutdown hooks, no offset commit for the batch in flight
        worker.start()

        def all_indexed() -> dict | None:  # every document's rows, each with its vector (text rows come first)
            found = dump_rows(search, settings, set(docs))
            per_doc = {d: [r for r in found.values() if r["document_id"] == str(d)] for d in docs}
            pending = any(r.get("vector_pending") for r in found.values())
            return found if all(per_doc.values()) and not pending else None

        wait_for(all_indexed, timeout=180, what="every document after the restart, with its vectors")
    finally:
        worker.stop()
    wait_until_replayable(settings, set(docs.values()))
    live = dump(search, settings.retrieval.index_name, set(docs))
    run_rebuild()
    rebuilt = dump(search, settings.retrieval.index_name, set(docs))
    assert live.keys() == rebuilt.keys()  # nothing lost, nothing extra
    assert live == rebuilt


def dump_rows(search: OpenSearch, settings: Settings, document_ids: set[int]) -> dict[str, dict]:
    alias = settings.retrieval.index_name
    if not search.indices.exists_alias(name=alias):
        return {}
    return dump(search, alias, document_ids)


def test_reconcile_repairs_a_deleted_row_and_a_drifted_projection(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    world = make_world(engine)

    def reconcile() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "apps.cli", "reconcile"], cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stderr

    reconcile()  # no worker runs in this module: reconcile itself indexes the missing version
    alias = settings.retrieval.index_name
    healthy = dump(search, alias, {world["doc"]})
    assert healthy
    victim, drifted = sorted(healthy)[:2]
    search.delete(index=alias, id=victim, refresh=True)
    search.update(index=alias, id=drifted, body={"doc": {"allowed_principals": ["user:intruder"]}}, refresh=True)
    assert dump(search, alias, {world["doc"]}) != healthy

    output = reconcile()
    assert "2 row(s) repaired" in output
    assert dump(search, alias, {world["doc"]}) == healthy
