"""The local stack's settings (`stack` in config.json, `KI_STACK__*`): where it lives, its JVMs and its profiles.

Dev tooling only: the runtime's `ki.settings.Settings` carries the section unread (`ToolSettings`) and this module
validates it where the stack's tools need it, so nothing of it sits in the runtime floor."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ki.errors import SettingsError
from ki.settings import LOCAL_STACK_HOME, Settings


class StackSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    home: str = LOCAL_STACK_HOME
    java_home: str = ""
    opensearch_heap: str = "1g"
    kafka_heap: str = "512m"
    connect_heap: str = "512m"
    # Kafka, Connect and Keycloak with the quick compiler only (`-XX:TieredStopAtLevel=1`): the optimising one
    # spends more CPU compiling than a short-lived stack gets back (the test command's stacks: an idle broker
    # took 5.9 % of a core instead of 10.1 %, and half the CPU in its first minutes). OpenSearch keeps both:
    # search and indexing are its hot code.
    quick_jit: bool = False
    start_timeout_s: float = Field(180.0, gt=0)
    # The local identity provider (`ki stack up --idp`, apps/dev/stack/keycloak.py): its port, a Java 21+ for it
    # (empty: the newest under /usr/lib/jvm), and its own start deadline: each start rebuilds its server
    # (Quarkus augmentation) and imports the realm, minutes of CPU on a small, busy machine.
    keycloak_port: int = Field(58180, ge=1, le=65535)
    keycloak_java_home: str = ""
    keycloak_start_timeout_s: float = Field(600.0, gt=0)
    # The secured profile (`ki stack up --secure`, apps/dev/stack/secure.py): TLS and credentials on every
    # service, with a CA, certificates and passwords generated into <home>/secure.
    secure: bool = False
    # The cluster profile (`ki stack up --cluster`, apps/dev/stack/cluster.py): three Kafka brokers and three
    # OpenSearch nodes, node N's ports those of node 1 plus (N - 1) x `cluster_port_step`.
    cluster: bool = False
    cluster_port_step: int = Field(10, ge=2, le=1000)


def stack_settings(settings: Settings) -> StackSettings:
    """The `stack` section of `settings`, validated; a wrong value is one readable `config error: stack.…` line."""
    try:
        return StackSettings.model_validate(settings.stack.given())
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise SettingsError(f"config error: stack.{field}: {err['msg'].removeprefix('Value error, ')}") from None
