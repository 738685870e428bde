"""The operations service beside the search service (search.operations): what it decides without I/O."""

from __future__ import annotations

from typing import Any

from ki.settings import load_settings
from search.operations import Operations, scope_cache_state
from search.telemetry.metrics import SearchMetrics


def _operations(environ: dict[str, str]) -> Operations:
    none: Any = None  # no engine or client: nothing here reaches PostgreSQL or OpenSearch
    return Operations(load_settings(environ=environ), none, none, SearchMetrics())


def test_operators_and_administrators_are_read_from_the_token() -> None:
    ops = _operations({"KI_API__AUDIT__ENABLED": "false"})
    assert ops.is_operator(["user:anna", " ROLE:OPERATOR "])
    assert ops.is_operator(["role:admin"])
    assert not ops.is_operator(["user:anna", "group:ops"])


def test_without_a_scope_cache_readiness_says_why() -> None:
    assert scope_cache_state(None, None) == {"enabled": False, "usable": False, "reason": "api.caches.scope_size is 0"}
    assert _operations({"KI_API__AUDIT__ENABLED": "false"}).scope_cache_state()["enabled"] is False


def test_with_the_audit_off_no_row_is_recorded_and_none_is_read() -> None:
    import asyncio

    ops = _operations({"KI_API__AUDIT__ENABLED": "false"})
    assert ops.audit is None
    ops.audit_request(["user:anna"], "/v1/search", 200, {"hits": []})  # a no-op, not an error
    assert asyncio.run(ops.read_audit(24, None, 10)) == {"enabled": False, "rows": []}
