"""docker-compose.yml must describe the same topology and ports as the native stack."""

from urllib.parse import urlparse

import yaml

from ki.settings import REPO_ROOT, load_settings


def _compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def _host_ports(service: dict) -> set[int]:
    return {int(mapping.split(":")[-2]) for mapping in service.get("ports", [])}


def test_compose_has_the_four_services_on_the_configured_ports() -> None:
    settings = load_settings(environ={})
    services = _compose()["services"]
    assert set(services) == {"postgres", "kafka", "connect", "opensearch", "prometheus", "grafana"}
    assert settings.database.port in _host_ports(services["postgres"])
    assert int(settings.kafka.bootstrap_servers.rsplit(":", 1)[1]) in _host_ports(services["kafka"])
    assert urlparse(settings.connect.url).port in _host_ports(services["connect"])
    assert urlparse(settings.opensearch.url).port in _host_ports(services["opensearch"])


def test_compose_postgres_uses_logical_decoding_and_opensearch_runs_without_security() -> None:
    services = _compose()["services"]
    assert "wal_level=logical" in services["postgres"]["command"]
    env = services["opensearch"]["environment"]
    assert env["DISABLE_SECURITY_PLUGIN"] == "true"
    assert env["discovery.type"] == "single-node"
    assert env["path.repo"]  # snapshots allowed, as on the native stack (`ki bench corpus` keeps its index there)
    assert services["connect"]["environment"]["CONNECT_VALUE_CONVERTER_SCHEMAS_ENABLE"] == "false"


def test_every_port_is_bound_to_loopback_only() -> None:
    for name, service in _compose()["services"].items():
        for mapping in service.get("ports", []):
            assert mapping.startswith("127.0.0.1:"), f"{name} exposes {mapping} beyond loopback"


def test_monitoring_shares_the_hosts_network_and_listens_on_loopback() -> None:
    """Prometheus must reach the API and the lanes, which listen on the host's loopback."""
    services = _compose()["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["network_mode"] == grafana["network_mode"] == "host"
    assert "--web.listen-address=127.0.0.1:59090" in prometheus["command"]
    assert grafana["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    mounted = {volume.split(":")[0] for volume in prometheus["volumes"] + grafana["volumes"]}
    # The API's scrape token is the operator's to write (a secret: never committed, see prometheus.yml).
    operator_written = {"./monitoring/metrics.token"}
    for path in (p for p in mounted if p.startswith("./") and p not in operator_written):
        assert (REPO_ROOT / path).exists(), f"compose mounts {path}, which is not in the repo"


def test_the_cluster_variant_matches_the_cluster_profile() -> None:
    """docker-compose.cluster.yml: the nodes of `ki stack up --cluster` on its default ports, with the client
    settings that profile writes (deploy/cluster.env), replicated by three with two in sync."""
    from apps.dev.stack.cluster import cluster_env
    from apps.dev.stack.secure import read_env_file
    from ki.settings import Settings

    compose = yaml.safe_load((REPO_ROOT / "docker-compose.cluster.yml").read_text())
    services = compose["services"]
    env = read_env_file(REPO_ROOT / "deploy" / "cluster.env")
    assert env == cluster_env(Settings(), {})
    brokers = [int(address.rsplit(":", 1)[1]) for address in env["KI_KAFKA__BOOTSTRAP_SERVERS"].split(",")]
    nodes = [urlparse(url).port for url in env["KI_OPENSEARCH__URL"].split(",")]
    assert [_host_ports(services[f"kafka-{n}"]) for n in (1, 2, 3)] == [{port} for port in brokers]
    assert [_host_ports(services[f"opensearch-{n}"]) for n in (1, 2, 3)] == [{port} for port in nodes]
    for n in (1, 2, 3):
        kafka = services[f"kafka-{n}"]["environment"]
        assert kafka["KAFKA_NODE_ID"] == n and kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 3
        assert (kafka["KAFKA_DEFAULT_REPLICATION_FACTOR"], kafka["KAFKA_MIN_INSYNC_REPLICAS"]) == (3, 2)
        assert len(kafka["CLUSTER_ID"]) == 22  # 16 bytes, URL-safe base64 without padding
        node = services[f"opensearch-{n}"]["environment"]
        assert node["node.name"] in node["cluster.initial_cluster_manager_nodes"].split(",")
        assert "discovery.type" not in node
    connect = services["connect"]["environment"]
    assert connect["OFFSET_STORAGE_REPLICATION_FACTOR"] == 3 and connect["CONNECT_PRODUCER_ACKS"] == "all"
    for name, service in services.items():
        for mapping in service.get("ports", []):
            assert mapping.startswith("127.0.0.1:"), f"{name} exposes {mapping} beyond loopback"
