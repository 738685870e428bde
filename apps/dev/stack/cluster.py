"""The cluster profile (`ki stack up --cluster`): three Kafka brokers (KRaft, each broker and controller)
and three OpenSearch nodes on this machine, beside one PostgreSQL and one Connect, so that failover can be
tested natively: a replica promoted when a node dies, a partition leader moving when a broker dies.

Node N listens on node 1's ports (the settings' ports) plus (N - 1) x `stack.cluster_port_step`. The profile's
client settings -- every broker and node address, replication factor 3 with two in-sync replicas, one index
replica, heaps sized for two cores -- are written to `<stack.home>/cluster.env`; the stack commands load it
themselves whenever it is there (the home remembers its profile until `ki stack wipe`), every other `ki`
command after `set -a; . <stack.home>/cluster.env; set +a`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from apps.dev.stack.errors import StackError
from apps.dev.stack.secure import read_env_file
from apps.dev.stack.settings import stack_settings
from ki.settings import Settings, with_environment

NODES = 3
#: Heaps that let three OpenSearch nodes, three brokers and Connect share two cores and a few GB.
CLUSTER_HEAPS = {"KI_STACK__OPENSEARCH_HEAP": "768m", "KI_STACK__KAFKA_HEAP": "384m"}


def node_count(settings: Settings) -> int:
    return NODES if stack_settings(settings).cluster else 1


def node_port(port: int, node: int, settings: Settings) -> int:
    """Node `node`'s (1-based) port for the port node 1 has."""
    return port + (node - 1) * stack_settings(settings).cluster_port_step


def _first_broker(settings: Settings) -> tuple[str, int]:
    host, _, port = settings.kafka.brokers[0].rpartition(":")
    return host, int(port)


def broker_address(settings: Settings, node: int) -> tuple[str, int]:
    host, port = _first_broker(settings)
    return host, node_port(port, node, settings)


def opensearch_url(settings: Settings, node: int) -> str:
    parts = urlsplit(settings.opensearch.urls[0])
    port = node_port(parts.port or 9200, node, settings)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


def cluster_env(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `KI_*` settings of the cluster profile, from node 1's addresses in `settings`. Heaps the
    environment already sets stay as set."""
    environ = os.environ if environ is None else environ
    brokers = ",".join("{}:{}".format(*broker_address(settings, n)) for n in range(1, NODES + 1))
    urls = ",".join(opensearch_url(settings, n) for n in range(1, NODES + 1))
    env = {
        "KI_STACK__CLUSTER": "true",
        "KI_KAFKA__BOOTSTRAP_SERVERS": brokers,
        "KI_OPENSEARCH__URL": urls,
        "KI_KAFKA__REPLICATION_FACTOR": str(NODES),
        "KI_KAFKA__MIN_INSYNC_REPLICAS": str(NODES - 1),
        "KI_OPENSEARCH__NUMBER_OF_REPLICAS": "1",
    }
    env.update({key: value for key, value in CLUSTER_HEAPS.items() if key not in environ})
    return env


def env_file(settings: Settings) -> Path:
    return Path(stack_settings(settings).home).expanduser().resolve() / "cluster.env"


def write_env_file(settings: Settings) -> Path:
    path = env_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Written by `ki stack up --cluster`: the cluster profile's client settings."]
    lines += [f"{key}={value}" for key, value in sorted(cluster_env(settings).items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def with_profile(settings: Settings, *, cluster: bool = False) -> Settings:
    """The settings the stack commands act on: the cluster profile's when asked for (`up --cluster`, which
    writes its env file) or when this home was started as a cluster (the file is there)."""
    if stack_settings(settings).cluster and len(settings.kafka.brokers) == NODES:
        return settings  # already the cluster's settings (its env file was sourced)
    path = env_file(settings)
    if cluster or stack_settings(settings).cluster:
        if stack_settings(settings).secure:
            raise StackError("the cluster profile is not secured yet: run `ki stack up --cluster` without --secure")
        write_env_file(settings)
    elif not path.is_file():
        return settings
    return with_environment(settings, read_env_file(path))
