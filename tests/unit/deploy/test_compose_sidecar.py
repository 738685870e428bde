"""The sidecar's services in docker-compose.yml, docker-compose.secure.yml and docker-compose.cluster.yml: the
Dockerfile's image, commands `ki` accepts, settings that exist, health checks on the endpoints the servers have,
and a start order on healthy services."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apps.dev.checkout import REPO_ROOT
from apps.dev.stack.cluster import cluster_env
from apps.dev.stack.secure import SecureMaterial, client_env
from ki.settings import Settings, load_settings
from projections.lanes import LANES
from tests.unit.deploy.helpers import PROBE, assert_ki_command, image, setting_exists

FILES = ("docker-compose.yml", "docker-compose.secure.yml", "docker-compose.cluster.yml")
SIDECAR = {"ki-migrate", *(f"ki-sync-{lane}" for lane in LANES), "ki-api", "ki-mcp"}
LONG_RUNNING = SIDECAR - {"ki-migrate"}
JWT_SECRET = "/run/secrets/ki-api-jwt"


def _services(name: str) -> dict:
    return dict(yaml.safe_load((REPO_ROOT / name).read_text())["services"])


def _env(service: dict) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def _settings(service: dict) -> Settings:
    """The settings a service's process has: the image's config.json plus its KI_* variables. A secret's file
    (`<secret>_FILE`, read as the settings load) is not on this machine: a stand-in takes its content."""
    env = _env(service)
    for key in env:
        assert key.startswith("KI_") and setting_exists(key), f"{key}: no such setting"
    secrets = {key for key in env if key.endswith("_FILE") and setting_exists(key.removesuffix("_FILE"))}
    stand_ins = {key.removesuffix("_FILE"): "a-stand-in-for-the-file-content" for key in secrets}
    return load_settings(environ={**{k: v for k, v in env.items() if k not in secrets}, **stand_ins})


@pytest.mark.parametrize("name", FILES)
def test_every_sidecar_service_runs_the_dockerfiles_image_with_a_command_ki_accepts(name: str) -> None:
    services = _services(name)
    assert set(services) >= SIDECAR
    for service_name in SIDECAR:
        service = services[service_name]
        assert service["image"] == image(), service_name
        assert "entrypoint" not in service, f"{service_name}: the image's entrypoint is `ki`"
        assert_ki_command([str(word) for word in service["command"]], f"{name} {service_name}")
    built = [s for s in SIDECAR if "build" in services[s]]
    assert built in ([], ["ki-migrate"]), "built once, by the one-shot the others wait for"
    assert [s for s in services if services[s].get("image", "").startswith("ki-sidecar")] == sorted(
        SIDECAR, key=list(services).index
    )


@pytest.mark.parametrize("name", FILES)
def test_the_migration_runs_once_before_the_others_and_every_wait_is_on_a_healthy_or_finished_service(
    name: str,
) -> None:
    services = _services(name)
    migrate = services["ki-migrate"]
    assert migrate["restart"] == "no" and "healthcheck" not in migrate and "ports" not in migrate
    assert migrate["command"][0] in {"migrate", "stack"}  # `stack connect`: migrations plus the connector
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for service_name in LONG_RUNNING:
        service = services[service_name]
        depends = service["depends_on"]
        assert depends["ki-migrate"]["condition"] == "service_completed_successfully", service_name
        assert service["restart"] == "unless-stopped", service_name
    for service_name in SIDECAR:
        for target, wait in services[service_name]["depends_on"].items():
            condition = wait["condition"]
            assert condition in {"service_healthy", "service_completed_successfully"}, (service_name, target)
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{service_name} waits on {target}, which has no check"


@pytest.mark.parametrize("name", FILES)
def test_health_checks_probe_the_api_readyz_each_lanes_healthz_and_the_mcp_port(name: str) -> None:
    services = _services(name)
    for service_name in LONG_RUNNING:
        service = services[service_name]
        settings = _settings(service)
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1 : 1 + len(PROBE)] == PROBE, service_name
        targets = test[1 + len(PROBE) :]
        if service_name == "ki-api":
            expected = [f"http://127.0.0.1:{settings.api.port}/readyz"]
        elif service_name == "ki-mcp":
            expected = [f"tcp://127.0.0.1:{settings.mcp.port}"]
        else:
            lane = service["command"][service["command"].index("--lane") + 1]
            assert service_name == f"ki-sync-{lane}"
            expected = [f"http://127.0.0.1:{settings.streams.lane_web_port(lane)}/healthz"]
        assert targets == expected, service_name
        assert service["healthcheck"]["start_period"], f"{service_name}: loading the model takes seconds"


@pytest.mark.parametrize("name", FILES)
def test_the_servers_listen_beyond_loopback_only_with_a_secret_of_the_operators(name: str) -> None:
    """In a container the servers bind 0.0.0.0, where ki/exposure.py refuses the published jwt secret: each reads
    the operator's file, mounted as a compose secret; published ports stay on the host's loopback."""
    compose = yaml.safe_load((REPO_ROOT / name).read_text())
    services = compose["services"]
    for service_name, host_key, port_key in (("ki-api", "KI_API__HOST", "api"), ("ki-mcp", "KI_MCP__HOST", "mcp")):
        service = services[service_name]
        env = _env(service)
        assert env[host_key] == "0.0.0.0"
        assert env["KI_API__JWT__SECRET_FILE"] == JWT_SECRET and service["secrets"] == ["ki-api-jwt"]
        port = getattr(_settings(service), port_key).port
        for mapping in service.get("ports", []):
            assert mapping.startswith("127.0.0.1:") and mapping.endswith(f":{port}"), mapping
    assert compose["secrets"]["ki-api-jwt"]["file"] == "${KI_API_JWT_SECRET_FILE:-./deploy/api-jwt.secret}"
    assert "deploy/api-jwt.secret" in (REPO_ROOT / ".gitignore").read_text().splitlines()
    for service_name in (*(f"ki-sync-{lane}" for lane in LANES), "ki-migrate"):
        assert "ports" not in services[service_name] and "secrets" not in services[service_name]


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-compose.cluster.yml"])
def test_on_the_compose_network_the_clients_reach_the_services_by_name_and_scale_by_replicas(name: str) -> None:
    services = _services(name)
    for service_name in SIDECAR:
        settings = _settings(services[service_name])
        brokers = [address.split(":")[0] for address in settings.kafka.brokers]
        assert set(brokers) <= set(services), brokers
        assert {url.split("://")[1].split(":")[0] for url in settings.opensearch.url.split(",")} <= set(services)
        assert settings.database.host == settings.connect.database_hostname == "postgres"
        assert settings.database.port == 5432 and settings.connect.url == "http://connect:8083"
        if name == "docker-compose.cluster.yml":  # deploy/cluster.env's replication, as `ki stack up --cluster`
            profile = cluster_env(Settings(), {})
            assert settings.kafka.replication_factor == int(profile["KI_KAFKA__REPLICATION_FACTOR"])
            assert settings.kafka.min_insync_replicas == int(profile["KI_KAFKA__MIN_INSYNC_REPLICAS"])
            assert settings.opensearch.number_of_replicas == int(profile["KI_OPENSEARCH__NUMBER_OF_REPLICAS"])
    partitions = Settings().kafka.partitions
    for lane in LANES:
        assert 1 <= services[f"ki-sync-{lane}"]["deploy"]["replicas"] <= partitions
    api = services["ki-api"]
    first, last = (int(port) for port in api["ports"][0].split(":")[1].split("-"))
    assert last - first + 1 == api["deploy"]["replicas"] >= 2, "one published port per replica"


def test_in_the_secured_namespace_each_service_logs_in_as_its_role_from_staged_files(tmp_path: Path) -> None:
    """docker-compose.secure.yml: client_env() of each role (apps/dev/stack/secure.py), its files staged for the
    image's user by the secure-files one-shot, its services in the profile started after the roles exist."""
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.secure.yml").read_text())
    services = compose["services"]
    settings = load_settings(environ={"KI_STACK__HOME": str(tmp_path), "KI_STACK__SECURE": "true"})
    material = SecureMaterial.of(settings)
    staged = "/run/ki-secure/ki"
    script = services["secure-files"]["entrypoint"][2]
    (stage,) = [line.split() for line in script.splitlines() if line.strip().startswith("stage 10001 ki ")]
    staged_names = {Path(pattern).name for pattern in stage[3:]}
    roles = {"ki-migrate": "operator", **{f"ki-sync-{lane}": "worker" for lane in LANES}, "ki-api": "api",
             "ki-mcp": "api"}  # fmt: skip
    for service_name, role in roles.items():
        service = services[service_name]
        assert service["network_mode"] == "service:postgres" and service["profiles"] == ["sidecar"]
        assert "secure:/run/ki-secure:ro" in service["volumes"]
        expected = {
            key: (f"{staged}/{Path(value).name}" if value.startswith(str(material.root)) else value)
            for key, value in client_env(settings, material, role).items()
            if key != "KI_STACK__HOME"  # the image's own (its user's home)
        }
        env = _env(service)
        assert {key: env.get(key) for key in expected} == expected, service_name
        for key, value in env.items():
            if value.startswith(f"{staged}/"):
                assert Path(value).name in staged_names, f"{service_name} {key}: {value} is not staged"
    assert services["ki-api"]["command"][:2] == ["serve", "--workers"], "one namespace: processes, not replicas"
