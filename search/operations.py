"""How the search service runs, for operators and administrators: readiness, the index gauges, the access
audit, retrieval statistics and who counts as an operator or administrator.

Composed beside `search.service.SearchService` (search.compose) and never on a search's path: a request
reaches it only for `/readyz`, `/metrics`, the admin endpoints and its audit row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opensearchpy import AsyncOpenSearch
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ki.acl import resolve_caller
from ki.clients import database_errors
from ki.principals import canonical_principal
from ki.settings import Settings
from search.access.invalidation import InvalidationFeed
from search.access.scope_cache import ScopeCache
from search.telemetry.audit import AuditLog, read_audit, record_of
from search.telemetry.metrics import SearchMetrics
from search.telemetry.stats import StatsRecorder
from search.telemetry.stats import summary as stats_summary


def scope_cache_state(scope_cache: ScopeCache | None, feed: InvalidationFeed | None) -> dict[str, Any]:
    """For `/readyz`: whether the scope cache is in use, and why not."""
    if scope_cache is None or feed is None:
        return {"enabled": False, "usable": False, "reason": "api.caches.scope_size is 0"}
    health = feed.health()
    lag = None if health.lag_s is None else round(health.lag_s, 3)
    return {"enabled": True, "usable": health.usable, "reason": health.reason, "feed_lag_s": lag}


class Operations:
    """The operations side of one search service: it shares the service's engine, client, metrics, retrieval
    statistics recorder and scope cache (which the service owns and starts), and owns the access audit."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        client: AsyncOpenSearch,
        metrics: SearchMetrics,
        *,
        stats: StatsRecorder | None = None,
        scope_cache: ScopeCache | None = None,
        feed: InvalidationFeed | None = None,
    ) -> None:
        self.settings, self.engine, self.client, self.metrics = settings, engine, client, metrics
        self.index = settings.retrieval.index_name
        self.stats, self.scope_cache, self.feed = stats, scope_cache, feed
        # The access audit (search.telemetry.audit): a row per request, recorded by the HTTP API and the MCP server.
        self.audit: AuditLog | None = None
        if settings.api.audit.enabled:
            self.audit = AuditLog(engine, settings.api, on_dropped=lambda n: self.metrics.audit_dropped.inc(n))

    def start(self) -> None:
        if self.audit is not None:
            self.audit.start()

    async def close(self) -> None:
        if self.audit is not None:
            await self.audit.close()

    def is_operator(self, principals: Sequence[str]) -> bool:
        """Does the token name an operator or administrator principal (`security.operator_principals`,
        `security.admin_principals`)? Read from the token alone: who may see how the service runs."""
        security = self.settings.security
        wanted = {canonical_principal(p) for p in [*security.operator_principals, *security.admin_principals]}
        return any(canonical_principal(p) in wanted for p in principals)

    async def is_admin(self, principals: Sequence[str]) -> bool:
        """Whether the caller is an administrator (aliases and groups resolved in SQL, as for search)."""
        security = self.settings.security
        with database_errors():
            async with self.engine.connect() as conn:
                caller = await conn.run_sync(lambda c: resolve_caller(c, principals, security))
        return caller.is_admin

    def audit_request(self, principals: Sequence[str], endpoint: str, status: int, answer: Any) -> None:
        """One access-audit row (search.telemetry.audit): who asked where, and the documents the answer named."""
        if self.audit is not None:
            self.audit.record(record_of(principals, endpoint, status, answer))

    async def read_audit(self, hours: int, principal: str | None, limit: int) -> dict[str, Any]:
        """The audit's newest rows (what is still buffered written first)."""
        if self.audit is None:
            return {"enabled": False, "rows": []}
        await self.audit.flush()
        with database_errors():
            async with self.engine.connect() as conn:
                rows = await conn.run_sync(lambda c: read_audit(c, hours, principal, limit))
        return {"enabled": True, "rows": rows}

    async def stats_summary(self, hours: int) -> dict[str, Any]:
        """The last `hours` of retrieval statistics (search.telemetry.stats), what is still buffered written
        first."""
        if self.stats is not None:
            await self.stats.flush()
        with database_errors():
            async with self.engine.connect() as conn:
                out = await conn.run_sync(lambda c: stats_summary(c, hours))
        return {"enabled": self.stats is not None, **out}

    async def refresh_index_gauges(self, timeout_s: float) -> str | None:
        """Read the alias target, store size and rows from OpenSearch into the index gauges; on failure keep
        the old values and answer why (a scrape must not fail because OpenSearch is briefly away)."""
        try:
            aliases = await self.client.indices.get_alias(index=self.index, name=self.index, request_timeout=timeout_s)
            stats = await self.client.indices.stats(
                index=self.index, metric="store,docs", request_timeout=timeout_s
            )  # fmt: skip
            health = await self.client.cluster.health(request_timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported on the dashboard
            return f"{type(exc).__name__}: {exc}"[:300]
        self.metrics.cluster_health(health)
        primaries = stats["_all"]["primaries"]
        self.metrics.index_state(
            self.index, sorted(aliases), int(primaries["store"]["size_in_bytes"]), int(primaries["docs"]["count"])
        )
        return None

    def scope_cache_state(self) -> dict[str, Any]:
        """For `/readyz`: whether the service's scope cache is in use, and why not."""
        return scope_cache_state(self.scope_cache, self.feed)

    async def ready(self) -> dict[str, Any]:
        """PostgreSQL reachable, OpenSearch reachable, the index alias present and every primary shard of it
        assigned (red: some rows could not be found; yellow, a replica missing, still serves)."""
        checks: dict[str, Any] = {}
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            checks["postgresql"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            checks["postgresql"] = f"error: {type(exc).__name__}: {exc}"[:300]
        try:
            present = await self.client.indices.exists_alias(index=self.index, name=self.index)
            checks["opensearch"] = "ok"
            checks["index"] = "ok" if present else f"alias {self.index!r} missing"
            if present:
                health = await self.client.cluster.health(index=self.index)
                if health.get("status") == "red":
                    checks["index"] = "red: a primary shard of the index is on no node"
        except Exception as exc:  # noqa: BLE001
            checks["opensearch"] = f"error: {type(exc).__name__}: {exc}"[:300]
            checks["index"] = "unknown"
        return checks
