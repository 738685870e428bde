"""Keep the stack's listening ports out of Linux's ephemeral range.

The stack's default ports (55432, 59092, 59200, ...) lie inside the ephemeral range (32768-60999 on most
machines). An outgoing connection may be handed one of them as its local port while a service is down
(a restart in a fault test, `ki stack start`), and the service then fails to bind it. Listing them in
`net.ipv4.ip_local_reserved_ports` stops the kernel from handing them out; explicit binds still work.
Only root can write it; elsewhere nothing changes (and the collision stays as unlikely as it was).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from apps.dev.stack.settings import stack_settings
from ki.settings import Settings, load_settings

RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")


def parse_reserved(text: str) -> set[int]:
    """The ports of a `ip_local_reserved_ports` value (`"8080,9000-9002"`)."""
    ports: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def format_reserved(ports: Iterable[int]) -> str:
    """Sorted ports as the kernel takes them, consecutive ones as ranges."""
    runs: list[list[int]] = []
    for port in sorted(set(ports)):
        if runs and port == runs[-1][1] + 1:
            runs[-1][1] = port
        else:
            runs.append([port, port])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def reserve(ports: Iterable[int], path: Path = RESERVED_PORTS) -> bool:
    """Add `ports` to the kernel's reserved ports; False when that cannot be done here (not root, no file)."""
    wanted = set(ports)
    try:
        current = parse_reserved(path.read_text())
        if wanted <= current:
            return True
        path.write_text(format_reserved(current | wanted))
    except (OSError, ValueError):
        return False
    return True


def shifted_ports(settings: Settings, shift: int) -> dict[str, str]:
    """`KI_*` variables that move every listening port of the stack and the sync lanes' web ports by
    `shift`, so a second stack with its own home can run beside the first (the test lanes). The API's and
    MCP's ports stay: tests bind free ports for those."""
    if shift == 0:
        return {}
    moved = {
        "KI_DATABASE__PORT": settings.database.port,
        "KI_KAFKA__CONTROLLER_PORT": settings.kafka.controller_port,
        "KI_OPENSEARCH__TRANSPORT_PORT": settings.opensearch.transport_port,
        "KI_STREAMS__WEB_PORT": settings.streams.web_port,
        "KI_STACK__KEYCLOAK_PORT": stack_settings(settings).keycloak_port,
    }
    env = {name: str(_moved(port, shift)) for name, port in moved.items()}
    lanes = {"access": settings.streams.access_web_port, "principals": settings.streams.principals_web_port}
    env |= lane_port_env({lane: _moved(port, shift) for lane, port in lanes.items() if port is not None})
    brokers = (broker.rpartition(":") for broker in settings.kafka.brokers)
    env["KI_KAFKA__BOOTSTRAP_SERVERS"] = ",".join(f"{host}:{_moved(int(port), shift)}" for host, _, port in brokers)
    env["KI_CONNECT__URL"] = _moved_url(settings.connect.url, shift)
    env["KI_OPENSEARCH__URL"] = ",".join(_moved_url(url, shift) for url in settings.opensearch.urls)
    return env


def lane_port_env(ports: Mapping[str, int]) -> dict[str, str]:
    """`KI_*` variables giving each named sync lane (`projections.lanes`) its web port."""
    names = {"content": "KI_STREAMS__WEB_PORT", "access": "KI_STREAMS__ACCESS_WEB_PORT",
             "principals": "KI_STREAMS__PRINCIPALS_WEB_PORT"}  # fmt: skip
    return {names[lane]: str(port) for lane, port in ports.items()}


def _moved(port: int, shift: int) -> int:
    moved = port + shift
    if not 1 <= moved <= 65535:
        raise ValueError(f"port {port} shifted by {shift} is outside 1-65535")
    return moved


def _moved_url(url: str, shift: int) -> str:
    parts = urlsplit(url)
    if parts.port is None:
        raise ValueError(f"{url} names no port to shift")
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{_moved(parts.port, shift)}"))


def main(argv: list[str] | None = None) -> int:
    """`python -m apps.dev.stack.ports --shift N`: the shifted ports as `KEY=VALUE` lines (for `set -a; . file`)."""
    parser = argparse.ArgumentParser(prog="python -m apps.dev.stack.ports", description=main.__doc__)
    parser.add_argument("--shift", type=int, required=True, help="added to every port")
    args = parser.parse_args(argv)
    try:
        env = shifted_ports(load_settings(), args.shift)
    except ValueError as exc:
        print(f"ports: {exc}", file=sys.stderr)
        return 2
    for name, value in sorted(env.items()):
        print(f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
