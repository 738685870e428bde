"""Smoke test of the CDC path: a row inserted, updated and deleted in every captured table arrives on its
topic as Debezium `c`, `u`, `d` and then a tombstone, keyed by primary key."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from sqlalchemy import Engine, text

from ki.db.models import CAPTURED_TABLES
from ki.settings import Settings
from projections.cdc import ChangeEvent, decode, topic_name
from projections.dirty import WrittenWith, written_with
from streams.source import PostgresSource
from tests.conftest import wait_for
from tests.integration.world import World

pytestmark = pytest.mark.stack

# For each table: the column to update and its new value.
UPDATES = {
    "projects": ("name", "'renamed'"),
    "matters": ("title", "'renamed'"),
    "ontology_nodes": ("label", "'renamed'"),
    "sources": ("name", "'renamed'"),
    "source_objects": ("acl_known", "true"),
    "group_memberships": ("member_principal", "'user:renamed'"),
    "principal_aliases": ("principal", "'user:renamed'"),
    "documents": ("title", "'renamed'"),
    "document_versions": ("status", "'executed'"),
    "source_observations": ("deleted_at", "now()"),
    "grants": ("effect", "'deny'"),
}


def test_every_captured_table_is_covered() -> None:
    assert set(UPDATES) == set(CAPTURED_TABLES)


def _end_offsets(consumer: Consumer, topic: str) -> list[TopicPartition]:
    """End offset of every partition; empty while the topic is missing or still electing its leaders."""
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
        return [
            TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in partitions
        ]
    except KafkaException:
        return []


@pytest.mark.parametrize("table", CAPTURED_TABLES)
def test_insert_update_delete_arrive_as_c_u_d_and_tombstone(engine: Engine, settings: Settings, table: str) -> None:
    topic = topic_name(settings.kafka.topic_prefix, table)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"cdc-smoke-{table}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        start = _end_offsets(consumer, topic)
        with engine.begin() as conn:
            w = World(conn)
            project = w.project()
            source = w.source("sharepoint")
            obj = w.source_object(source)
            doc = w.document(project, "Vertrag")
            version = w.version(doc, "Text", status="draft", latest=False)
            inserts = {
                "projects": lambda: project,
                "sources": lambda: source,
                "source_objects": lambda: obj,
                "documents": lambda: doc,
                "document_versions": lambda: version,
                "matters": lambda: conn.execute(
                    text("INSERT INTO matters (project_id, title) VALUES (:p, 'M') RETURNING id"), {"p": project}
                ).scalar(),
                "ontology_nodes": lambda: conn.execute(
                    text("INSERT INTO ontology_nodes (kind, key, label) VALUES ('doc_type', :k, 'L') RETURNING id"),
                    {"k": f"smoke-{w.tag}"},
                ).scalar(),
                "group_memberships": lambda: w.member(f"group:{w.tag}", "user:a"),
                "principal_aliases": lambda: conn.execute(
                    text("INSERT INTO principal_aliases (alias, principal) VALUES (:a, 'user:a') RETURNING id"),
                    {"a": f"user:alias-{w.tag}"},
                ).scalar(),
                "source_observations": lambda: w.observe(version, obj),
                "grants": lambda: w.grant("project", project, "user:a"),
            }
            row_id = inserts[table]()
        column, value = UPDATES[table]
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {table} SET {column} = {value} WHERE id = :id"), {"id": row_id})
        with engine.begin() as conn:
            # Cascades remove the children; deleting the project removes everything this test made.
            conn.execute(text(f"DELETE FROM {table} WHERE id = :id"), {"id": row_id})
            conn.execute(text("DELETE FROM projects WHERE id = :p"), {"p": project})
            conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": source})

        if not start:
            wait_for(lambda: _end_offsets(consumer, topic), timeout=60, what=f"topic {topic}")
            start = [TopicPartition(tp.topic, tp.partition, 0) for tp in _end_offsets(consumer, topic)]
        consumer.assign(start)
        seen: list[str] = []

        def ops_for_our_row() -> list[str] | None:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                key = json.loads(message.key())
                if key.get("id") == row_id:
                    seen.append(json.loads(message.value())["op"] if message.value() else "tombstone")
            return seen if "tombstone" in seen else None

        ops = wait_for(ops_for_our_row, timeout=60, interval=0, what=f"c/u/d/tombstone on {topic}")
        assert ops == ["c", "u", "d", "tombstone"]
    finally:
        consumer.close()


def test_an_insert_made_with_the_row_it_points_at_is_recognised_from_its_event(
    engine: Engine, settings: Settings
) -> None:
    """The principals lane's skip (`projections.dirty.written_with`) rests on Debezium's txId being the xid
    PostgreSQL stores as the row's xmin: an import's grants and observations are found written with their
    document, version and object; once those rows are written again by another transaction, no longer."""
    topics = [topic_name(settings.kafka.topic_prefix, t) for t in ("grants", "source_observations")]
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "cdc-written-with",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    project = source = 0  # removed at the end, with everything below them
    try:
        start = [tp for topic in topics for tp in _end_offsets(consumer, topic)]
        with engine.begin() as conn:  # one upstream import: a document with its version, object and grants
            w = World(conn)
            project, source = w.project(), w.source("sharepoint")
            obj, doc = w.source_object(source), w.document(project, "Vertrag")
            version = w.version(doc, "Text", status="draft", latest=False)
            ours = {
                ("source_observations", w.observe(version, obj)),
                ("grants", w.grant("document", doc, "user:a")),
                ("grants", w.grant("source_object", obj, "user:b")),
            }
        if len(start) < len(topics):
            wait_for(lambda: all(_end_offsets(consumer, t) for t in topics), timeout=60, what="both topics")
            start = [TopicPartition(tp.topic, tp.partition, 0) for t in topics for tp in _end_offsets(consumer, t)]
        consumer.assign(start)
        anchors: dict[tuple[str, int], WrittenWith | None] = {}

        def all_of_ours() -> bool:
            message = consumer.poll(0.5)
            if message is not None and not message.error() and message.value():
                event = decode(message.topic(), message.key(), message.value())
                if isinstance(event, ChangeEvent) and (event.table, (event.after or {}).get("id")) in ours:
                    anchors[(event.table, event.after["id"])] = written_with(event)  # type: ignore[index]
            return set(anchors) == ours

        wait_for(all_of_ours, timeout=60, interval=0, what="the import's grant and observation events")
        found = {a for a in anchors.values() if a is not None}
        assert {(a.table, a.row_id) for a in found} == {("document_versions", version), ("documents", doc),
                                                          ("source_objects", obj)}  # fmt: skip
        source_reads = PostgresSource(engine, settings.security)
        assert source_reads.written_by(found) == found
        with engine.begin() as conn:  # another transaction writes the document and the object again
            conn.execute(text("UPDATE documents SET title = 'Vertrag (neu)' WHERE id = :d"), {"d": doc})
            conn.execute(text("UPDATE source_objects SET acl_known = true WHERE id = :o"), {"o": obj})
        assert {(a.table, a.row_id) for a in source_reads.written_by(found)} == {("document_versions", version)}
    finally:
        consumer.close()
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM projects WHERE id = :p"), {"p": project})
            conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": source})
