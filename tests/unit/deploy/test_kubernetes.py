"""deploy/kubernetes/: every manifest valid against the Kubernetes API schemas (kubernetes-validate bundles them:
offline, strict), and our own rules -- probes and resources on every container, non-root, the Dockerfile's image,
commands `ki` accepts, settings that exist, secrets only as files, lanes sized by the partitions."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate  # the pinned dev extra: `pip install -e '.[dev]'`
import pytest
import yaml

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings
from projections.lanes import LANES
from tests.unit.deploy.helpers import PROBE, assert_ki_command, image, setting_exists

KUBERNETES = REPO_ROOT / "deploy" / "kubernetes"
#: The oldest Kubernetes these manifests promise to fit (autoscaling/v2, policy/v1: 1.25+), and the newest bundled.
VERSIONS = ("1.30.0", "1.37.0")
WORKLOADS = {"Deployment", "Job", "StatefulSet"}


def _documents() -> list[tuple[str, dict]]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = kustomization["resources"]
    assert sorted(files) == sorted(p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
    return [(name, doc) for name in files for doc in yaml.safe_load_all((KUBERNETES / name).read_text()) if doc]


def _workloads() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in _documents() if doc["kind"] in WORKLOADS}


def _container(workload: dict) -> dict:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    documents = _documents()
    assert len(documents) >= 14
    for name, document in documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name} {document['kind']}/{document['metadata']['name']}: {exc.message}") from None


def test_the_expected_objects_are_there() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in _documents()}
    for component in ("ki-api", "ki-mcp", *(f"ki-sync-{lane}" for lane in LANES)):
        assert ("Deployment", component) in kinds and ("PodDisruptionBudget", component) in kinds, component
    assert {("Job", "ki-migrate"), ("HorizontalPodAutoscaler", "ki-api"), ("Service", "ki-api"),
            ("Service", "ki-mcp"), ("ConfigMap", "ki-config"), ("ConfigMap", "ki-env"),
            ("Secret", "ki-secrets")} <= kinds  # fmt: skip


def test_every_container_has_probes_resources_and_runs_as_non_root_on_a_read_only_root() -> None:
    for name, workload in _workloads().items():
        pod = workload["spec"]["template"]["spec"]
        container = _container(workload)
        if workload["kind"] != "Job":
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                assert probe in container, f"{name}: no {probe}"
        resources = container["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[kind]), f"{name}: {kind}"
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True and security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == ["ALL"]
        assert pod["automountServiceAccountToken"] is False
        mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
        assert {"/var/lib/ki-sidecar", "/tmp", "/etc/ki-sidecar/config.json", "/run/secrets/ki"} <= mounts, name


def test_every_container_runs_the_dockerfiles_image_with_a_command_ki_accepts() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    name, tag = image().split(":")
    assert kustomization["images"] == [{"name": name, "newTag": tag}]
    for workload_name, workload in _workloads().items():
        container = _container(workload)
        assert container["image"] == image(), workload_name
        assert "command" not in container, "the image's entrypoint is `ki`"
        assert_ki_command(container["args"], f"deploy/kubernetes {workload_name}")


def test_probes_reach_the_endpoints_the_servers_have() -> None:
    settings = Settings()
    workloads = _workloads()
    api = _container(workloads["ki-api"])
    assert api["ports"] == [{"name": "http", "containerPort": settings.api.port, "protocol": "TCP"}]
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    mcp = _container(workloads["ki-mcp"])
    assert mcp["ports"][0]["containerPort"] == settings.mcp.port and mcp["readinessProbe"]["tcpSocket"]
    for lane in LANES:
        container = _container(workloads[f"ki-sync-{lane}"])
        assert container["args"] == ["sync", "run", "--lane", lane]
        url = f"http://127.0.0.1:{settings.streams.lane_web_port(lane)}/healthz"  # loopback: only an exec probe
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert container[probe]["exec"]["command"] == [*PROBE, url], (lane, probe)


def test_settings_come_from_the_configmap_and_secrets_only_from_mounted_files() -> None:
    documents = dict(((doc["kind"], doc["metadata"]["name"]), doc) for _, doc in _documents())
    config = json.loads(documents[("ConfigMap", "ki-config")]["data"]["config.json"])
    assert config == json.loads((REPO_ROOT / "config.json").read_text())
    env_map = documents[("ConfigMap", "ki-env")]["data"]
    secret_keys = set(documents[("Secret", "ki-secrets")]["stringData"])
    for variable in env_map:
        assert setting_exists(variable), variable
        assert "PASSWORD" not in variable and "SECRET" not in variable or variable.endswith("_FILE"), variable
    for name, workload in _workloads().items():
        container = _container(workload)
        assert container["envFrom"] == [{"configMapRef": {"name": "ki-env"}}]
        volumes = {volume["name"]: volume for volume in workload["spec"]["template"]["spec"]["volumes"]}
        mounted = {item["path"] for item in volumes["secrets"]["secret"]["items"]}
        assert mounted <= secret_keys, name
        for variable in container["env"]:
            assert setting_exists(variable["name"]) and "valueFrom" not in variable, (name, variable)
            if variable["name"].endswith("_FILE") and variable["value"].startswith("/run/secrets/ki/"):
                assert Path(variable["value"]).name in mounted, (name, variable)
            assert "PASSWORD" not in variable["name"] or variable["name"].endswith("_FILE"), variable
        # Each role mounts only its own logins.
        role = {"ki-migrate": "operator", **{f"ki-sync-{lane}": "worker" for lane in LANES},
                "ki-api": "api", "ki-mcp": "api"}[name]  # fmt: skip
        assert all(not key.startswith(("database-", "kafka-", "opensearch-")) or key.endswith(role) for key in mounted)


def test_the_lanes_are_sized_by_the_partitions_and_disruptions_keep_the_servers_up() -> None:
    partitions = Settings().kafka.partitions
    documents = [doc for _, doc in _documents()]
    workloads = _workloads()
    for lane in LANES:
        assert 1 <= workloads[f"ki-sync-{lane}"]["spec"]["replicas"] <= partitions, lane
    budgets = {doc["metadata"]["name"]: doc["spec"] for doc in documents if doc["kind"] == "PodDisruptionBudget"}
    for server in ("ki-api", "ki-mcp"):
        assert budgets[server].get("minAvailable", 0) >= 1 and workloads[server]["spec"]["replicas"] >= 2
    (hpa,) = [doc for doc in documents if doc["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ki-api" and hpa["spec"]["minReplicas"] >= 2
    for name, workload in workloads.items():
        if workload["kind"] == "Deployment":
            assert workload["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, name
