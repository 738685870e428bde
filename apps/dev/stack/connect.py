"""Kafka Connect in distributed mode with the Debezium PostgreSQL connector on its plugin path."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from apps.dev.stack.connector import connect_auth
from apps.dev.stack.http import HttpError, request_json
from apps.dev.stack.kafka import PLAIN_LOGIN, KafkaJvmService
from apps.dev.stack.secure import CONNECT_REST_USER, SecureMaterial, connect_rest_keystore
from apps.dev.stack.service import Runtime
from apps.dev.stack.settings import stack_settings

DEBEZIUM_POSTGRES_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
BASIC_AUTH_EXTENSION = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
PROPERTY_FILE_LOGIN = "org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule"


class Connect(KafkaJvmService):
    name = "connect"
    main_class = "org.apache.kafka.connect.cli.ConnectDistributed"
    config_name = "connect-distributed.properties"

    @property
    def url(self) -> str:
        return self.settings.connect.url.rstrip("/")

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def ports(self) -> tuple[int, ...]:
        return (urlsplit(self.url).port or 8083,)

    @property
    def heap(self) -> str:
        return stack_settings(self.settings).connect_heap

    def config(self, runtime: Runtime) -> dict[str, object]:
        prefix = self.settings.kafka.topic_prefix
        internal = {"configs": "config", "offsets": "offset", "status": "status"}
        topics: dict[str, object] = {}
        for suffix, key in internal.items():
            # Connect creates these compacted, as replicated as every other topic of the sidecar.
            topics[f"{key}.storage.topic"] = f"{prefix}-connect-{suffix}"
            topics[f"{key}.storage.replication.factor"] = self.settings.kafka.replication_factor
        secure = self.secure_config() if stack_settings(self.settings).secure else {}
        scheme = "https" if stack_settings(self.settings).secure else "http"
        return {
            "bootstrap.servers": self.settings.kafka.bootstrap_servers,
            **secure,
            "group.id": f"{prefix}-connect",
            **topics,
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": False,
            "value.converter.schemas.enable": False,
            "offset.flush.interval.ms": 5000,
            # A change event counts as captured only once every in-sync replica has it.
            "producer.acks": "all",
            "listeners": f"{scheme}://{self.host}:{self.port}",
            "rest.advertised.listener": scheme,
            "rest.advertised.host.name": self.host,
            "rest.advertised.port": self.port,
            "plugin.path": runtime.artifacts.debezium_plugin_path,
            # Every plugin here ships ServiceLoader manifests: no slow reflective classpath scan.
            "plugin.discovery": "service_load",
            "topic.creation.enable": True,
        }

    def secure_config(self) -> dict[str, object]:
        """Secured profile: its Kafka clients log in over SASL_SSL (as `connect`), its REST API serves TLS."""
        material = SecureMaterial.of(self.settings)
        login = f'{PLAIN_LOGIN} username="connect" password="{material.password("kafka", "connect")}";'
        kafka: dict[str, object] = {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": login,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": material.ca_cert,
        }
        # The worker's own clients, and those it makes for connectors (producers, consumers, admin).
        config = {f"{prefix}{key}": value for prefix in ("", "producer.", "consumer.", "admin.")
                  for key, value in kafka.items()}  # fmt: skip
        keystore, password = self.state_dir / "rest-keystore.p12", material.password("kafka", "connect")
        keystore.write_bytes(connect_rest_keystore(material))
        keystore.chmod(0o600)
        rest = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": keystore, "ssl.keystore.password": password,
                "ssl.key.password": password, "ssl.client.auth": "none"}  # fmt: skip
        # Basic authentication of the REST API: its logins in a properties file, read through JAAS.
        self.write_rest_logins(material)
        return {
            **config,
            **{f"listeners.https.{key}": value for key, value in rest.items()},
            "rest.extension.classes": BASIC_AUTH_EXTENSION,
        }

    @property
    def jaas_file(self) -> Path:
        return self.state_dir / "rest-jaas.conf"

    def write_rest_logins(self, material: SecureMaterial) -> None:
        logins = self.state_dir / "rest-logins.properties"
        self.user.write(logins, f"{CONNECT_REST_USER}: {material.password('connect', CONNECT_REST_USER)}\n", mode=0o600)
        jaas = f'KafkaConnect {{\n  {PROPERTY_FILE_LOGIN} required\n  file="{logins}";\n}};\n'
        self.user.write(self.jaas_file, jaas, mode=0o600)

    def system_properties(self) -> dict[str, str]:
        return {"java.security.auth.login.config": str(self.jaas_file)} if stack_settings(self.settings).secure else {}

    def probe(self) -> str | None:
        auth = connect_auth(self.settings)
        try:
            status, _ = request_json("GET", f"{self.url}/connectors", timeout=3, auth=auth)
            if status != 200:
                return f"GET /connectors answered {status}"
            status, plugins = request_json("GET", f"{self.url}/connector-plugins", timeout=3, auth=auth)
        except HttpError as exc:
            return str(exc)
        classes = {p.get("class") for p in plugins or [] if isinstance(p, dict)}
        if DEBEZIUM_POSTGRES_CLASS not in classes:
            return f"{DEBEZIUM_POSTGRES_CLASS} is not among the connector plugins"
        return None
