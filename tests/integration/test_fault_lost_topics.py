"""Faults: the CDC topics are lost (issue 51, item 4) and `ki rebuild --from-postgres` recovers.

A running world (its own database, connector, slot, topics, consumer groups, index and worker: the eval isolation's
names, `apps.dev.eval.isolation`, since deleting the main stack's topics would take every other test's history) is
synced; then its CDC topics are deleted under the running connector and lanes. Changes keep coming (grants,
memberships, observations, text edits, new documents) before, during and after the recovery. At the end the index
equals a projection of PostgreSQL, `ki reconcile` finds nothing missing or stale, and the lanes follow the
recreated topics.

On the code before this change there was no such recovery: `ki rebuild` replays the topics, which no longer hold
the world's history, and refuses to swap ("live version(s) are missing"); `ki backfill` writes into the live index
and nothing ties it to the stream's position.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType
from opensearchpy import OpenSearch
from sqlalchemy import Engine, create_engine, text

from apps.dev.checkout import REPO_ROOT
from apps.dev.eval.isolation import drop, ensure_world, make_target
from apps.dev.stack.connector import Connector
from ki.clients import make_client, make_kafka_admin
from ki.embedding import create_embedder
from ki.settings import Settings, load_settings
from streams.replay import read_topics
from streams.sync import Projector
from streams.topics import cdc_topics
from streams.writer import IndexWriter
from tests.integration.change_stream import ChangeStream, FaultWorld, make_fault_world, version_text
from tests.integration.search_harness import SyncWorker
from tests.integration.sync_harness import dump, wait_until_synced, without_history

pytestmark = [pytest.mark.stack, pytest.mark.faults]

SYNC_TIMEOUT_S = 180


@dataclass
class Scene:
    settings: Settings
    env: dict[str, str]
    engine: Engine
    worker: SyncWorker


def _overrides(settings: Settings) -> dict[str, str]:
    """The world's names as environment overrides for the worker and the commands."""
    return {
        "KI_DATABASE__NAME": settings.database.name,
        "KI_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "KI_CONNECT__CONNECTOR_NAME": settings.connect.connector_name,
        "KI_CONNECT__SLOT_NAME": settings.connect.slot_name,
        "KI_CONNECT__PUBLICATION_NAME": settings.connect.publication_name,
        "KI_RETRIEVAL__INDEX_NAME": settings.retrieval.index_name,
        "KI_STREAMS__APP_ID": settings.streams.app_id,
        "KI_STREAMS__DLQ_TOPIC": settings.streams.dlq_topic,
    }


@pytest.fixture(scope="module")
def scene(settings: Settings) -> Iterator[Scene]:
    target = make_target(
        settings, f"lost_{uuid.uuid4().hex[:8]}", analyzer=settings.retrieval.text_analyzer, embedding_signature="lost"
    )
    env = _overrides(target.settings)
    own = load_settings(environ={**os.environ, **env})
    engine = create_engine(own.database.url, pool_pre_ping=True)
    worker: SyncWorker | None = None
    try:
        ensure_world(target, progress=lambda line: None)
        worker = SyncWorker(env)
        worker.start()
        yield Scene(own, env, engine, worker)
    finally:
        if worker is not None:
            worker.stop()
        engine.dispose()
        drop(target, progress=lambda line: None)


def _ki(scene: Scene, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apps.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **scene.env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _delete_cdc_topics(settings: Settings) -> list[str]:
    admin = make_kafka_admin(settings)
    existing = set(admin.list_topics(timeout=30).topics)
    doomed = [t for t in cdc_topics(settings) if t in existing]
    for future in admin.delete_topics(doomed, request_timeout=30).values():
        future.result(timeout=60)
    return doomed


def _cleanup_policies(settings: Settings) -> dict[str, str]:
    admin = make_kafka_admin(settings)
    existing = set(admin.list_topics(timeout=30).topics)
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in cdc_topics(settings) if t in existing]
    described = admin.describe_configs(resources, request_timeout=30)
    return {r.name: future.result(timeout=30)["cleanup.policy"].value for r, future in described.items()}


def _new_document(engine: Engine, world: FaultWorld, n: int) -> int:
    """A new document with one version in the world's project (every group of the world may see it)."""
    with engine.begin() as conn:
        doc = int(
            conn.execute(
                text("INSERT INTO documents (project_id, title) VALUES (:p, :t) RETURNING id"),
                {"p": world.project, "t": f"Nachtrag {n} {world.tag}"},
            ).scalar_one()
        )
        version = int(
            conn.execute(
                text(
                    "INSERT INTO document_versions (document_id, version_no, status, text) "
                    "VALUES (:d, 1, 'final', :t) RETURNING id"
                ),
                {"d": doc, "t": version_text(100 + n, 0)},
            ).scalar_one()
        )
        conn.execute(text("UPDATE documents SET latest_final_version_id = :v WHERE id = :d"), {"v": version, "d": doc})
    return doc


