"""The Kafka broker (KRaft, one combined broker + controller) and the JVM launch it shares with Kafka
Connect: one classpath resolved from Maven, log4j2 to stdout, heap from the settings."""

from __future__ import annotations

import base64
import logging
import shutil
import uuid
from abc import abstractmethod
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from apps.dev.stack import process
from apps.dev.stack.cluster import broker_address, node_count, node_port
from apps.dev.stack.errors import StackError
from apps.dev.stack.process import Launch
from apps.dev.stack.secure import KAFKA_SUPER_USER, KAFKA_USERS, SecureMaterial
from apps.dev.stack.service import Runtime, Service, java_properties
from apps.dev.stack.settings import stack_settings
from ki.clients import kafka_config

LOG4J_TEMPLATE = Path(__file__).with_name("kafka-log4j2.properties")
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule required"

# librdkafka reports every refused connection while the broker starts; health probes stay quiet.
_QUIET = logging.getLogger("apps.dev.stack.kafka-client")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def pem_tls(material: SecureMaterial, prefix: str = "") -> dict[str, object]:
    """A Kafka-family JVM's TLS from PEM files: its key and certificate, and the CA it trusts."""
    return {
        f"{prefix}ssl.keystore.type": "PEM",
        f"{prefix}ssl.keystore.location": material.server_bundle,
        f"{prefix}ssl.truststore.type": "PEM",
        f"{prefix}ssl.truststore.location": material.ca_cert,
    }


def kafka_metadata_probe(client_config: dict[str, Any], timeout_s: float = 3.0) -> str | None:
    """None when a broker answers a metadata request, else why not."""
    admin = AdminClient({**client_config, "logger": _QUIET})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        return f"metadata request failed: {exc.args[0] if exc.args else exc}"
    return None if metadata.brokers else "no broker in the metadata answer"


class KafkaJvmService(Service):
    """A Kafka-family JVM: `java <heap> -cp <kafka libs>/* <main class> <properties file>`."""

    main_class: str
    config_name: str

    @property
    @abstractmethod
    def heap(self) -> str: ...

    @abstractmethod
    def config(self, runtime: Runtime) -> dict[str, object]: ...

    @property
    def config_file(self) -> Path:
        return self.state_dir / self.config_name

    def command_marker(self, state_dir: Path) -> str:
        return str(state_dir / self.config_name)

    def system_properties(self) -> dict[str, str]:
        """Extra `-D` properties of the JVM (none by default)."""
        return {}

    def jvm(self, runtime: Runtime, main_class: str, *args: str) -> Launch:
        log4j = self.write_config(self.state_dir / "log4j2.properties", LOG4J_TEMPLATE.read_text())
        properties = [f"-D{key}={value}" for key, value in self.system_properties().items()]
        quick = ["-XX:TieredStopAtLevel=1"] if stack_settings(self.settings).quick_jit else []
        argv = [
            str(runtime.java.java), f"-Xms{self.heap}", f"-Xmx{self.heap}", *quick,
            "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}", *properties,
            "-cp", runtime.artifacts.kafka_classpath, main_class, *args,
        ]  # fmt: skip
        return Launch(argv, cwd=self.state_dir)

    def prepare(self, runtime: Runtime) -> Launch:
        self.write_config(self.config_file, java_properties(self.config(runtime)))
        return self.jvm(runtime, self.main_class, str(self.config_file))


