"""A single-node OpenSearch assembled from Maven artifacts (see artifacts.py); with the security plugin (TLS,
internal users, least-privilege roles) in the secured profile (secure.py).

Under root it runs as the service account (users.py) from a copy of the assembled distribution in the
stack's system directory (paths.py), because the artifact cache lives in the user's home."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from apps.dev.stack.artifacts import KNN_PLUGIN, OPENSEARCH_MODULES, SECURITY_DEFAULTS, SECURITY_PLUGIN, copy_resolved
from apps.dev.stack.cluster import node_count, node_port, opensearch_url
from apps.dev.stack.errors import StackError
from apps.dev.stack.http import NO_AUTH, Auth, HttpError, request_json
from apps.dev.stack.process import Launch
from apps.dev.stack.secure import ADMIN_CN, NODE_CN, SecureMaterial, distinguished_name, opensearch_security_files
from apps.dev.stack.service import Runtime, Service
from apps.dev.stack.settings import stack_settings

LOG4J_TEMPLATE = Path(__file__).with_name("opensearch-log4j2.properties")
CLUSTER_NAME = "ki-local"


class OpenSearch(Service):
    name = "opensearch"
    refuses_root = True

    @property
    def url(self) -> str:
        return opensearch_url(self.settings, self.node)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def ports(self) -> tuple[int, ...]:
        return (urlsplit(self.url).port or 9200, self.transport_port(self.node))

    def transport_port(self, node: int) -> int:
        return node_port(self.settings.opensearch.transport_port, node, self.settings)

    @property
    def config_dir(self) -> Path:
        return self.state_dir / "config"

    def command_marker(self, state_dir: Path) -> str:
        return f"-Dopensearch.path.conf={state_dir / 'config'}"

    def discovery(self) -> dict[str, object]:
        """One node: single-node discovery. A cluster: every node seeds from all, and the first start elects
        a cluster manager among all of them (a majority must be up)."""
        nodes = range(1, node_count(self.settings) + 1)
        if len(nodes) == 1:
            return {"discovery.type": "single-node"}
        return {
            "discovery.seed_hosts": [f"{self.host}:{self.transport_port(node)}" for node in nodes],
            "cluster.initial_cluster_manager_nodes": [f"ki-node-{node}" for node in nodes],
        }

    def settings_yml(self) -> dict[str, object]:
        http_port, transport_port = self.ports
        return {
            "cluster.name": CLUSTER_NAME,
            "node.name": f"ki-node-{self.node}",
            "path.data": str(self.state_dir / "data"),
            "path.logs": str(self.state_dir / "logs"),
            # Where index snapshots may go (`ki bench corpus` keeps its built index there for re-runs); on a
            # cluster every node must see the same location: node 1's.
            "path.repo": str(self.paths.state_dir(type(self).name, runs_as_invoker=self.runs_as_invoker) / "snapshots"),
            "network.host": self.host,
            "http.port": http_port,
            "transport.port": transport_port,
            **self.discovery(),
            # A developer disk is often fuller than a server's: never block writes for that.
            "cluster.routing.allocation.disk.watermark.low": "97%",
            "cluster.routing.allocation.disk.watermark.high": "98%",
            "cluster.routing.allocation.disk.watermark.flood_stage": "99%",
        }

    def secure_yml(self) -> dict[str, object]:
        """The security plugin: TLS on transport and HTTP from the secured profile's files (copied into the
        config directory, the only place it reads them), its users and roles loaded at the first start."""
        files = {"pemcert_filepath": "secure/node.pem", "pemkey_filepath": "secure/node-key.pem",
                 "pemtrustedcas_filepath": "secure/ca.pem"}  # fmt: skip
        settings: dict[str, object] = {f"plugins.security.ssl.{layer}.{key}": value
                                       for layer in ("transport", "http") for key, value in files.items()}  # fmt: skip
        return {
            **settings,
            "plugins.security.ssl.http.enabled": True,
            "plugins.security.ssl.transport.enforce_hostname_verification": False,
            "plugins.security.allow_default_init_securityindex": True,
            "plugins.security.authcz.admin_dn": [distinguished_name(ADMIN_CN)],
            "plugins.security.nodes_dn": [distinguished_name(NODE_CN)],
            "plugins.security.audit.type": "noop",
            "plugins.security.restapi.roles_enabled": ["all_access"],
            "plugins.security.system_indices.enabled": True,
        }

    def write_security_config(self, home: Path) -> None:
        material = SecureMaterial.of(self.settings)
        secure = self.config_dir / "secure"
        self.user.make_dir(secure, 0o700)
        copies = {"ca.pem": material.ca_cert, "node.pem": material.server_cert, "node-key.pem": material.server_key}
        for name, source in copies.items():
            self.user.write(secure / name, source.read_text(), mode=0o600)
        security = self.config_dir / "opensearch-security"
        self.user.make_dir(security, 0o700)
        for default in sorted((home / SECURITY_DEFAULTS).glob("*.yml")):
            self.user.write(security / default.name, default.read_text(), mode=0o600)
        for name, text in opensearch_security_files(self.settings, material).items():
            self.user.write(security / name, text, mode=0o600)

    def admin_auth(self) -> Auth:
        """The stack's own probes: the security plugin's administrator, when the profile is secured."""
        if not stack_settings(self.settings).secure:
            return NO_AUTH
        material = SecureMaterial.of(self.settings)
        return Auth("admin", material.password("opensearch", "admin"), str(material.ca_cert))

    def jvm_options(self) -> str:
        heap = stack_settings(self.settings).opensearch_heap
        logs = self.state_dir / "logs"
        lines = [
            "# Written by `ki stack up` from the settings; edits are overwritten.",
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:G1ReservePercent=25",
            "-XX:InitiatingHeapOccupancyPercent=30",
            "-Djava.io.tmpdir=${OPENSEARCH_TMPDIR}",
            "-XX:+HeapDumpOnOutOfMemoryError",
            f"-XX:HeapDumpPath={self.state_dir / 'data'}",
            f"-XX:ErrorFile={logs}/hs_err_pid%p.log",
            f"-Xlog:gc*,gc+age=trace,safepoint:file={logs}/gc.log:utctime,pid,tags:filecount=4,filesize=16m",
            "18-:-Djava.security.manager=allow",
            "20-:--add-modules=jdk.incubator.vector",
            "-Djava.util.concurrent.ForkJoinPool.common.threadFactory="
            "org.opensearch.secure_sm.SecuredForkJoinWorkerThreadFactory",
        ]
        return "\n".join(lines) + "\n"

    def prepare(self, runtime: Runtime) -> Launch:
        for sub in ("config", "data", "logs", "tmp"):
            self.user.make_dir(self.state_dir / sub)
        home = self.distribution(runtime)
        values = {**self.settings_yml(), **(self.secure_yml() if stack_settings(self.settings).secure else {})}
        if stack_settings(self.settings).secure:
            self.write_security_config(home)
        yml = "".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items())
        self.write_config(self.config_dir / "opensearch.yml", "# Written by `ki stack up`.\n" + yml)
        self.write_config(self.config_dir / "jvm.options", self.jvm_options())
        self.write_config(self.config_dir / "log4j2.properties", LOG4J_TEMPLATE.read_text())
        env = {
            "OPENSEARCH_JAVA_HOME": str(runtime.java.home),
            "OPENSEARCH_PATH_CONF": str(self.config_dir),
            "OPENSEARCH_TMPDIR": str(self.state_dir / "tmp"),
            "OPENSEARCH_JAVA_OPTS": "",
            "HOME": str(self.state_dir),
        }
        return Launch([str(home / "bin" / "opensearch")], cwd=self.state_dir, env=env, reads=(home, runtime.java.home))

    def distribution(self, runtime: Runtime) -> Path:
        """The assembled OpenSearch it runs from: the artifact cache itself, or, when it runs as the
        service account, a copy in the stack's system directory (the cache is in the user's home)."""
        if self.runs_as_invoker:
            return runtime.artifacts.opensearch_home
        return copy_resolved(runtime.artifacts.opensearch_home, self.paths.make_system_dir() / "artifacts")

    def probe(self) -> str | None:
        try:
            status, health = request_json("GET", f"{self.url}/_cluster/health", timeout=3, auth=self.admin_auth())
        except HttpError as exc:
            return str(exc)
        if status != 200 or not isinstance(health, dict):
            return f"GET /_cluster/health answered {status}"
        if health.get("status") not in ("yellow", "green"):
            return f"cluster status {health.get('status')}"
        return None

    def after_healthy(self) -> None:
        """The assembled modules and the k-NN plugin must really be loaded, not just present on disk."""
        engine = self.settings.retrieval.vector_engine
        if engine != "lucene":
            # The k-NN zip served by Maven has no native faiss/nmslib libraries: indexing such a field
            # throws UnsatisfiedLinkError, which OpenSearch treats as fatal and exits.
            raise StackError(
                f"retrieval.vector_engine is {engine!r}, but this stack's k-NN plugin has no native "
                "libraries: only 'lucene' works here (faiss/nmslib would crash the node)"
            )
        status, nodes = request_json("GET", f"{self.url}/_nodes/plugins", timeout=10, auth=self.admin_auth())
        loaded: set[str] = set()
        for node in (nodes or {}).get("nodes", {}).values():
            loaded |= {m["name"] for m in node.get("modules", [])} | {p["name"] for p in node.get("plugins", [])}
        wanted = [
            *(m.name for m in OPENSEARCH_MODULES),
            KNN_PLUGIN,
            *([SECURITY_PLUGIN] if stack_settings(self.settings).secure else []),
        ]
        missing = [name for name in wanted if name not in loaded]
        if status != 200 or missing:
            raise StackError(f"started without {', '.join(missing) or 'node info'}")
