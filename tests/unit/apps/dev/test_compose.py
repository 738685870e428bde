"""docker-compose.yml must describe the same topology and ports as the native stack; docker-compose.secure.yml
the same with the secured profile's security (`ki stack up --secure`)."""

import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import cast
from urllib.parse import urlparse

import bcrypt
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from apps.dev.checkout import REPO_ROOT
from apps.dev.stack.connect import BASIC_AUTH_EXTENSION, PROPERTY_FILE_LOGIN, Connect
from apps.dev.stack.kafka import Kafka
from apps.dev.stack.kafka_acls import acl_arguments, bindings, grants
from apps.dev.stack.opensearch import OpenSearch
from apps.dev.stack.paths import StackPaths
from apps.dev.stack.postgres import ROLES_SQL, Postgres
from apps.dev.stack.secure import (
    COMPOSE_ACL_ARGUMENTS,
    COMPOSE_REST_KEYSTORE,
    COMPOSE_SECURITY_DIR,
    CONNECT_REST_USER,
    KAFKA_SUPER_USER,
    KAFKA_USERS,
    POSTGRES_ROLES,
    SecureMaterial,
    opensearch_security_files,
)
from apps.dev.stack.secure import main as secure_main
from apps.dev.stack.service import Runtime, java_properties
from apps.dev.stack.settings import stack_settings
from ki.settings import Settings, load_settings
from projections.lanes import LANES


def _compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def _host_ports(service: dict) -> set[int]:
    """Each published port (a range's first: replicas take the next ones)."""
    return {int(mapping.split(":")[-2].split("-")[0]) for mapping in service.get("ports", [])}


#: The sidecar's own services (the Dockerfile's image; tests/unit/deploy/test_compose_sidecar.py checks them).
SIDECAR = {"ki-migrate", *(f"ki-sync-{lane}" for lane in LANES), "ki-api", "ki-mcp"}


def test_compose_has_the_four_services_on_the_configured_ports() -> None:
    settings = load_settings(environ={})
    services = _compose()["services"]
    assert set(services) == {"postgres", "kafka", "connect", "opensearch", "prometheus", "grafana"} | SIDECAR
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


# -- docker-compose.secure.yml: the secured profile (`ki stack up --secure`) -------------------------------------

SECURE_FILE = "docker-compose.secure.yml"
#: Beyond docker-compose.yml's services: the material's copies, the Kafka ACLs, the PostgreSQL roles.
ONE_SHOTS = {"secure-files", "kafka-acls", "postgres-roles"}
STAGED = "/run/ki-secure"
#: A secret written into the file instead of read from one: `password="…"` (JAAS, properties) not followed by
#: a shell expansion, or a YAML key holding a password (`…_FILE` keys name files).
SECRET_LITERALS = (
    re.compile(r"""(?i)password\s*=\s*[\\"']*(?!\$)\w"""),
    re.compile(r"""(?im)^\s*(?!\w*_FILE:)\w*PASSWORD\w*:\s*(?!\$)\S"""),
)


def _secure() -> dict:
    return yaml.safe_load((REPO_ROOT / SECURE_FILE).read_text())


def _secured(tmp_path: Path) -> tuple[Settings, SecureMaterial]:
    settings = load_settings(environ={"KI_STACK__HOME": str(tmp_path), "KI_STACK__SECURE": "true"})
    material = SecureMaterial.of(settings)
    material.ensure(settings)
    return settings, material


def _script(service: dict) -> str:
    """A service's `bash -c` entrypoint as the shell runs it (Compose turns `$$` into `$`)."""
    entrypoint = service["entrypoint"]
    assert entrypoint[:2] == ["bash", "-c"]
    return str(entrypoint[2]).replace("$$", "$")


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def _staged(compose: dict) -> dict[str, list[str]]:
    """What `secure-files` copies, per directory of the `secure` volume: `stage <uid> <dir> <files>...` lines."""
    stages: dict[str, list[str]] = {}
    for line in _script(compose["services"]["secure-files"]).splitlines():
        words = line.split()
        if words[:1] == ["stage"]:
            stages[words[2]] = [words[1], *words[3:]]
    return stages


