"""The sync worker against the real stack: PostgreSQL -> Debezium -> Kafka -> `ki sync run` -> OpenSearch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings
from streams.topics import consumer_group, lane_topics
from streams.writer import reuse_query
from tests.conftest import wait_for
from tests.integration.sync_harness import Worker, assert_index_equals_rebuild, wait_until_synced
from tests.integration.world import World

pytestmark = pytest.mark.stack

LONG_TEXT = "\n".join(
    f"Absatz {i}: Der Mieter verpflichtet sich, die Mietsache pfleglich zu behandeln und Schäden "
    f"unverzüglich anzuzeigen. Die Kaution beträgt {i} Monatsmieten und wird verzinst." * 3
    for i in range(12)
)


@pytest.fixture(scope="module")
def worker(settings: Settings) -> Iterator[Worker]:
    w = Worker(settings)
    w.start()
    yield w
    w.stop()


def rows_of(search: OpenSearch, settings: Settings, field: str, value: int) -> dict[str, dict]:
    alias = settings.retrieval.index_name
    if not search.indices.exists_alias(name=alias):
        return {}
    search.indices.refresh(index=alias)
    response = search.search(
        index=alias,
        body={"query": {"term": {field: str(value)}}, "size": 1000, "_source": {"excludes": ["embedding"]}},
    )
    return {hit["_id"]: hit["_source"] for hit in response["hits"]["hits"]}


def make_world(engine: Engine) -> dict[str, int]:
    with engine.begin() as conn:
        w = World(conn)
        project = w.project()
        source = w.source("local_fs")
        obj = w.source_object(source)
        doc = w.document(project, f"Mietvertrag {w.tag}", identifiers=["2 BvR 1234/19", "§ 823 BGB"])
        version = w.version(
            doc,
            LONG_TEXT,
            clauses=[{"clause_type_id": None, "locus": "§ 5", "text": "Die Kaution beträgt drei Mieten."}],
        )
        w.observe(version, obj)
        grant = w.grant("project", project, "group:legal-" + w.tag)
        w.grant("document", doc, "user:mallory-" + w.tag, "deny")
        member = w.member("group:legal-" + w.tag, "user:alice-" + w.tag)
        return {
            "project": project,
            "doc": doc,
            "version": version,
            "grant": grant,
            "member": member,
            "object": obj,
            "tag": int(w.tag, 16),
        }


def test_insert_update_access_and_delete_flow_through_to_the_index(
    worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    ids = make_world(engine)
    tag = format(ids["tag"], "08x")
    # One bulk request is not atomic for readers (a refresh can land in the middle of it): wait for all
    # three row kinds rather than for the first visible row.
    rows = wait_for(
        lambda: (r := rows_of(search, settings, "document_version_id", ids["version"]))
        and {"chunk", "clause", "profile"} <= {x["chunk_kind"] for x in r.values()}
        and r,
        timeout=90,
        what="the new version's chunk, clause and profile rows in OpenSearch",
    )
    kinds = sorted({r["chunk_kind"] for r in rows.values()})
    assert kinds == ["chunk", "clause", "profile"]
    body = [r for r in rows.values() if r["chunk_kind"] == "chunk"]
    assert len(body) > 2
    sample = body[0]
    assert sample["document_id"] == str(ids["doc"]) and sample["project_id"] == str(ids["project"])
    assert sample["identifiers"] == ["2 BvR 1234/19", "§ 823 BGB"]
    assert f"group:legal-{tag}" in sample["allowed_principals"]
    assert f"user:alice-{tag}" in sample["allowed_principals"]  # group member, expanded
    assert sample["denied_principals"] == [f"user:mallory-{tag}"]
    assert sample["access_version"] == 1
    assert "Mietvertrag" not in sample["text"]  # the context header is embedded, never stored

    # Edit one paragraph: only the chunks that contain it are embedded again.
    wait_until_synced(settings, engine)  # other tests' queued events would be embedded too and skew the count
    embedded_before = worker.counter("ki_sync_rows_embedded_total")
    old_hashes = {i: r["meta"]["content_hash"] for i, r in rows.items()}
    edited = LONG_TEXT.replace("Absatz 7:", "Absatz 7 (geändert):")
    with engine.begin() as conn:
        conn.execute(text("UPDATE document_versions SET text = :t WHERE id = :v"), {"t": edited, "v": ids["version"]})

    def edited_rows() -> dict | None:
        current = rows_of(search, settings, "document_version_id", ids["version"])
        return current if any("geändert" in r["text"] for r in current.values()) else None

    new_rows = wait_for(edited_rows, timeout=60, what="the edited paragraph in the index")
    changed = {i for i, r in new_rows.items() if old_hashes.get(i) != r["meta"]["content_hash"]}
    embedded = wait_for(lambda: worker.counter("ki_sync_rows_embedded_total") - embedded_before or None, timeout=10)
    assert 1 <= len(changed) <= 3
    assert embedded == len(changed)

    # Access-only changes: projection rewritten, nothing embedded.
    wait_until_synced(settings, engine)
    embedded_before = worker.counter("ki_sync_rows_embedded_total")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM group_memberships WHERE id = :m"), {"m": ids["member"]})

    def alice_gone() -> dict | None:
        current = rows_of(search, settings, "document_version_id", ids["version"])
        return current if all(f"user:alice-{tag}" not in r["allowed_principals"] for r in current.values()) else None

    after_membership = wait_for(alice_gone, timeout=60, what="the membership change in the projection")
    assert {r["access_version"] for r in after_membership.values()} == {2}

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": ids["grant"]})

    def grant_gone() -> dict | None:
        current = rows_of(search, settings, "document_version_id", ids["version"])
        return current if all(not r["allowed_principals"] for r in current.values()) else None

    after_revoke = wait_for(grant_gone, timeout=60, what="the revoked grant in the projection")
    assert {r["access_version"] for r in after_revoke.values()} == {3}

    with engine.begin() as conn:
        conn.execute(
            text("UPDATE source_observations SET deleted_at = now() WHERE document_version_id = :v"),
            {"v": ids["version"]},
        )
        conn.execute(
            text(
                "INSERT INTO grants (scope, source_object_id, principal, effect) "
                "VALUES ('source_object', :o, :p, 'allow')"
            ),
            {"o": ids["object"], "p": f"user:bob-{tag}"},
        )

    def observation_gone() -> dict | None:
        current = rows_of(search, settings, "document_version_id", ids["version"])
        ok = all(f"user:bob-{tag}" not in r["allowed_principals"] for r in current.values())
        return current if ok and worker.counter("ki_sync_access_versions_total") > 0 else None

    wait_for(observation_gone, timeout=60, what="the removed observation in the projection")
    assert worker.counter("ki_sync_rows_embedded_total") == embedded_before

    # Delete the document: every row goes, and with them its vectors leave the vector store (the index,
    # searched by `embedding_key`): a key of its rows is offered only by another live document's row.
    keys = [r["embedding_key"] for r in rows_of(search, settings, "document_id", ids["doc"]).values()]
    assert keys
    with engine.begin() as conn:
        conn.execute(text("UPDATE documents SET latest_final_version_id = NULL WHERE id = :d"), {"d": ids["doc"]})
        conn.execute(text("DELETE FROM documents WHERE id = :d"), {"d": ids["doc"]})
    wait_for(
        lambda: not rows_of(search, settings, "document_id", ids["doc"]),
        timeout=60,
        what="the deleted document's rows to disappear",
    )
    body = {**reuse_query(keys), "_source": ["document_id"]}
    offered = search.search(index=settings.retrieval.index_name, body=body)["hits"]["hits"]
    assert all(str(hit["_source"]["document_id"]) != str(ids["doc"]) for hit in offered)


def test_losing_the_last_active_observation_empties_the_projection_like_a_revocation(
    worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    """A version without an active observation is visible to nobody, so its exported projection must say
    so: soft delete, restore and hard delete of its one observation each rewrite `allowed_principals` and
    raise `access_version`, and the live rows end equal to a clean rebuild's."""
    with engine.begin() as conn:
        w = World(conn)
        project = w.project()
        obj = w.source_object(w.source())
        doc = w.document(project, f"Beobachtung {w.tag}")
        version = w.version(doc, "Der Mieter zahlt die Kaution in drei gleichen monatlichen Raten.")
        observation = w.observe(version, obj)
        w.grant("project", project, f"user:olga-{w.tag}")
    olga = f"user:olga-{w.tag}"

    def projected(sees: bool, access_version: int) -> None:
        def probe() -> dict | None:
            rows = rows_of(search, settings, "document_version_id", version)
            ok = rows and all(
                (olga in r["allowed_principals"]) == sees and r["access_version"] == access_version
                for r in rows.values()
            )
            return rows if ok else None

        what = f"every row with olga {'in' if sees else 'out'}, access_version {access_version}"
        wait_for(probe, timeout=90, what=what)

    projected(True, 1)
    changes = [
        ("UPDATE source_observations SET deleted_at = now() WHERE id = :o", False, 2),
        ("UPDATE source_observations SET deleted_at = NULL WHERE id = :o", True, 3),
        ("DELETE FROM source_observations WHERE id = :o", False, 4),
    ]
    for statement, sees, access_version in changes:
        with engine.begin() as conn:
            conn.execute(text(statement), {"o": observation})
        projected(sees, access_version)
    wait_until_synced(settings, engine)
    live = assert_index_equals_rebuild(settings, engine, search, {doc})
    assert all(r["allowed_principals"] == [] and r["denied_principals"] == [] for r in live.values())


