"""The caller's scope (search.access.scope): from the scope cache when its invalidation feed is current and it
holds it, else compiled in SQL. Compiled before the request's context exists (beside the query's embedding), so
the service calls `compile` rather than running it as a stage of the context."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy import Connection

from ki.acl import Caller, resolve_caller
from ki.settings import Settings
from search.access.invalidation import ChangeSubscriber, InvalidationFeed
from search.access.scope import CompiledScope, compile_scope
from search.access.scope_cache import ScopeCache
from search.consistency import reading_fresh
from search.names.cache import NameCache
from search.ports import Background, SqlReader
from search.telemetry.metrics import SearchMetrics

log = logging.getLogger(__name__)


class ScopeStage:
    name = "scope"

    def __init__(
        self,
        settings: Settings,
        sql: SqlReader,
        metrics: SearchMetrics,
        background: Background,
        cache: ScopeCache | None,
        feed: InvalidationFeed | None,
    ) -> None:
        self.settings, self.sql, self.metrics, self.background = settings, sql, metrics, background
        self.cache, self.feed = cache, feed
        # Refreshes of stale entries running in the background, one per scope at a time.
        self._refreshing: set[tuple[object, ...]] = set()

    def usable_cache(self) -> ScopeCache | None:
        """The scope cache, if its invalidation feed is current (else None: compile in SQL)."""
        if self.cache is None or self.feed is None:
            return None
        health = self.feed.health()
        self.metrics.feed_usable.set(1 if health.usable else 0)
        if health.lag_s is not None:
            self.metrics.feed_lag.set(health.lag_s)
        self.metrics.scope_cache_ids.set(self.cache.ids_held)
        # A request with a consistency token compiles in SQL: a grant committed before the token counts.
        return self.cache if health.usable and not reading_fresh() else None

    async def compile(self, principals: Sequence[str], project_ids: Sequence[int] | None) -> CompiledScope:
        """The caller's scope: from the cache when its feed is current and it holds it, else in SQL
        (and then cached; as stale if an invalidation arrived meanwhile). A cached scope that a change has made
        stale is answered once more while it is compiled again in the background (search.access.scope_cache):
        the request costs what a hit costs, whoever changed what."""
        started = time.perf_counter()
        cache = self.usable_cache()
        if cache is None and self.cache is not None:
            self.metrics.scope_cache.labels("bypass").inc()
        raw = ScopeCache.raw_key(principals)
        if cache is not None:
            max_stale = self.settings.api.caches.scope_stale_s
            caller, caller_stale = cache.caller(raw, max_stale)
            if caller is not None:
                cached, scope_stale = cache.scope(ScopeCache.scope_key(caller, project_ids), max_stale)
                if cached is not None:
                    self.metrics.scope_cache.labels("stale" if caller_stale or scope_stale else "hit").inc()
                    if caller_stale or scope_stale:
                        self._refresh_later(principals, project_ids, None if caller_stale else caller)
                    self._observe(cached, started)
                    return cached
            scope = await self._compile_and_cache(principals, project_ids, cache, None if caller_stale else caller)
            self.metrics.scope_cache.labels("miss").inc()
        else:
            scope = await self._compile_and_cache(principals, project_ids, None, None)
        self._observe(scope, started)
        return scope

    async def _compile_and_cache(
        self, principals: Sequence[str], project_ids: Sequence[int] | None, cache: ScopeCache | None,
        caller: Caller | None,
    ) -> CompiledScope:  # fmt: skip
        """The scope compiled in SQL (the caller resolved there too unless given), stored in `cache` (as stale if
        an invalidation arrived meanwhile)."""
        # Read together before the SQL runs: a store that raced an invalidation is kept stale since `began`.
        generation, began = (cache.generation, cache.now()) if cache is not None else (0, 0.0)
        security, max_terms = self.settings.security, self.settings.opensearch.max_terms_count

        def run(conn: Connection) -> tuple[CompiledScope, Caller]:
            resolved = caller or resolve_caller(conn, principals, security)
            return compile_scope(conn, resolved, security, project_ids=project_ids, max_terms_count=max_terms), resolved

        scope, resolved = await self.sql.read(run)
        if cache is not None:
            cache.put_caller(ScopeCache.raw_key(principals), resolved, generation, raced_since=began)
            cache.put_scope(ScopeCache.scope_key(resolved, project_ids), scope, generation, raced_since=began)
        return scope

    def _refresh_later(
        self, principals: Sequence[str], project_ids: Sequence[int] | None, caller: Caller | None
    ) -> None:
        """Compile a stale scope again in the background, once per scope at a time."""
        key = (ScopeCache.raw_key(principals), None if project_ids is None else tuple(sorted(set(project_ids))))
        if key in self._refreshing or self.cache is None:
            return
        self._refreshing.add(key)

        async def refresh() -> None:
            try:
                await self._compile_and_cache(principals, project_ids, self.cache, caller)
            except Exception as exc:  # noqa: BLE001 - the stale entry expires; the next request compiles it
                log.warning("scope refresh failed: %s", exc)
            finally:
                self._refreshing.discard(key)

        self.background.start(refresh())

    def _observe(self, scope: CompiledScope, started: float) -> None:
        self.metrics.scope_seconds.observe(time.perf_counter() - started)
        self.metrics.scope_documents.observe(len(scope.document_ids))
        self.metrics.scope_projects.observe(len(scope.project_ids))


def scope_caches(
    settings: Settings, metrics: SearchMetrics, enabled: bool | None
) -> tuple[ScopeCache | None, NameCache | None, InvalidationFeed | None]:
    """The scope cache, the identity look-up cache and their invalidation feed (search.access.scope_cache,
    search.names.cache, search.access.invalidation): none unless `enabled` (None: `api.caches.scope_size > 0`)."""
    api = settings.api
    if not (api.caches.scope_size > 0 if enabled is None else enabled):
        return None, None, None
    scope_cache = ScopeCache(api.caches.scope_size, api.caches.scope_max_ids, api.caches.scope_max_principals)
    name_cache = None
    if api.caches.name_keys > 0:
        name_cache = NameCache(api.caches.name_keys, api.caches.name_max_documents, api.caches.name_ttl_s)
    subscribers: list[ChangeSubscriber] = [scope_cache]
    if name_cache is not None:
        subscribers.append(name_cache)
    feed = InvalidationFeed(settings, subscribers, on_event=lambda table: metrics.feed_events.labels(table).inc())
    return scope_cache, name_cache, feed
