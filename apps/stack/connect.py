"""Kafka Connect in distributed mode with the Debezium PostgreSQL connector on its plugin path."""

from __future__ import annotations

from urllib.parse import urlsplit

from apps.stack.http import HttpError, request_json
from apps.stack.kafka import KafkaJvmService
from apps.stack.service import Runtime

DEBEZIUM_POSTGRES_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"


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
        return self.settings.stack.connect_heap

    def config(self, runtime: Runtime) -> dict[str, object]:
        prefix = self.settings.kafka.topic_prefix
        internal = {"configs": "config", "offsets": "offset", "status": "status"}
        topics: dict[str, object] = {}
        for suffix, key in internal.items():
            # Connect creates these compacted; one broker, so one replica.
            topics[f"{key}.storage.topic"] = f"{prefix}-connect-{suffix}"
            topics[f"{key}.storage.replication.factor"] = 1
        return {
            "bootstrap.servers": self.settings.kafka.bootstrap_servers,
            "group.id": f"{prefix}-connect",
            **topics,
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": False,
            "value.converter.schemas.enable": False,
            "offset.flush.interval.ms": 5000,
            "listeners": f"http://{self.host}:{self.port}",
            "rest.advertised.host.name": self.host,
            "rest.advertised.port": self.port,
            "plugin.path": runtime.artifacts.debezium_plugin_path,
            # Every plugin here ships ServiceLoader manifests: no slow reflective classpath scan.
            "plugin.discovery": "service_load",
            "topic.creation.enable": True,
        }

    def probe(self) -> str | None:
        try:
            status, _ = request_json("GET", f"{self.url}/connectors", timeout=3)
            if status != 200:
                return f"GET /connectors answered {status}"
            status, plugins = request_json("GET", f"{self.url}/connector-plugins", timeout=3)
        except HttpError as exc:
            return str(exc)
        classes = {p.get("class") for p in plugins or [] if isinstance(p, dict)}
        if DEBEZIUM_POSTGRES_CLASS not in classes:
            return f"{DEBEZIUM_POSTGRES_CLASS} is not among the connector plugins"
        return None