class Kafka(KafkaJvmService):
    name = "kafka"
    main_class = "kafka.Kafka"
    config_name = "server.properties"

    @property
    def host(self) -> str:
        return self.listener[0]

    @property
    def listener(self) -> tuple[str, int]:
        return broker_address(self.settings, self.node)

    def controller(self, node: int) -> str:
        return f"{self.listener[0]}:{node_port(self.settings.kafka.controller_port, node, self.settings)}"

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.listener[1], node_port(self.settings.kafka.controller_port, self.node, self.settings))

    @property
    def heap(self) -> str:
        return stack_settings(self.settings).kafka_heap

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    def config(self, runtime: Runtime) -> dict[str, object]:
        host, port = self.listener
        controller = self.controller(self.node)
        nodes = range(1, node_count(self.settings) + 1)
        # Every node is a broker and a controller; the controllers' quorum is all of them (a majority decides).
        voters = ",".join(f"{node}@{self.controller(node)}" for node in nodes)
        # Secured: the clients' listener is SASL_SSL (PLAIN over TLS); the controller's stays on loopback.
        client = "SASL_SSL" if stack_settings(self.settings).secure else "PLAINTEXT"
        # Internal topics as replicated as the sidecar's own (never more than there are brokers).
        replicas = min(self.settings.kafka.replication_factor, len(nodes))
        in_sync = min(self.settings.kafka.min_insync_replicas, replicas)
        return {
            "process.roles": "broker,controller",
            "node.id": self.node,
            "controller.quorum.voters": voters,
            "listeners": f"{client}://{host}:{port},CONTROLLER://{controller}",
            "advertised.listeners": f"{client}://{host}:{port}",
            "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            **(self.secure_config() if stack_settings(self.settings).secure else {}),
            "log.dirs": self.log_dir,
            "num.partitions": self.settings.kafka.partitions,
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "group.initial.rebalance.delay.ms": 0,
        }

    def secure_config(self) -> dict[str, object]:
        """TLS from the secured profile's PEM files, a PLAIN login per role, and an authorizer: no ACL, no
        access (kafka_acls.py writes each role's); the controller listener authenticates the broker too, so
        no anonymous connection is ever more than refused."""
        material = SecureMaterial.of(self.settings)
        broker = material.password("kafka", KAFKA_SUPER_USER)
        logins = " ".join(f'user_{user}="{material.password("kafka", user)}"' for user in KAFKA_USERS)
        jaas = f'{PLAIN_LOGIN} username="{KAFKA_SUPER_USER}" password="{broker}" {logins};'
        return {
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": jaas,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{KAFKA_SUPER_USER}",
            "allow.everyone.if.no.acl.found": False,
            **pem_tls(material),
        }

    def after_healthy(self) -> None:
        """Secured: every role's ACLs, written as the super user (idempotent: an existing ACL stays)."""
        if not stack_settings(self.settings).secure:
            return
        from apps.dev.stack.kafka_acls import bindings

        material = SecureMaterial.of(self.settings)
        admin = AdminClient({
            "bootstrap.servers": "{}:{}".format(*self.listener), "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN", "sasl.username": KAFKA_SUPER_USER,
            "sasl.password": material.password("kafka", KAFKA_SUPER_USER), "ssl.ca.location": str(material.ca_cert),
            "logger": _QUIET,
        })  # fmt: skip
        for binding, future in admin.create_acls(bindings(self.settings), request_timeout=30).items():
            try:
                future.result()
            except KafkaException as exc:
                raise StackError(f"Kafka refused the ACL {binding}: {exc.args[0] if exc.args else exc}") from None

    def prepare(self, runtime: Runtime) -> Launch:
        launch = super().prepare(runtime)
        if not (self.log_dir / "meta.properties").is_file():
            shutil.rmtree(self.log_dir, ignore_errors=True)  # never formatted: nothing to keep
            fmt = self.jvm(runtime, "kafka.tools.StorageTool", "format",
                           "--cluster-id", self.cluster_id(), "--config", str(self.config_file))  # fmt: skip
            process.run_once(fmt, self.log_file, self.user, "kafka storage format")
        return launch

    def cluster_id(self) -> str:
        """One id for every node of this stack's Kafka (a node formatted later must join the same cluster),
        kept beside the services' state until `ki stack wipe`."""
        path = self.paths.home / "data" / "kafka-cluster-id"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_cluster_id() + "\n")
        return path.read_text().strip()

    def probe(self) -> str | None:
        """This broker answers a metadata request itself (not through another of the cluster's)."""
        own = "{}:{}".format(*self.listener)
        return kafka_metadata_probe({**kafka_config(self.settings), "bootstrap.servers": own})


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid
