"""A tiny JSON-over-HTTP client for health checks and the Connect / OpenSearch REST APIs (stdlib only,
so the stack tooling works before anything else is importable)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HttpError(OSError):
    """Connection refused, timeout, or an unreadable answer."""


def request_json(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    """(status, decoded JSON body or None). HTTP error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HttpError(f"{method} {url}: {reason}") from None
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")