def test_a_new_version_reuses_the_vectors_of_paragraphs_it_repeats(
    worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    """Draft -> final -> executed mostly repeat the text: only the new chunks are embedded."""
    with engine.begin() as conn:
        w = World(conn)
        doc = w.document(w.project(), f"Kaufvertrag {w.tag}")
        first = w.version(doc, LONG_TEXT, status="draft")
    wait_for(lambda: rows_of(search, settings, "document_version_id", first), timeout=90, what="version 1 indexed")
    wait_until_synced(settings, engine)
    # Read once both lanes are done: a version's rows can land in more than one write (those whose vectors are
    # reused before those still to be embedded), and a read in between sees some of them.
    first_rows = rows_of(search, settings, "document_version_id", first)
    embedded_before = worker.counter("ki_sync_rows_embedded_total")
    reused_before = worker.counter("ki_sync_rows_vector_reused_total")

    appended = LONG_TEXT + "\nAbsatz 12: Ergänzend gilt der Nachtrag vom 1. März über die Stellplätze."
    with engine.begin() as conn:
        second = World(conn).version(doc, appended, version_no=2, status="final")
    wait_for(lambda: rows_of(search, settings, "document_version_id", second), timeout=90, what="version 2 indexed")
    wait_until_synced(settings, engine)
    second_rows = rows_of(search, settings, "document_version_id", second)
    embedded = worker.counter("ki_sync_rows_embedded_total") - embedded_before
    reused = worker.counter("ki_sync_rows_vector_reused_total") - reused_before

    old_hashes = {r["meta"]["content_hash"] for r in first_rows.values()}
    repeated = [i for i, r in second_rows.items() if r["meta"]["content_hash"] in old_hashes]
    new = [i for i, r in second_rows.items() if r["meta"]["content_hash"] not in old_hashes]
    assert repeated and new  # the appended paragraph changes the tail chunk (and the profile row) only
    assert reused == len(repeated)
    assert embedded == len(new)

    # A reused vector is the very vector of the first version's row with the same embedded string.
    def vector(doc_id: str) -> tuple[str, list[float]]:
        got = search.get(index=settings.retrieval.index_name, id=doc_id, _source_includes="embedding,meta")
        return got["_source"]["meta"]["content_hash"], got["_source"]["embedding"]

    first_by_hash = dict(vector(i) for i in first_rows)
    for doc_id in repeated:
        digest, embedding = vector(doc_id)
        assert embedding == first_by_hash[digest]


def test_a_poison_event_goes_to_the_dlq_and_the_stream_goes_on(
    worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    topic = f"{settings.kafka.topic_prefix}.public.grants"
    marker = f"poison-{os.getpid()}-{id(worker)}"
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    producer.produce(topic, key=json.dumps({"id": -1}).encode(), value=f'{{"op": "zz", "{marker}": 1}}'.encode())
    producer.flush(10)

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"dlq-{marker}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([settings.streams.dlq_topic])

    def dead_lettered() -> dict | None:
        # Read in batches: the DLQ may already hold many older records (this consumer starts at the beginning).
        for message in consumer.consume(num_messages=500, timeout=1.0):
            if message.error():
                continue
            payload = json.loads(message.value())
            if marker in (payload.get("value") or ""):
                return payload
        return None

    try:
        payload = wait_for(dead_lettered, timeout=60, what="the poison event on the DLQ")
    finally:
        consumer.close()
    assert "op" in payload["reason"] and payload["topic"] == topic

    # The stream goes on: a later change still arrives.
    ids = make_world(engine)
    wait_for(
        lambda: rows_of(search, settings, "document_version_id", ids["version"]),
        timeout=90,
        what="a change after the poison event",
    )


def _gauges(worker: Worker, lane: str) -> dict[tuple[str, str], float]:
    """The worker's `ki_sync_consumer_lag` gauges of one lane: (topic, partition) -> records behind."""
    out = {}
    for line in worker.metrics_text().splitlines():
        if line.startswith("ki_sync_consumer_lag{") and f'lane="{lane}"' in line:
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(","))
            out[(labels["topic"].strip('"'), labels["partition"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return out


def test_metrics_report_consumer_lag_per_lane_and_partition_and_the_slot_s_retained_wal(
    worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    ids = make_world(engine)
    wait_for(lambda: rows_of(search, settings, "document_version_id", ids["version"]), timeout=90, what="sync")

    def content_drained() -> dict[tuple[str, str], float] | None:
        gauges = _gauges(worker, "content")
        return gauges if gauges and not any(gauges.values()) else None

    # The worker's group is the content lane's: its gauges drain to zero once the worker is idle.
    content = wait_for(content_drained, timeout=60, what="the content lane's lag gauges, drained to 0")
    # Each lane reports every partition of exactly its own topics.
    for lane, gauges in (("content", content), ("access", _gauges(worker, "access"))):
        assert {topic for topic, _ in gauges} == set(lane_topics(settings, lane)), lane
        assert len(gauges) == len(lane_topics(settings, lane)) * settings.kafka.partitions, lane
    retained = [line for line in worker.metrics_text().splitlines() if line.startswith("ki_sync_replication_slot")]
    assert retained and float(retained[0].rsplit(" ", 1)[1]) >= 0


def test_sync_status_shows_each_lane_s_group_and_lag(
    worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    ids = make_world(engine)
    wait_for(lambda: rows_of(search, settings, "document_version_id", ids["version"]), timeout=90, what="sync")
    wait_until_synced(settings, engine)

    def status() -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "apps.cli", "sync", "status"], cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    lines = status().stdout.splitlines()
    content = next(line for line in lines if line.startswith("content lane, "))
    access = next(line for line in lines if line.startswith("access lane, "))
    assert f"consumer group {consumer_group(settings, 'content')} (1 member(s)): total lag 0" in content
    assert f"over {len(lane_topics(settings, 'content')) * settings.kafka.partitions} partitions, 0 behind" in content
    assert f"consumer group {consumer_group(settings, 'access')} (" in access
    assert f"over {len(lane_topics(settings, 'access')) * settings.kafka.partitions} partitions" in access
    # A lane behind names its lagging partitions: stop the worker, change a version, read again.
    worker.stop()
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE document_versions SET text = text || ' (changed)' WHERE id = :id"), {"id": ids["version"]}
            )
        topic = f"{settings.kafka.topic_prefix}.public.document_versions"

        def content_behind() -> list[str] | None:
            out = status().stdout.splitlines()
            line = next(line for line in out if line.startswith("content lane, "))
            return out if "total lag 0 " not in line else None

        lines = wait_for(content_behind, timeout=60, what="the change to reach Kafka and show as content lag")
        at = lines.index(next(line for line in lines if line.startswith("content lane, ")))
        assert "total lag 1 " in lines[at] and lines[at].endswith(", 1 behind"), lines
        assert lines[at + 1].startswith(f"  {topic}[") and lines[at + 1].endswith(", lag 1"), lines
        # Then what the lane's worker says: none answers while it is stopped.
        assert lines[at + 2] == "  worker: no answer from a worker on this machine", lines
    finally:
        worker.start()  # the module's worker, for whatever runs after
