"""A tiny JSON-over-HTTP client for health checks and the Connect / OpenSearch REST APIs (stdlib only,
so the stack tooling works before anything else is importable)."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any


class HttpError(OSError):
    """Connection refused, timeout, or an unreadable answer."""


@dataclass(frozen=True)
class Auth:
    """Basic credentials and the CA bundle for one REST API (Connect's, OpenSearch's)."""

    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""

    def context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None


NO_AUTH = Auth()


def request_json(
    method: str, url: str, body: Any = None, timeout: float = 5.0, auth: Auth = NO_AUTH
) -> tuple[int, Any]:
    """(status, decoded JSON body or None). HTTP error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    if auth.username:
        basic = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
        req.add_header("Authorization", f"Basic {basic}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=auth.context()) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # the last: e.g. plain HTTP to TLS
        reason = getattr(exc, "reason", exc)
        raise HttpError(f"{method} {url}: {reason}") from None
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")
