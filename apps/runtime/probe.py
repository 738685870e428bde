"""A health probe for containers without curl: `python -m apps.runtime.probe TARGET...`.

Each target is an `http://` URL, which must answer 2xx (the API's `GET /readyz`, a sync lane's `/metrics`), or
`tcp://host:port`, which must accept a connection (the MCP server, whose every HTTP request needs a token). Exit
status 0 when every target passes within `--timeout` seconds each, 1 otherwise, with one line per failure on stderr.
The image's compose services and Kubernetes exec probes run it (the sync lanes' web servers listen on loopback only,
so only a probe inside the container reaches them).
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.request
from urllib.parse import urlparse


def check(target: str, timeout: float) -> str | None:
    """Why `target` fails, or None when it passes."""
    parsed = urlparse(target)
    try:
        if parsed.scheme == "tcp":
            if not parsed.hostname or not parsed.port:
                return f"{target}: expected tcp://host:port"
            with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout):
                return None
        if parsed.scheme != "http":
            return f"{target}: expected an http:// or tcp:// target"
        with urllib.request.urlopen(target, timeout=timeout) as response:  # noqa: S310 - http only, checked above
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{target}: {exc}"
    return None if 200 <= status < 300 else f"{target}: HTTP {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apps.runtime.probe", description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", metavar="TARGET", help="http://host:port/path or tcp://host:port")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per target (default 3)")
    args = parser.parse_args(argv)
    failures = [problem for target in args.targets if (problem := check(target, args.timeout))]
    for problem in failures:
        print(f"probe: {problem}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
