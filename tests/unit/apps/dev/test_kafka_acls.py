"""The secured profile's Kafka ACLs (apps.dev.stack.kafka_acls): each role gets what it needs and no more."""

from __future__ import annotations

from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from apps.dev.stack.kafka_acls import bindings
from ki.settings import Settings


def allowed(login: str) -> set[tuple[str, str, str, str]]:
    return {
        (b.restype.name, b.name, b.resource_pattern_type.name, b.operation.name)
        for b in bindings(Settings())
        if b.principal == f"User:{login}"
    }


def test_the_api_reads_the_access_topics_and_only_describes_the_rest() -> None:
    api = allowed("ki_api")
    assert {op for _, _, _, op in api} == {"READ", "DESCRIBE"}
    read = {(kind, name, pattern) for kind, name, pattern, op in api if op == "READ"}
    assert all(kind == "TOPIC" and pattern == "LITERAL" for kind, _, pattern in read)
    topics = {name for _, name, _ in read}
    assert {"ki.public.grants", "ki.public.group_memberships", "ki.public.debezium_heartbeat"} <= topics
    assert "ki.message" in topics  # the truncate markers
    assert "ki.dlq" not in topics and not any(name.startswith("ki-connect") for name in topics)
    # A consistency token's wait: the CDC topics' ends and the lanes' committed offsets, described only.
    described = {(kind, name, pattern) for kind, name, pattern, op in api if op == "DESCRIBE"} - read
    assert described == {("TOPIC", "ki.public.", "PREFIXED"), ("GROUP", "ki-sidecar", "PREFIXED")}


def test_the_worker_reads_cdc_writes_only_the_dlq_and_uses_only_its_groups() -> None:
    worker = allowed("ki_worker")
    writes = {name for kind, name, _, op in worker if op == "WRITE"}
    assert writes == {"ki.dlq"}
    reads = {name for kind, name, _, op in worker if kind == "TOPIC" and op == "READ"}
    # The CDC topics, the truncate markers, and the dead letters for the DLQ gauges.
    assert reads == {"ki.public.", "ki.message", "ki.dlq"}
    groups = {(name, pattern) for kind, name, pattern, _ in worker if kind == "GROUP"}
    assert groups == {("ki-sidecar", "PREFIXED")}  # the content lane's group and `ki-sidecar-access`
    assert not any(name.startswith("ki-connect") for _, name, _, _ in worker)


def test_connect_writes_cdc_topics_and_owns_only_its_own() -> None:
    connect = allowed("connect")
    assert ("TOPIC", "ki.", "PREFIXED", "WRITE") in connect
    assert ("TOPIC", "ki-connect-", "PREFIXED", "ALL") in connect
    assert not any(op == "READ" for kind, name, _, op in connect if kind == "TOPIC" and name.startswith("ki."))
    assert {name for kind, name, _, _ in connect if kind == "GROUP"} == {"ki-connect"}


def test_every_binding_allows_one_named_login_and_never_a_wildcard() -> None:
    for binding in bindings(Settings()):
        assert binding.principal.startswith("User:") and "*" not in binding.principal
        assert binding.name and binding.resource_pattern_type in (
            ResourcePatternType.LITERAL,
            ResourcePatternType.PREFIXED,
        )
        assert binding.restype in (ResourceType.TOPIC, ResourceType.GROUP)
        assert binding.operation != AclOperation.ALL or binding.principal in ("User:connect", "User:ki_operator")


def test_no_binding_is_listed_twice() -> None:
    """The broker refuses a CreateAcls request that names one binding twice: the secured stack would not start
    (a grant of READ and one of WRITE on the same topic both carry DESCRIBE)."""
    from apps.dev.stack.kafka_acls import grants

    named = [(g.login, g.resource, g.name, g.pattern, op) for g in grants(Settings()) for op in g.operations]
    assert len(named) == len(set(named))
    assert len(bindings(Settings())) == len(named)
