"""The cluster profile (apps.dev.stack.cluster): three brokers and three OpenSearch nodes whose configuration
agrees on one cluster, every port apart, and settings the home remembers. Pure: nothing is started."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from apps.dev.stack.cluster import cluster_env, with_profile
from apps.dev.stack.connect import Connect
from apps.dev.stack.kafka import Kafka
from apps.dev.stack.manager import build_services
from apps.dev.stack.opensearch import OpenSearch
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.ports import shifted_ports
from apps.dev.stack.settings import stack_settings
from ki.settings import Settings, SettingsError, with_environment

RUNTIME: Any = SimpleNamespace(artifacts=SimpleNamespace(debezium_plugin_path="/plugins"))


def clustered(tmp_path: Path) -> Settings:
    base = with_environment(Settings(), {"KI_STACK__HOME": str(tmp_path)})
    return with_profile(base, cluster=True)


def test_the_profile_names_every_node_and_replicates_by_three(tmp_path: Path) -> None:
    settings = clustered(tmp_path)
    assert settings.kafka.brokers == ["127.0.0.1:59092", "127.0.0.1:59102", "127.0.0.1:59112"]
    assert settings.opensearch.urls == ["http://127.0.0.1:59200", "http://127.0.0.1:59210", "http://127.0.0.1:59220"]
    assert (settings.kafka.replication_factor, settings.kafka.min_insync_replicas) == (3, 2)
    assert settings.opensearch.number_of_replicas == 1 and stack_settings(settings).opensearch_heap == "768m"
    # A heap the caller set stays theirs.
    assert cluster_env(Settings(), {"KI_STACK__OPENSEARCH_HEAP": "2g"}).get("KI_STACK__OPENSEARCH_HEAP") is None


def test_the_home_remembers_it_is_a_cluster_until_wiped(tmp_path: Path) -> None:
    clustered(tmp_path)
    plain = with_environment(Settings(), {"KI_STACK__HOME": str(tmp_path)})
    remembered = with_profile(plain)  # `ki stack down` / `status` without --cluster
    assert stack_settings(remembered).cluster and len(remembered.kafka.brokers) == 3
    (tmp_path / "cluster.env").unlink()  # what `ki stack wipe` removes
    assert with_profile(plain) == plain


def test_services_are_every_node_with_ports_all_apart(tmp_path: Path) -> None:
    settings = clustered(tmp_path)
    services = build_services(settings, StackPaths.from_settings(settings))
    names = [svc.name for svc in services]
    assert names == ["postgres", "kafka", "kafka-2", "kafka-3", "opensearch", "opensearch-2", "opensearch-3", "connect"]
    ports = [port for svc in services for port in svc.ports]
    assert len(ports) == len(set(ports))
    assert len({svc.state_dir for svc in services}) == len(services)
    single = [svc.name for svc in build_services(Settings(), StackPaths(tmp_path))]
    assert single == ["postgres", "kafka", "opensearch", "connect"]


def test_brokers_form_one_quorum_with_replicated_internal_topics(tmp_path: Path) -> None:
    settings = clustered(tmp_path)
    paths = StackPaths.from_settings(settings)
    configs = [Kafka(settings, paths, node).config(RUNTIME) for node in (1, 2, 3)]
    assert [c["node.id"] for c in configs] == [1, 2, 3]
    assert len({c["controller.quorum.voters"] for c in configs}) == 1
    assert str(configs[0]["controller.quorum.voters"]).count("@") == 3
    assert configs[1]["advertised.listeners"] == "PLAINTEXT://127.0.0.1:59102"
    for config in configs:
        assert config["offsets.topic.replication.factor"] == 3 and config["transaction.state.log.min.isr"] == 2
        assert config["min.insync.replicas"] == 2
    # One cluster id for all, kept: a node formatted later joins the same cluster.
    ids = {Kafka(settings, paths, node).cluster_id() for node in (1, 2, 3)}
    assert len(ids) == 1
    # One broker keeps one replica of everything, whatever the topics' setting says.
    single = Kafka(Settings(), StackPaths(tmp_path / "single")).config(RUNTIME)
    assert single["controller.quorum.voters"] == "1@127.0.0.1:59093" and single["offsets.topic.replication.factor"] == 1


def test_opensearch_nodes_discover_each_other_and_share_the_snapshot_location(tmp_path: Path) -> None:
    settings = clustered(tmp_path)
    paths = StackPaths.from_settings(settings)
    nodes = [OpenSearch(settings, paths, node).settings_yml() for node in (1, 2, 3)]
    assert [n["node.name"] for n in nodes] == ["ki-node-1", "ki-node-2", "ki-node-3"]
    assert all(n["discovery.seed_hosts"] == nodes[0]["discovery.seed_hosts"] for n in nodes)
    assert all("discovery.type" not in n for n in nodes)
    assert len({n["path.repo"] for n in nodes}) == 1
    assert nodes[2]["http.port"] == 59220
    assert OpenSearch(Settings(), StackPaths(tmp_path)).settings_yml()["discovery.type"] == "single-node"


def test_connect_replicates_its_topics_and_waits_for_every_in_sync_replica(tmp_path: Path) -> None:
    settings = clustered(tmp_path)
    config = Connect(settings, StackPaths.from_settings(settings)).config(RUNTIME)
    assert config["offset.storage.replication.factor"] == 3 and config["producer.acks"] == "all"
    assert config["bootstrap.servers"] == settings.kafka.bootstrap_servers


def test_shifting_a_cluster_moves_every_node(tmp_path: Path) -> None:
    env = shifted_ports(clustered(tmp_path), 1000)
    assert env["KI_KAFKA__BOOTSTRAP_SERVERS"] == "127.0.0.1:60092,127.0.0.1:60102,127.0.0.1:60112"
    assert env["KI_OPENSEARCH__URL"].count(",") == 2


@pytest.mark.parametrize(
    ("variables", "field"),
    [
        ({"KI_KAFKA__MIN_INSYNC_REPLICAS": "2"}, "min_insync_replicas"),
        ({"KI_OPENSEARCH__URL": "http://a:1,https://b:2"}, "url"),
    ],
)
def test_settings_that_could_never_work_are_refused(variables: dict[str, str], field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        with_environment(Settings(), variables)


def test_stopping_no_nodes_is_nothing_to_do() -> None:
    """`down` leaves out an optional service that never started (Keycloak): an empty kind stops nothing."""
    from apps.dev.stack.manager import _stop_nodes

    assert _stop_nodes([]) == []


def test_independent_services_start_together_and_connect_after_them(tmp_path: Path) -> None:
    from apps.dev.stack.manager import _start_waves

    settings = clustered(tmp_path)
    waves = _start_waves(build_services(settings, StackPaths.from_settings(settings), optional=True))
    assert [[svc.name for svc in wave] for wave in waves] == [
        ["postgres", "kafka", "kafka-2", "kafka-3", "opensearch", "opensearch-2", "opensearch-3"],
        ["connect"],
        ["keycloak"],
    ]


@pytest.mark.parametrize("quick", [False, True])
def test_quick_jit_stops_kafka_and_connect_at_the_first_compiler_and_leaves_opensearch(
    tmp_path: Path, quick: bool
) -> None:
    settings = with_environment(Settings(), {"KI_STACK__HOME": str(tmp_path), "KI_STACK__QUICK_JIT": str(quick)})
    runtime: Any = SimpleNamespace(
        java=SimpleNamespace(java=Path("/jdk/bin/java")),
        artifacts=SimpleNamespace(kafka_classpath="/kafka/libs/*", debezium_plugin_path="/plugins"),
    )
    for svc in build_services(settings, StackPaths.from_settings(settings)):
        if isinstance(svc, (Kafka, Connect)):
            svc.state_dir.mkdir(parents=True, exist_ok=True)
            argv = svc.jvm(runtime, "Main").argv
            assert ("-XX:TieredStopAtLevel=1" in argv) is quick, svc.name
        if isinstance(svc, OpenSearch):
            assert "TieredStopAtLevel" not in svc.jvm_options()