def test_the_secure_variant_has_the_same_services_and_images_plus_one_shots() -> None:
    plain, secure = _compose()["services"], _secure()["services"]
    assert set(secure) == set(plain) | ONE_SHOTS
    for name in plain:
        assert secure[name]["image"] == plain[name]["image"], name
    images = {service["image"] for service in plain.values()}
    for name in ONE_SHOTS:
        assert secure[name]["image"] in images, name  # nothing pulled beyond docker-compose.yml's images
        assert "ports" not in secure[name] and "healthcheck" not in secure[name] and "restart" not in secure[name]
    assert secure["postgres-roles"]["profiles"] == ["setup"]  # run after `ki migrate`, not by `up`
    assert {name: secure[name] for name in ("prometheus", "grafana")} == {
        name: plain[name] for name in ("prometheus", "grafana")
    }


def test_the_secure_variant_publishes_docker_compose_ymls_ports_on_one_loopback() -> None:
    """The servers share postgres's network namespace (127.0.0.1 and the native ports, as `ki stack up` runs them,
    so the server certificate for 127.0.0.1 verifies everywhere): every port is published there, on loopback."""
    settings = load_settings(environ={})
    plain, secure = _compose()["services"], _secure()["services"]
    published = {mapping for service in secure.values() for mapping in service.get("ports", [])}
    assert published == set(secure["postgres"]["ports"])
    assert {int(m.split(":")[-2]) for m in published} == set().union(*(_host_ports(s) for s in plain.values()))
    for mapping in published:
        assert mapping.startswith("127.0.0.1:")
        assert mapping.split(":")[-2] == mapping.split(":")[-1], "inside, each service listens on its native port"
    native = {settings.database.port, urlparse(settings.connect.url).port, urlparse(settings.opensearch.url).port,
              int(settings.kafka.bootstrap_servers.rsplit(":", 1)[1])}  # fmt: skip
    native |= {settings.api.port, settings.mcp.port}  # the sidecar's servers listen in the same namespace
    assert {int(m.split(":")[-1]) for m in published} == native
    for name in ("kafka", "kafka-acls", "connect", "opensearch", *SIDECAR):
        assert secure[name]["network_mode"] == "service:postgres", name
    assert secure["secure-files"]["network_mode"] == secure["postgres-roles"]["network_mode"] == "none"