def _projected_from_postgres(scene: Scene, search: OpenSearch, documents: set[int]) -> dict[str, dict]:
    """These documents' rows as a projection of PostgreSQL now makes them, in a throwaway index."""
    index = f"ki-lost-expected-{uuid.uuid4().hex[:10]}"
    with scene.engine.connect() as conn:
        versions = sorted(
            row.id
            for row in conn.execute(
                text("SELECT id FROM document_versions WHERE document_id = ANY(:d)"), {"d": sorted(documents)}
            )
        )

    async def project() -> None:
        client = make_client(scene.settings)
        try:
            writer = IndexWriter(client, scene.settings, index=index)
            await writer.create_physical(index)
            projector = Projector.on_postgres(scene.settings, scene.engine, writer, create_embedder(scene.settings))
            await projector.project_versions(versions)
        finally:
            await client.close()

    try:
        asyncio.run(project())
        return dump(search, index, documents)
    finally:
        search.indices.delete(index=index, ignore=[404])


def _rebuild_from_postgres(scene: Scene, engine: Engine, world: FaultWorld) -> tuple[int, str, list[int]]:
    """`ki rebuild --from-postgres`, writing a new document at each of its steps (after the stream position
    is recorded, while PostgreSQL is read, after the swap): (exit code, its output, the documents written)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "apps.cli", "rebuild", "--from-postgres"],
        cwd=REPO_ROOT,
        env={**os.environ, **scene.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    written: list[int] = []
    steps = ("stream position recorded", "reading PostgreSQL", "rebuild: alias")
    for line in process.stdout:
        lines.append(line)
        if any(step in line for step in steps):
            written.append(_new_document(engine, world, len(written)))
    return process.wait(timeout=600), "".join(lines), written


def test_lost_cdc_topics_are_recovered_while_the_sync_keeps_running(scene: Scene, search: OpenSearch) -> None:
    settings, engine = scene.settings, scene.engine
    alias = settings.retrieval.index_name
    world = make_fault_world(engine, documents=6)
    wait_until_synced(settings, engine, timeout=SYNC_TIMEOUT_S)
    assert set(dump(search, alias, world.documents)), "the world was not indexed before the topics were lost"
    before = set(search.indices.get_alias(name=alias))

    deleted = _delete_cdc_topics(settings)
    assert deleted, "no CDC topic to delete"
    # The replaying rebuild cannot help (it would refuse to swap): the topics no longer hold the world's history.
    replayable, *_ = read_topics(settings, progress=lambda _line: None)
    assert not set(world.versions.values()) & replayable.content_versions
    stream = ChangeStream(engine, world, rate=4, seed=51).start()
    stream.wait_for_more(4)  # changes while the topics are gone (or auto-created again under the connector)

    code, output, during = _rebuild_from_postgres(scene, engine, world)
    assert code == 0, output[-3000:]
    assert len(during) == 3, output[-3000:]
    stream.wait_for_more(4)  # the lanes take over after the swap
    after = _new_document(engine, world, 99)
    stream.stop()

    documents = world.documents | set(during) | {after}
    assert set(search.indices.get_alias(name=alias)).isdisjoint(before), "the alias still points at the old index"
    assert all("compact" in policy for policy in _cleanup_policies(settings).values()), _cleanup_policies(settings)
    wait_until_synced(settings, engine, timeout=SYNC_TIMEOUT_S)
    live = dump(search, alias, documents)
    expected = _projected_from_postgres(scene, search, documents)
    assert {str(row["document_id"]) for row in expected.values()} >= {str(d) for d in during} | {str(after)}
    missing, extra = sorted(expected.keys() - live.keys()), sorted(live.keys() - expected.keys())
    assert not missing and not extra, f"rows missing from the index: {missing[:10]}, extra: {extra[:10]}"
    differing = sorted(k for k, row in without_history(live).items() if row != without_history(expected)[k])
    assert not differing, f"{len(differing)} row(s) differ from PostgreSQL's projection, e.g. {differing[:3]}"

    reconcile = _ki(scene, "reconcile")
    assert reconcile.returncode == 0, reconcile.stderr[-2000:]
    assert "0 missing, 0 stale" in reconcile.stderr + reconcile.stdout, reconcile.stderr[-2000:]
    assert scene.worker.process.alive, "the sync worker died"
    assert Connector(settings).state()[:2] == ("RUNNING", ["RUNNING"]), Connector(settings).state()
    assert stream.committed >= 8
