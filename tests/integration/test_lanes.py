"""The sync's two lanes against the real stack: access work never waits for embedding, content is written
in micro-batches, and a content write that loses a race to the access lane keeps its vectors."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import TopicPartition
from opensearchpy import NotFoundError, OpenSearch
from sqlalchemy import Engine, text

from ki.clients import make_client, make_kafka_consumer
from ki.embedding import Embedder, create_embedder
from ki.settings import Settings
from projections.dirty import DirtyKeys
from streams.sync import Projector, SyncStats
from streams.topics import Lane
from streams.writer import IndexWriter
from tests.conftest import wait_for
from tests.integration.sync_harness import Worker, assert_index_equals_rebuild, wait_until_synced
from tests.integration.world import World

pytestmark = pytest.mark.stack


def paragraphs(word: str, n: int) -> str:
    return "\n\n".join(
        f"§ {i} {word}: Der Auftragnehmer erbringt die Leistung {i} nach den Regeln der Technik und haftet für "
        f"Mängel nach den gesetzlichen Vorschriften; die Abnahme erfolgt schriftlich binnen {i} Wochen." * 2
        for i in range(n)
    )


def make_documents(engine: Engine, count: int, body: str) -> tuple[str, int, list[int], list[int]]:
    """`count` documents, each with one observed, final version; returns (tag, project, documents, versions)."""
    with engine.begin() as conn:
        w = World(conn)
        project = w.project()
        obj = w.source_object(w.source())
        docs, versions = [], []
        for i in range(count):
            doc = w.document(project, f"Werkvertrag {i} {w.tag}")
            version = w.version(doc, body)
            w.observe(version, obj)
            docs.append(doc)
            versions.append(version)
        w.grant("project", project, f"group:bau-{w.tag}")
        return w.tag, project, docs, versions


def rows_of(search: OpenSearch, index: str, document_id: int) -> list[dict]:
    """The document's rows; none while the index does not exist yet (a first worker creates it on start)."""
    body = {"query": {"term": {"document_id": str(document_id)}}, "size": 1000, "_source": {"excludes": ["embedding"]}}
    try:
        search.indices.refresh(index=index)
        return [hit["_source"] for hit in search.search(index=index, body=body)["hits"]["hits"]]
    except NotFoundError:
        return []


