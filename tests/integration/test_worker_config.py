"""`ki --config FILE sync run` builds its worker from FILE: its consumer group, its index alias, its web port.

The worker is the one process whose settings were once fixed at import time (a module-level Faust app built
from the default config), so a config given on the command line silently did not reach it."""

from __future__ import annotations

import json
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from apps.dev.checkout import REPO_ROOT
from apps.runtime.processes import Child, free_port
from ki.clients import make_kafka_consumer
from ki.settings import Settings, load_settings
from streams.status import consumer_lag
from streams.topics import LANES, consumer_group, lane_topics
from tests.conftest import wait_for
from tests.integration.world import World

pytestmark = pytest.mark.stack


def start_at_the_end(settings: Settings) -> None:
    """Commit the log-end offsets for the new groups (both lanes), so its worker applies only what this
    test writes (from the beginning it would re-embed every earlier test's documents)."""
    for lane in LANES:
        consumer = make_kafka_consumer(settings, consumer_group(settings, lane), **{"enable.auto.commit": False})
        try:
            metadata = consumer.list_topics(timeout=10)
            ends = []
            for topic in lane_topics(settings, lane):
                for partition in metadata.topics[topic].partitions:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                    ends.append(TopicPartition(topic, partition, high))
            consumer.commit(offsets=ends, asynchronous=False)
        finally:
            consumer.close()


@pytest.fixture
def other_config(tmp_path: Path, settings: Settings, search: OpenSearch) -> Iterator[Path]:
    tag = uuid.uuid4().hex[:8]
    data = json.loads((REPO_ROOT / "config.json").read_text(encoding="utf-8"))
    data.setdefault("retrieval", {})["index_name"] = f"config-test-{tag}"
    ports = {"web_port": free_port(), "access_web_port": free_port(), "principals_web_port": free_port()}
    data.setdefault("streams", {}).update({"app_id": f"ki-config-test-{tag}", **ports})
    path = tmp_path / "other-config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    yield path
    search.indices.delete(index=f"config-test-{tag}--*", ignore=[404])


def test_a_worker_started_with_another_config_uses_its_group_alias_and_port(
    other_config: Path, settings: Settings, engine: Engine, search: OpenSearch
) -> None:
    other = load_settings(other_config)  # the same file plus this process's KI_* overrides, as the child sees it
    assert other.retrieval.index_name != settings.retrieval.index_name
    start_at_the_end(other)
    worker = Child(
        [sys.executable, "-m", "apps.cli", "--config", str(other_config), "sync", "run"],
        REPO_ROOT / "build" / "config-test-worker.log",
        cwd=REPO_ROOT,
    ).start()
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{other.streams.web_port}/metrics", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        failure = worker.wait_ready(answers, timeout_s=120)
        assert failure is None, f"no answer on the configured web port: {failure}; see {worker.log_path}"
        with engine.begin() as conn:
            w = World(conn)
            doc = w.document(w.project(), f"Konfigurationstest {w.tag}")
            version = w.version(doc, "Der Vermieter darf die Kaution nur für berechtigte Forderungen verwenden.")
            w.grant("document", doc, "user:config-test")

        def indexed_in_the_configured_alias() -> int:
            if not search.indices.exists_alias(name=other.retrieval.index_name):
                return 0
            search.indices.refresh(index=other.retrieval.index_name)
            body = {"query": {"term": {"document_version_id": str(version)}}}
            return int(search.count(index=other.retrieval.index_name, body=body)["count"])

        wait_for(indexed_in_the_configured_alias, timeout=180, what="the version's rows in the configured alias")
        for lane in LANES:
            committed = [p.committed for p in consumer_lag(other, lane)]
            assert committed and max(committed) > 0, f"the configured {lane} lane's group committed nothing"
    finally:
        worker.stop()
