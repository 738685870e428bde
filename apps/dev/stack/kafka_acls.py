"""Kafka ACLs of the secured profile: one login per role, each allowed only what it needs.

The brokers run StandardAuthorizer with no ACL meaning no access (`allow.everyone.if.no.acl.found` false);
`broker` is the only super user (inter-broker and controller traffic, and this module, which writes the
ACLs once Kafka answers). The roles, by what they touch (`kafka.topic_prefix` "ki" in the examples):

* `connect` -- Kafka Connect with Debezium: writes and creates the CDC topics (`ki.*`, and `ki_eval_*` for
  `ki eval`'s connectors) and Debezium's heartbeat topics (`__debezium-heartbeat.*`), owns its own config,
  offset and status topics (`ki-connect-*`) and its worker group.
* `ki_worker` -- the sync worker: reads the CDC topics and `ki.message` (the truncate markers), creates a
  missing one, compacted, before the lanes start, writes the dead-letter topic (and reads it for the waiting
  dead letters' gauges), and uses the lanes' groups (`streams.app_id*`).
* `ki_api` -- the search API's invalidation feed: reads the access tables' topics, the heartbeat and the
  truncate markers, with no group (it assigns partitions and commits nothing); for a consistency token's wait
  it may describe (not read) every CDC topic and the lanes' groups.
* `ki_operator` -- `ki stack`, `ki rebuild`, `ki sync status`, `ki eval`: every topic under the prefix, the
  eval's worlds (`ki_eval_*`) and the DLQ; the lanes' groups and the tools' own (`ki-replay-*`, `ki-eval-*`).

Each is a list of (resource, name, pattern, operations); `bindings` turns them into confluent-kafka's
`AclBinding`s, all ALLOW from any host; `acl_arguments` into `kafka-acls.sh --add` arguments (what
docker-compose.secure.yml's one-shot `kafka-acls` service applies; `python -m apps.dev.stack.kafka_acls`
prints them).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from ki.settings import Settings, load_settings
from projections.cdc import message_topic, topic_name
from search.access.invalidation import HEARTBEAT_TABLE, SCOPE_TABLES

#: `ki eval`'s worlds: their topics (its own Debezium connectors write them through the same Connect).
EVAL_TOPIC_PREFIX = "ki_eval_"
#: The operator's tools' own consumer groups: `ki rebuild`'s `ki-replay-*`, `ki eval`'s `ki-eval-*`.
TOOL_GROUP_PREFIX = "ki-"

READ = (AclOperation.READ, AclOperation.DESCRIBE)
WRITE = (AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)
OWN = (AclOperation.ALL,)


@dataclass(frozen=True)
class Grant:
    login: str
    resource: ResourceType
    name: str
    pattern: ResourcePatternType
    operations: tuple[AclOperation, ...]


def grants(settings: Settings) -> list[Grant]:
    prefix = settings.kafka.topic_prefix
    cdc = f"{prefix}.public."
    app = settings.streams.app_id
    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    return [
        Grant("connect", topic, f"{prefix}.", prefixed, WRITE),
        Grant("connect", topic, EVAL_TOPIC_PREFIX, prefixed, WRITE),
        Grant("connect", topic, "__debezium-heartbeat.", prefixed, WRITE),
        Grant("connect", topic, f"{prefix}-connect-", prefixed, OWN),
        Grant("connect", group, f"{prefix}-connect", literal, READ),
        Grant("ki_worker", topic, cdc, prefixed, (*READ, AclOperation.CREATE)),
        # Debezium's logical-decoding messages: the truncate markers (`projections.cdc`), read by the access lane.
        Grant("ki_worker", topic, message_topic(prefix), literal, (*READ, AclOperation.CREATE)),
        # Writes dead letters; the lanes' DLQ gauges read their times (assigned, no group, nothing committed).
        Grant("ki_worker", topic, settings.streams.dlq_topic, literal, (*WRITE, AclOperation.READ)),
        Grant("ki_worker", group, app, prefixed, READ),
        *(
            Grant("ki_api", topic, topic_name(prefix, table), literal, READ)
            for table in (*SCOPE_TABLES, HEARTBEAT_TABLE)
        ),
        Grant("ki_api", topic, message_topic(prefix), literal, READ),  # a truncate marker drops every scope
        # A consistency token's wait (search.consistency): the lanes' log ends and committed offsets, no data.
        Grant("ki_api", topic, cdc, prefixed, (AclOperation.DESCRIBE,)),
        Grant("ki_api", group, app, prefixed, (AclOperation.DESCRIBE,)),
        Grant("ki_operator", topic, prefix, prefixed, OWN),
        Grant("ki_operator", topic, EVAL_TOPIC_PREFIX, prefixed, OWN),
        Grant("ki_operator", topic, settings.streams.dlq_topic, literal, OWN),
        Grant("ki_operator", group, app, prefixed, OWN),
        Grant("ki_operator", group, TOOL_GROUP_PREFIX, prefixed, OWN),
    ]


def bindings(settings: Settings) -> list[AclBinding]:
    """Every grant's operations as bindings, each once (the broker refuses a request that names one twice)."""
    unique = dict.fromkeys(
        AclBinding(g.resource, g.name, g.pattern, f"User:{g.login}", "*", operation, AclPermissionType.ALLOW)
        for g in grants(settings)
        for operation in g.operations
    )
    return list(unique)


def acl_arguments(settings: Settings) -> list[str]:
    """Each grant as one line of `kafka-acls.sh --add` arguments (names never contain spaces)."""
    option = {ResourceType.TOPIC: "--topic", ResourceType.GROUP: "--group"}
    lines = []
    for g in grants(settings):
        operations = " ".join(f"--operation {_pascal(op.name)}" for op in g.operations)
        lines.append(f"--allow-principal User:{g.login} {option[g.resource]} {g.name} "
                     f"--resource-pattern-type {g.pattern.name.lower()} {operations}")  # fmt: skip
    return lines


def _pascal(name: str) -> str:
    """`DESCRIBE_CONFIGS` -> `DescribeConfigs`, the names kafka-acls.sh lists."""
    return "".join(word.capitalize() for word in name.split("_"))


def main(argv: list[str] | None = None) -> int:
    """`python -m apps.dev.stack.kafka_acls`: every role's ACLs as `kafka-acls.sh --add` arguments, one line each."""
    argparse.ArgumentParser(prog="python -m apps.dev.stack.kafka_acls", description=main.__doc__).parse_args(argv)
    for line in acl_arguments(load_settings()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