def dlq_end(settings: Settings) -> int:
    consumer = make_kafka_consumer(settings, f"dlq-probe-{uuid.uuid4().hex[:8]}")
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(settings.streams.dlq_topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_the_access_lane_alone_applies_access_changes_soft_deletes_and_new_text_leaving_vectors_to_the_content_lane(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    alias = settings.retrieval.index_name
    tag, _project, (a, b, c), (_va, vb, _vc) = make_documents(engine, 3, paragraphs("alt", 3))
    both = Worker(settings, name="lanes-both")
    both.start()
    try:
        wait_for(lambda: all(rows_of(search, alias, d) for d in (a, b, c)), timeout=180, what="the documents indexed")
    finally:
        both.stop()
    before_b = {row["meta"]["content_hash"] for row in rows_of(search, alias, b)}

    access = Worker(settings, name="lanes-access-only", lane="access")
    access.start()
    try:
        with engine.begin() as conn:
            w = World(conn)
            w.grant("document", a, f"user:anna-{tag}")
            # B: new text (needs embedding) and a new grant in the same transaction.
            conn.execute(
                text("UPDATE document_versions SET text = :t WHERE id = :v"), {"t": paragraphs("neu", 4), "v": vb}
            )
            w.grant("document", b, f"user:bert-{tag}")
            conn.execute(text("UPDATE documents SET deleted_at = now() WHERE id = :d"), {"d": c})

        def allowed(doc: int, who: str) -> bool:
            rows = rows_of(search, alias, doc)
            return bool(rows) and all(who in row["allowed_principals"] for row in rows)

        wait_for(lambda: allowed(a, f"user:anna-{tag}"), timeout=60, what="A's new grant, from the access lane alone")
        wait_for(lambda: allowed(b, f"user:bert-{tag}"), timeout=60, what="B's new grant, though B's text is pending")
        wait_for(lambda: not rows_of(search, alias, c), timeout=60, what="C's rows gone after its soft delete")

        # Text first: B's new text is searchable at once, its changed rows wait for their vectors.
        def new_text() -> list[dict] | None:
            chunks = [row for row in rows_of(search, alias, b) if row["chunk_kind"] == "chunk"]
            return chunks if chunks and all("neu" in row["text"] for row in chunks) else None

        chunks = wait_for(new_text, timeout=60, what="B's new text, from the access lane alone")
        assert all(row.get("vector_pending") for row in chunks if row["meta"]["content_hash"] not in before_b)
        assert access.counter("ki_sync_rows_embedded_total") == 0
        assert access.counter("ki_sync_rows_text_first_total") >= len(chunks)
    finally:
        access.stop()

    both = Worker(settings, name="lanes-both-again")
    both.start()
    try:
        wait_for(
            lambda: not any(row.get("vector_pending") for row in rows_of(search, alias, b)),
            timeout=180,
            what="B's vectors from the content lane",
        )
        wait_until_synced(settings, engine)
        assert_index_equals_rebuild(settings, engine, search, {a, b, c})
    finally:
        both.stop()


def test_constant_grant_changes_while_documents_are_re_embedded_send_nothing_to_the_dlq(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    alias = settings.retrieval.index_name
    tag, project, docs, versions = make_documents(engine, 4, paragraphs("eins", 3))
    worker = Worker(settings, name="lanes-grant-storm")
    worker.start()
    dlq_before = dlq_end(settings)
    stop = threading.Event()
    flips = 0

    def grant_storm() -> None:
        """Grant and revoke on the same documents, as fast as PostgreSQL takes it, until told to stop."""
        nonlocal flips
        while not stop.is_set():
            with engine.begin() as conn:
                w = World(conn)
                grant = w.grant("document", docs[flips % len(docs)], f"user:sturm-{tag}")
                if flips % 2:
                    conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": grant})
            flips += 1

    storm = threading.Thread(target=grant_storm, daemon=True)
    try:
        wait_for(lambda: all(rows_of(search, alias, d) for d in docs), timeout=180, what="the documents indexed")
        storm.start()
        for word in ("zwei", "drei"):  # re-embed every document twice while the grants keep changing
            with engine.begin() as conn:
                for version in versions:
                    conn.execute(
                        text("UPDATE document_versions SET text = :t WHERE id = :v"),
                        {"t": paragraphs(word, 3), "v": version},
                    )
            wait_for(
                lambda word=word: all(
                    all(word in row["text"] for row in rows_of(search, alias, d) if row["chunk_kind"] == "chunk")
                    for d in docs
                ),
                timeout=240,
                what=f"every document re-embedded with '{word}' under a grant storm",
            )
        stop.set()
        storm.join(timeout=30)
        assert flips > 20, f"the storm made only {flips} grant changes"
        wait_until_synced(settings, engine)
        assert dlq_end(settings) == dlq_before, "events went to the dead-letter topic"
        assert_index_equals_rebuild(settings, engine, search, set(docs))
    finally:
        stop.set()
        worker.stop()


class RacingEmbedder:
    """The real embedder; once its first call has embedded, another lane changes the same rows' projection."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.embedded: list[str] = []
        self.before_first_return: list[Callable[[], None]] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = self.inner.embed(texts)
        self.embedded.extend(texts)
        while self.before_first_return:
            self.before_first_return.pop()()
        return vectors


class Lanes:
    """Both lanes' projectors in this process, writing to a private index: each `apply` runs in an event
    loop of its own (in production each lane is a process of its own), so one can run inside the other's
    embedding call."""

    def __init__(self, settings: Settings, engine: Engine, embedder: RacingEmbedder, prefix: str) -> None:
        self.settings, self.engine, self.embedder = settings, engine, embedder
        self.index = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.access_stats: list[SyncStats] = []

    async def _apply(self, keys: DirtyKeys, lane: Lane | None, create: bool) -> SyncStats:
        client = make_client(self.settings)
        try:
            writer = IndexWriter(client, self.settings, index=self.index)
            if create:
                await writer.create_physical(self.index)
            return await Projector.on_postgres(self.settings, self.engine, writer, self.embedder).apply(keys, lane)
        finally:
            await client.close()

    def apply(self, keys: DirtyKeys, lane: Lane | None, *, create: bool = False) -> SyncStats:
        return asyncio.run(self._apply(keys, lane, create))

    def grant_during_embedding(self, document: int, principal: str) -> None:
        """During the next embedding call: commit a grant and let the access lane project it."""

        def access_lane_grants() -> None:
            with self.engine.begin() as conn:
                World(conn).grant("document", document, principal)
            self.access_stats.append(self.apply(DirtyKeys(access_documents={document}), "access"))

        self.embedder.embedded.clear()
        self.embedder.before_first_return.append(access_lane_grants)


def test_a_content_write_that_loses_to_the_access_lane_retries_with_its_vectors_and_embeds_nothing_twice(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    tag, _project, (doc,), (version,) = make_documents(engine, 1, paragraphs("vorher", 4))
    lanes = Lanes(settings, engine, RacingEmbedder(create_embedder(settings)), "ki-lanes-race")
    try:
        lanes.apply(DirtyKeys(content_versions={version}), None, create=True)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE document_versions SET text = :t WHERE id = :v"),
                {"t": paragraphs("nachher", 4), "v": version},
            )
        lanes.grant_during_embedding(doc, f"user:bert-{tag}")

        stats = lanes.apply(DirtyKeys(content_versions={version}), "content")

        assert lanes.access_stats[0].access_rows_updated > 0, "the access lane rewrote no row: there was no race"
        assert stats.conflict_rounds >= 1, "the content write did not lose the race it was set up to lose"
        embedded = lanes.embedder.embedded
        assert len(embedded) == len(set(embedded)), "a string was embedded twice"
        assert stats.rows_embedded == len(embedded)
        rows = rows_of(search, lanes.index, doc)
        assert rows and all(f"user:bert-{tag}" in row["allowed_principals"] for row in rows)
        assert all("nachher" in row["text"] for row in rows if row["chunk_kind"] == "chunk")
        assert all(row["access_version"] == 2 for row in rows)
    finally:
        search.indices.delete(index=lanes.index, ignore=[404])


def test_a_grant_committed_while_new_rows_are_embedded_reaches_them_though_the_access_lane_saw_no_rows(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    tag, _project, (doc,), (version,) = make_documents(engine, 1, paragraphs("neu", 3))
    lanes = Lanes(settings, engine, RacingEmbedder(create_embedder(settings)), "ki-lanes-new")
    try:
        lanes.apply(DirtyKeys(), None, create=True)  # an empty index
        lanes.grant_during_embedding(doc, f"user:carla-{tag}")

        lanes.apply(DirtyKeys(content_versions={version}), "content")

        assert lanes.access_stats[0].access_rows_updated == 0, "the access lane found rows to update"
        rows = rows_of(search, lanes.index, doc)
        assert rows and all(f"user:carla-{tag}" in row["allowed_principals"] for row in rows)
        embedded = lanes.embedder.embedded
        assert len(embedded) == len(set(embedded)), "a string was embedded twice"
    finally:
        search.indices.delete(index=lanes.index, ignore=[404])