def test_the_secure_broker_is_the_native_secured_broker(tmp_path: Path) -> None:
    settings, material = _secured(tmp_path)
    native = Kafka(settings, StackPaths.from_settings(settings)).config(cast(Runtime, None))
    kafka = _secure()["services"]["kafka"]
    compose = _properties(_secure()["configs"]["kafka-server"]["content"])
    expected = _properties(java_properties(native))
    own = {"listeners", "log.dirs", "ssl.keystore.location", "ssl.truststore.location"}
    jaas = {key for key in expected if key.endswith("sasl.jaas.config")}
    assert jaas == {"listener.name.sasl_ssl.plain.sasl.jaas.config", "listener.name.controller.plain.sasl.jaas.config"}
    native_rest = {key: value for key, value in expected.items() if key not in own | jaas}
    assert {key: value for key, value in compose.items() if key not in own} == native_rest
    assert compose["authorizer.class.name"].endswith("StandardAuthorizer")
    assert compose["super.users"] == f"User:{KAFKA_SUPER_USER}" and compose["allow.everyone.if.no.acl.found"] == "false"
    assert compose["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
    # The clients' listener on every address of the namespace (its port is published), the controller's on loopback.
    client, controller = expected["listeners"].split(",")
    assert compose["listeners"] == f"SASL_SSL://0.0.0.0:{client.rsplit(':', 1)[1]},{controller}"
    assert controller.startswith("CONTROLLER://127.0.0.1:")
    for key in ("ssl.keystore.location", "ssl.truststore.location"):
        assert compose[key] == f"{STAGED}/kafka/{Path(expected[key]).name}"
    # One PLAIN login per role, written at start from the password files (never into the YAML).
    env = kafka["environment"]
    assert env["KI_KAFKA_USERS"].split() == list(KAFKA_USERS) and env["KI_KAFKA_SUPER_USER"] == KAFKA_SUPER_USER
    script = _script(kafka)
    for key in jaas:
        assert f'echo "{key}=$jaas;"' in script
    assert 'for user in $KI_KAFKA_USERS; do jaas="$jaas user_$user=' in script
    assert 'password=\\"$(cat $s/kafka-$KI_KAFKA_SUPER_USER)' in script
    assert material.password("kafka", KAFKA_SUPER_USER) not in (REPO_ROOT / SECURE_FILE).read_text()


def test_the_acl_service_writes_the_native_acls_for_logins_the_broker_has(tmp_path: Path) -> None:
    settings, _ = _secured(tmp_path)
    services = _secure()["services"]
    logins = set(services["kafka"]["environment"]["KI_KAFKA_USERS"].split())
    assert {grant.login for grant in grants(settings)} <= logins
    # kafka-acls.sh arguments (what the one-shot applies) are exactly the native profile's bindings.
    parsed = set()
    for line in acl_arguments(settings):
        words = line.split()
        options: dict[str, list[str]] = {}
        for flag, value in zip(words[::2], words[1::2], strict=True):
            options.setdefault(flag, []).append(value)
        kind = "TOPIC" if "--topic" in options else "GROUP"
        (name,) = options["--topic" if kind == "TOPIC" else "--group"]
        (principal,) = options["--allow-principal"]
        (pattern,) = options["--resource-pattern-type"]
        for operation in options["--operation"]:
            parsed.add((kind, name, pattern.upper(), principal, re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()))
    native = {(b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.operation.name)
              for b in bindings(settings)}  # fmt: skip
    assert parsed == native
    acls = services["kafka-acls"]
    assert acls["environment"]["KI_KAFKA_SUPER_USER"] == KAFKA_SUPER_USER
    assert acls["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert services["connect"]["depends_on"]["kafka-acls"]["condition"] == "service_completed_successfully"
    script = _script(acls)
    assert f"$s/{COMPOSE_ACL_ARGUMENTS}" in script and "--add $grant" in script


def test_the_secure_connect_logs_in_over_sasl_ssl_and_serves_https_behind_basic_auth(tmp_path: Path) -> None:
    settings, _ = _secured(tmp_path)
    native_connect = Connect(settings, StackPaths.from_settings(settings))
    native_connect.state_dir.mkdir(parents=True)
    native = native_connect.secure_config()
    connect = _secure()["services"]["connect"]
    env, script = connect["environment"], _script(connect)

    def variable(key: str) -> str:
        return "CONNECT_" + key.upper().replace(".", "_")

    for key, value in native.items():
        if key.endswith("sasl.jaas.config") or key.endswith("password"):
            assert f"{variable(key)}=" in script, key  # made from the password file at start
        elif key.endswith("location"):  # the REST keystore: made by the material command, not at start
            name = COMPOSE_REST_KEYSTORE if key.startswith("listeners.https.") else Path(str(value)).name
            assert env[variable(key)] == f"{STAGED}/connect/{name}", key
        else:
            assert str(env[variable(key)]) == str(value), key
    assert env["CONNECT_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["CONNECT_REST_EXTENSION_CLASSES"] == BASIC_AUTH_EXTENSION
    assert env["CONNECT_LISTENERS"] == f"https://0.0.0.0:{urlparse(settings.connect.url).port}"
    assert env["KI_CONNECT_REST_USER"] == CONNECT_REST_USER and PROPERTY_FILE_LOGIN in script
    assert "-Djava.security.auth.login.config=" in script
    prefix = settings.kafka.topic_prefix
    assert env["GROUP_ID"] == f"{prefix}-connect"
    assert {env[f"{kind}_STORAGE_TOPIC"] for kind in ("CONFIG", "OFFSET", "STATUS")} == {
        f"{prefix}-connect-{suffix}" for suffix in ("configs", "offsets", "status")
    }
    # The image logs each property it sets, except the sensitive ones: every secret the script exports is one.
    exported = set(re.findall(r"(CONNECT_\w+)=\"\$(?:jaas|password)\"", script))
    assert len(exported) == 6 and exported <= set(env["SENSITIVE_PROPERTIES"].split(","))
    # Debezium names the CA by the host's path (operator.env's KI_DATABASE__SSLROOTCERT): mounted there.
    (ca,) = [v for v in connect["volumes"] if isinstance(v, dict)]
    assert ca["source"] == ca["target"] == "${KI_SECURE_DIR:-${HOME}/.cache/ki-sidecar/secure}/ca.pem"


def test_the_secure_opensearch_runs_the_security_plugin_with_tls_and_the_native_users(tmp_path: Path) -> None:
    settings, material = _secured(tmp_path)
    node = OpenSearch(settings, StackPaths.from_settings(settings))
    opensearch = _secure()["services"]["opensearch"]
    env = opensearch["environment"]
    assert "DISABLE_SECURITY_PLUGIN" not in env and env["DISABLE_INSTALL_DEMO_CONFIG"] == "true"
    assert env["discovery.type"] == "single-node" and env["path.repo"]
    (config,) = opensearch["configs"]
    assert config["target"] == "/usr/share/opensearch/config/opensearch.yml"
    yml = yaml.safe_load(_secure()["configs"][config["source"]]["content"])
    assert {key: yml.get(key) for key in node.secure_yml()} == node.secure_yml()
    assert yml["plugins.security.ssl.http.enabled"] is True and yml["plugins.security.ssl.transport.pemcert_filepath"]
    native = node.settings_yml()
    for key in ("cluster.name", "node.name", "http.port", "transport.port"):
        assert yml[key] == native[key], key
    script = _script(opensearch)
    for name in opensearch_security_files(settings, material):  # internal users, roles and their mapping
        assert f'"$s/{name}"' in script
    for source, target in (("ca.pem", "ca.pem"), ("server.pem", "node.pem"), ("server-key.pem", "node-key.pem")):
        assert f'cp "$s/{source}" "$c/secure/{target}"' in script  # the paths secure_yml() names
    health = opensearch["healthcheck"]["test"][1]
    assert "https://localhost:" in health and "--cacert" in health


def test_the_secure_postgres_accepts_only_tls_and_scram_and_keeps_the_native_roles() -> None:
    settings = load_settings(environ={})
    compose = _secure()
    postgres = compose["services"]["postgres"]
    command = postgres["command"]
    for option in ("ssl=on", "ssl_min_protocol_version=TLSv1.2", "wal_level=logical", f"port={settings.database.port}"):
        assert option in command, option
    targets = {config["source"]: config["target"] for config in postgres["configs"]}
    assert f"hba_file={targets['pg-hba']}" in command
    hba = [line.split() for line in compose["configs"]["pg-hba"]["content"].splitlines() if line.strip()]
    assert [line for line in hba if line[0] == "local"] == [["local", "all", "all", "trust"]]  # the private socket
    tcp = [line for line in hba if line[0] != "local"]
    assert tcp and all(line[0] == "hostssl" and line[-1] == "scram-sha-256" for line in tcp)
    native = [line.split() for line in Postgres._hba(secure=True).splitlines() if line.startswith("hostssl")]
    assert {(line[1], line[-1]) for line in tcp} == {(line[1], line[-1]) for line in native}
    env = postgres["environment"]
    assert "POSTGRES_PASSWORD" not in env and env["POSTGRES_PASSWORD_FILE"].startswith(f"{STAGED}/postgres/")
    operator = settings.database.user
    init = compose["configs"]["pg-operator"]["content"]
    assert targets["pg-operator"].startswith("/docker-entrypoint-initdb.d/")
    assert f"CREATE ROLE {operator} LOGIN REPLICATION CREATEDB PASSWORD %L" in init
    assert f"CREATE DATABASE {settings.database.name} OWNER {operator};" in init
    assert "ALTER ROLE postgres PASSWORD NULL;" in init  # the superuser: socket only, as natively
    roles = compose["services"]["postgres-roles"]
    assert roles["environment"]["KI_POSTGRES_LOGINS"].split() == [operator, *POSTGRES_ROLES]
    assert roles["environment"]["PGDATABASE"] == settings.database.name
    mounted = {volume.split(":")[0]: volume.split(":")[1] for volume in roles["volumes"]}
    assert REPO_ROOT / "deploy/postgres/roles.sql" == ROLES_SQL and ROLES_SQL.is_file()  # what `up --secure` applies
    assert f"-f {mounted['./deploy/postgres/roles.sql']}" in _script(roles)


def test_every_secret_a_service_reads_is_staged_from_what_the_material_command_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KI_STACK__HOME", str(tmp_path))
    assert secure_main([]) == 0
    root = Path(capsys.readouterr().out.strip())
    compose = _secure()
    stages = _staged(compose)
    assert set(stages) == {"postgres", "kafka", "connect", "opensearch", "ki"}
    files: dict[str, set[str]] = {}
    for directory, (_, *patterns) in stages.items():
        files[directory] = set()
        for pattern in patterns:
            matched = sorted(root.glob(pattern))
            assert matched, f"{pattern} ({directory}): not written by `python -m apps.dev.stack.secure`"
            files[directory] |= {path.name for path in matched}
    assert compose["services"]["postgres-roles"]["user"] == f"{stages['postgres'][0]}:{stages['postgres'][0]}"
    text = (REPO_ROOT / SECURE_FILE).read_text().replace("$$", "$")
    # Literal paths (configs, environment, commands) and each script's `$s/<file>` under its `s=` directory.
    references = set(re.findall(rf"{STAGED}/(\w+)/([\w.-]+)(?![\w.$-])", text))
    for service in compose["services"].values():
        if isinstance(service.get("entrypoint"), list) and (found := re.search(rf"s={STAGED}/(\w+)", _script(service))):
            references |= {(found[1], name) for name in re.findall(r"\$s/([\w.-]+)(?![\w.$-])", _script(service))}
    env = {key: value for s in compose["services"].values() for key, value in (s.get("environment") or {}).items()}
    references |= {("kafka", f"kafka-{user}") for user in env["KI_KAFKA_USERS"].split()}
    references |= {("connect", f"connect-{env['KI_CONNECT_REST_USER']}")}
    references |= {("postgres", f"postgres-{login}") for login in env["KI_POSTGRES_LOGINS"].split()}
    assert len(references) > 20
    for directory, name in sorted(references):
        assert name in files.get(directory, set()), f"{directory}/{name} is read but not staged"
    # The compose file's default material directory is the default stack home's.
    home = stack_settings(Settings()).home
    assert home.startswith("~/")
    assert compose["x-material"]["source"] == f"${{KI_SECURE_DIR:-${{HOME}}/{home[2:]}/secure}}"


def test_no_secret_literal_is_in_the_secure_variant(tmp_path: Path) -> None:
    _, material = _secured(tmp_path)
    text = (REPO_ROOT / SECURE_FILE).read_text()
    for detector in SECRET_LITERALS:
        assert not detector.findall(text), detector.findall(text)
    # The detectors do find what they look for: docker-compose.yml's local password, a JAAS literal.
    plain = (REPO_ROOT / "docker-compose.yml").read_text()
    assert any(detector.search(plain) for detector in SECRET_LITERALS)
    assert any(detector.search('username="broker" password="s3cret-pw";') for detector in SECRET_LITERALS)
    assert "PRIVATE KEY" not in text and "BEGIN CERTIFICATE" not in text
    for password_file in (material.root / "passwords").iterdir():
        assert password_file.read_text().strip() not in text


def test_every_entrypoint_script_of_the_secure_variant_is_valid_bash() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    scripts = {name: _script(s) for name, s in _secure()["services"].items() if isinstance(s.get("entrypoint"), list)}
    assert set(scripts) == ONE_SHOTS | {"kafka", "connect", "opensearch"}
    for name, script in scripts.items():
        assert script.startswith("set -eu\n"), name
        result = subprocess.run([bash, "-n", "-c", script], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_the_material_command_writes_the_native_material_and_what_compose_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m apps.dev.stack.secure`: SecureMaterial.ensure (kept on a second run) plus the compose files."""
    monkeypatch.setenv("KI_STACK__HOME", str(tmp_path))
    assert secure_main([]) == 0
    root = tmp_path / "secure"
    assert capsys.readouterr().out.strip() == str(root)
    settings = load_settings(environ={"KI_STACK__HOME": str(tmp_path)})
    material = SecureMaterial.of(settings)
    assert material.complete and material.root == root
    password = material.password("kafka", "connect")
    key, cert, _ = pkcs12.load_key_and_certificates((root / COMPOSE_REST_KEYSTORE).read_bytes(), password.encode())
    assert key is not None and cert is not None
    assert cert.public_bytes(serialization.Encoding.PEM) == material.server_cert.read_bytes()
    assert (root / COMPOSE_ACL_ARGUMENTS).read_text().splitlines() == acl_arguments(settings)
    users = yaml.safe_load((root / COMPOSE_SECURITY_DIR / "internal_users.yml").read_text())
    assert bcrypt.checkpw(material.password("opensearch", "ki_api").encode(), users["ki_api"]["hash"].encode())
    for secret in (root / COMPOSE_REST_KEYSTORE, *(root / COMPOSE_SECURITY_DIR).iterdir()):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    ca = material.ca_cert.read_bytes()
    assert secure_main([]) == 0
    assert material.ca_cert.read_bytes() == ca and material.password("kafka", "connect") == password
