"""The Debezium PostgreSQL connector: its configuration (the JSON template next to this file, filled
from the settings) and an idempotent registration through the Connect REST API."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from apps.dev.stack.errors import StackError
from apps.dev.stack.http import Auth, HttpError, request_json
from ki.db.models import HEARTBEAT_ACTION_QUERY, PUBLISHED_TABLES
from ki.settings import Settings

TEMPLATE = Path(__file__).with_name("debezium-connector.json")
SCHEMA = "public"
_PLACEHOLDER = re.compile(r"\$\{([a-z_.]+)\}")
POLL_INTERVAL_S = 0.5
#: After restarting a failed connector, a FAILED state older than this is the restart's own failure.
RESTART_GRACE_S = 5.0


def _lookup(settings: Settings, key: str) -> Any:
    section, _, field = key.partition(".")
    try:
        return getattr(getattr(settings, section), field)
    except AttributeError:
        raise StackError(f"{TEMPLATE.name}: unknown placeholder ${{{key}}}") from None


def connector_config(settings: Settings) -> dict[str, str]:
    """The template with every `${section.field}` (or derived name) replaced; all values strings."""
    derived = {
        "database_hostname": settings.connect.database_hostname or settings.database.host,
        "table_include_list": ",".join(f"{SCHEMA}.{table}" for table in PUBLISHED_TABLES),
        "heartbeat_action_query": HEARTBEAT_ACTION_QUERY,
        "debezium_user": settings.connect.database_user or settings.database.user,
        "debezium_password": settings.connect.database_password
        if settings.connect.database_user
        else settings.database.password,
    }

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        return str(derived[key] if key in derived else _lookup(settings, key))

    template: dict[str, str] = json.loads(TEMPLATE.read_text(encoding="utf-8"))
    config = {key: _PLACEHOLDER.sub(fill, value) for key, value in template.items()}
    # TLS from Connect to PostgreSQL: Debezium takes libpq's parameters under `database.` (its default
    # sslmode is libpq's, prefer, which is left out so an unchanged stack keeps its registered config).
    tls = settings.database.tls_parameters()
    if tls.get("sslmode") == "prefer":
        del tls["sslmode"]
    config.update({f"database.{key}": value for key, value in tls.items()})
    return config


def connect_auth(settings: Settings) -> Auth:
    c = settings.connect
    return Auth(c.username, c.password, str(Path(c.ca_file).expanduser()) if c.ca_file else "")


class Connector:
    def __init__(self, settings: Settings) -> None:
        self.name = settings.connect.connector_name
        self.base = f"{settings.connect.url.rstrip('/')}/connectors/{self.name}"
        self.config = connector_config(settings)
        self.auth = connect_auth(settings)

    def register(self) -> str:
        """PUT the configuration unless Connect already has exactly it; returns what happened."""
        status, current = request_json("GET", f"{self.base}/config", auth=self.auth)
        if status == 200 and isinstance(current, dict):
            current = {k: v for k, v in current.items() if k != "name"}
            if current == self.config:
                return "unchanged"
        status, body = request_json("PUT", f"{self.base}/config", self.config, timeout=30, auth=self.auth)
        if status not in (200, 201):
            raise StackError(f"connector {self.name}: Connect refused the configuration ({status}): {_message(body)}")
        return "created" if status == 201 else "updated"

    def state(self) -> tuple[str, list[str], str]:
        """(connector state, task states, first line of a failure trace)."""
        status, body = request_json("GET", f"{self.base}/status", auth=self.auth)
        if status != 200 or not isinstance(body, dict):
            return "UNKNOWN", [], ""
        tasks = body.get("tasks", [])
        trace = next(
            (t.get("trace", "") for t in [body.get("connector", {}), *tasks] if t.get("state") == "FAILED"), ""
        )
        return body.get("connector", {}).get("state", "UNKNOWN"), [t.get("state", "") for t in tasks], trace

    def pause(self, timeout_s: float = 60.0) -> None:
        """Stop streaming until resumed (the slot and the offsets are kept); returns once Connect says PAUSED."""
        self._set("pause", "PAUSED", timeout_s)

    def resume(self, timeout_s: float = 60.0) -> None:
        """Stream again from where the connector paused; returns once Connect says RUNNING."""
        self._set("resume", "RUNNING", timeout_s)

    def _set(self, action: str, state: str, timeout_s: float) -> None:
        status, body = request_json("PUT", f"{self.base}/{action}", timeout=30, auth=self.auth)
        if status not in (200, 202, 204):
            raise StackError(f"connector {self.name}: Connect refused to {action} it ({status}): {_message(body)}")
        deadline = time.monotonic() + timeout_s
        while self.state()[0] != state:
            if time.monotonic() >= deadline:
                raise StackError(f"connector {self.name} not {state} after {timeout_s:.0f}s")
            time.sleep(POLL_INTERVAL_S)

    def restart_failed(self) -> None:
        request_json("POST", f"{self.base}/restart?includeTasks=true&onlyFailed=true", timeout=30, auth=self.auth)

    def wait_running(self, timeout_s: float, settle_s: float = 0.0) -> None:
        """Until the connector and all its tasks are RUNNING, for `settle_s` in a row (Connect reports a
        task RUNNING as soon as it is started, before Debezium has connected). A connector found FAILED
        (e.g. from an earlier run) is restarted once; failing again raises with the first trace line. A paused
        one (left so by an interrupted `ki bench corpus`) is resumed: the stack is up when it streams."""
        deadline = time.monotonic() + timeout_s
        resumed = False
        restarted_at: float | None = None
        running_since: float | None = None
        while True:
            now = time.monotonic()
            try:
                connector, tasks, trace = self.state()
            except HttpError as exc:
                if now >= deadline:
                    raise StackError(f"connector {self.name}: Connect unreachable: {exc}") from None
                connector, tasks, trace = "UNREACHABLE", [], ""
            if connector == "RUNNING" and tasks and all(t == "RUNNING" for t in tasks):
                running_since = running_since or now
                if now - running_since >= settle_s:
                    return
            else:
                running_since = None
            if connector == "PAUSED" and not resumed:
                request_json("PUT", f"{self.base}/resume", timeout=30, auth=self.auth)
                resumed = True
            if trace and restarted_at is None:
                self.restart_failed()
                restarted_at = now
            elif trace and restarted_at is not None and now - restarted_at >= RESTART_GRACE_S:
                raise StackError(f"connector {self.name} FAILED: {trace.strip().splitlines()[0]}")
            if now >= deadline:
                raise StackError(
                    f"connector {self.name} not RUNNING after {timeout_s:.0f}s ({connector}, tasks {tasks})"
                )
            time.sleep(POLL_INTERVAL_S)


def _message(body: Any) -> str:
    return str(body.get("message", body) if isinstance(body, dict) else body)[:300]
