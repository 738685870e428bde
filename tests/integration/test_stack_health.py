"""The real local stack (`ki stack up`) does what the sidecar relies on: German analysis and k-NN in
OpenSearch, the Debezium connector streaming from PostgreSQL, Kafka carrying its compacted topics."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import ConfigResource

from apps.dev.stack.connector import Connector
from apps.dev.stack.http import request_json
from ki.clients import make_kafka_admin
from ki.settings import Settings
from tests.conftest import wait_for

pytestmark = pytest.mark.stack


def opensearch(settings: Settings, method: str, path: str, body: Any = None) -> Any:
    status, answer = request_json(method, f"{settings.opensearch.urls[0]}{path}", body, timeout=30)
    assert status in (200, 201), f"{method} {path} -> {status}: {answer}"
    return answer


def analyze(settings: Settings, text: str) -> list[str]:
    answer = opensearch(settings, "POST", "/_analyze", {"analyzer": "german", "text": text})
    return [token["token"] for token in answer["tokens"]]


def test_german_analyzer_stems_plural_to_singular(settings: Settings) -> None:
    plural = analyze(settings, "Verträgen")
    assert plural == analyze(settings, "Vertrag")
    assert len(plural) == 1 and not plural[0].endswith("en"), plural


@pytest.fixture
def index(settings: Settings) -> Iterator[str]:
    name = f"ki-test-stack-{uuid.uuid4().hex[:12]}"
    yield name
    request_json("DELETE", f"{settings.opensearch.urls[0]}/{name}")


DOCS = {
    "near-other-tag": {"tag": "x", "vector": [1.0, 0.0, 0.0, 0.0], "text": "Protokoll der Sitzung"},
    "near-right-tag": {"tag": "y", "vector": [0.9, 0.1, 0.0, 0.0], "text": "Die Verträge der Mandantin"},
    "far-right-tag": {"tag": "y", "vector": [0.0, 0.0, 1.0, 0.0], "text": "Rechnung für März"},
}


def test_knn_lucene_hnsw_with_filter_and_bm25(settings: Settings, index: str) -> None:
    opensearch(
        settings,
        "PUT",
        f"/{index}",
        {
            "settings": {"index.knn": True, "number_of_shards": 1, "number_of_replicas": 0},
            "mappings": {
                "properties": {
                    "tag": {"type": "keyword"},
                    "text": {"type": "text", "analyzer": "german"},
                    "vector": {
                        "type": "knn_vector",
                        "dimension": 4,
                        "method": {"name": "hnsw", "engine": "lucene", "space_type": "cosinesimil"},
                    },
                }
            },
        },
    )
    opensearch(settings, "GET", f"/_cluster/health/{index}?wait_for_status=yellow&timeout=30s")
    for doc_id, doc in DOCS.items():
        opensearch(settings, "PUT", f"/{index}/_doc/{doc_id}", doc)
    opensearch(settings, "POST", f"/{index}/_refresh")

    def search(query: dict[str, Any]) -> list[str]:
        hits = opensearch(settings, "POST", f"/{index}/_search", {"size": 3, "query": query})["hits"]["hits"]
        return [hit["_id"] for hit in hits]

    knn = {"vector": [1.0, 0.0, 0.0, 0.0], "k": 1}
    assert search({"knn": {"vector": knn}}) == ["near-other-tag"]
    # The filter inside the knn clause: the nearest vector with tag y, not the nearest overall.
    assert search({"knn": {"vector": {**knn, "filter": {"term": {"tag": "y"}}}}}) == ["near-right-tag"]
    # BM25 through the german analyzer: the singular finds the plural.
    assert search({"match": {"text": "Vertrag"}}) == ["near-right-tag"]


def test_debezium_connector_and_its_task_are_running(settings: Settings) -> None:
    connector = Connector(settings)

    def running() -> tuple[str, list[str]] | None:
        state, tasks, _ = connector.state()
        return (state, tasks) if state == "RUNNING" and tasks and set(tasks) == {"RUNNING"} else None

    wait_for(running, timeout=60, what=f"connector {connector.name} RUNNING")
    status, config = request_json("GET", f"{connector.base}/config")
    assert status == 200
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert config["plugin.name"] == "pgoutput"
    assert config["slot.name"] == settings.connect.slot_name


def test_stack_up_resumes_a_connector_left_paused(settings: Settings) -> None:
    """`ki bench corpus` pauses the connector while it builds; interrupted, it leaves it paused. `up` (here its
    connector step, as `ki stack up` runs it on a running stack) must make it stream again, not wait it out."""
    from apps.dev.stack import manager

    connector = Connector(settings)
    connector.pause()
    try:
        assert manager.connect(settings, fresh=False) == 0
        state, tasks, _ = connector.state()
        assert state == "RUNNING" and set(tasks) == {"RUNNING"}
    finally:
        if connector.state()[0] == "PAUSED":
            connector.resume()


def test_postgres_streams_through_an_active_logical_slot(settings: Settings) -> None:
    with psycopg.connect(settings.database.dsn, connect_timeout=5) as conn:
        assert conn.execute("show wal_level").fetchone() == ("logical",)

        def slot() -> tuple[str, bool] | None:
            row = conn.execute(
                "select plugin, active from pg_replication_slots where slot_name = %s",
                (settings.connect.slot_name,),
            ).fetchone()
            return row if row and row[1] else None

        assert wait_for(slot, timeout=60, what="an active replication slot") == ("pgoutput", True)


def test_kafka_carries_compacted_connector_topics(settings: Settings) -> None:
    admin = make_kafka_admin(settings)
    prefix = f"{settings.kafka.topic_prefix}.public."

    def cdc_topics() -> list[str]:
        return sorted(t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix))

    # The heartbeat action query writes a published table every heartbeat interval, so its topic appears.
    topics = wait_for(cdc_topics, timeout=settings.connect.heartbeat_interval_ms * 3 / 1000 + 30, what="CDC topics")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topics[0])
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact"
