"""Keep the stack's listening ports out of Linux's ephemeral range.

The stack's default ports (55432, 59092, 59200, ...) lie inside the ephemeral range (32768-60999 on most
machines). An outgoing connection may be handed one of them as its local port while a service is down
(a restart in a fault test, `ki stack start`), and the service then fails to bind it. Listing them in
`net.ipv4.ip_local_reserved_ports` stops the kernel from handing them out; explicit binds still work.
Only root can write it; elsewhere nothing changes (and the collision stays as unlikely as it was).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

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
