"""Prometheus metrics of the search API, in a registry of their own (one per app, so tests and several
apps in one process never collide), exposed at `GET /metrics`.

Under `ki serve --workers N` (`PROMETHEUS_MULTIPROC_DIR` set) prometheus_client keeps every value in
per-process files and `exposition` collects all workers' files: counters and histograms are summed,
gauges combined by their `multiprocess_mode` (live workers only). So every gauge is *set* as its value
changes -- a callback read at scrape time would only ever report the worker that was asked."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from search.telemetry.stats import QueryStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: OpenSearch's health colours as a gauge (alerts compare numbers).
HEALTH_LEVELS = {"green": 0, "yellow": 1, "red": 2}

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Scope sizes span one document to tens of millions; OpenSearch's default terms limit is 65,536.
_SIZE_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 65_536, 100_000, 1_000_000, 10_000_000)


class SearchMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ki_api_requests", "HTTP requests by route, method and status", ["route", "method", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "ki_api_request_duration_seconds",
            "HTTP request latency by route, method and status",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.leg_seconds = Histogram(
            "ki_search_leg_duration_seconds",
            "OpenSearch time per ranked leg (the leg's `took` inside the _msearch)",
            ["leg"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.msearch_seconds = Histogram(
            "ki_search_msearch_duration_seconds",
            "Round trip of the one _msearch (all legs)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.scope_seconds = Histogram(
            "ki_search_scope_compile_duration_seconds",
            "SQL access-scope compilation time",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.scope_documents = Histogram(
            "ki_search_scope_documents", "Documents in a compiled scope", buckets=_SIZE_BUCKETS, registry=r
        )
        self.scope_projects = Histogram(
            "ki_search_scope_projects", "Projects in a compiled scope", buckets=_SIZE_BUCKETS, registry=r
        )
        self.embed_cache = Counter(
            "ki_search_embed_cache", "Query-embedding cache lookups by result (hit, miss)", ["result"], registry=r
        )
        self.scope_cache = Counter(
            "ki_search_scope_cache",
            "Scope lookups by result: hit, stale (invalidated: answered once more while compiled again in the "
            "background), miss (compiled in SQL and cached), bypass (the invalidation feed is not current: compiled "
            "in SQL, not cached)",
            ["result"],
            registry=r,
        )
        self.identity_cache = Counter(
            "ki_search_identity_cache",
            "Identity preflight look-ups by result: hit (every key cached, no SQL), miss (some keys looked up "
            "in SQL and cached), bypass (the invalidation feed is not current: looked up, not cached)",
            ["result"],
            registry=r,
        )
        self.scope_cache_ids = Gauge(
            "ki_search_scope_cache_ids",
            "Ids held by the scope caches (with the principals of their keys)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.feed_usable = Gauge(
            "ki_search_scope_feed_usable",
            "1 while the scope cache's invalidation feed is current (every worker's)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.feed_lag = Gauge(
            "ki_search_scope_feed_lag_seconds",
            "Upper bound of how far the invalidation feed is behind PostgreSQL commits (the worst worker's)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.feed_events = Counter(
            "ki_search_scope_feed_events",
            "Change events the invalidation feed applied, by table",
            ["table"],
            registry=r,
        )
        self.scope_filter = Counter(
            "ki_search_scope_filter",
            "Scope clauses sent by kind: exact (document ids), projects or open (superset: hits checked against "
            "the scope), none (empty scope)",
            ["kind"],
            registry=r,
        )
        self.scope_fill_rounds = Histogram(
            "ki_search_scope_fill_rounds",
            "_msearch round trips of a search sent with a superset scope filter",
            buckets=(1, 2, 3, 4, 5, 8),
            registry=r,
        )
        self.scope_fill_exhausted = Counter(
            "ki_search_scope_fill_exhausted",
            "Searches whose superset filter reached the fetch cap before a leg had its depth of in-scope hits",
            registry=r,
        )
        self.rerank_seconds = Histogram(
            "ki_search_rerank_duration_seconds",
            "Reranker gateway round trip by outcome (ok, error)",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "ki_api_rejected", "Requests refused before any work because the API was at capacity", registry=r
        )
        self.in_flight = Gauge(
            "ki_api_requests_in_flight", "API requests being served now", registry=r, multiprocess_mode="livesum"
        )
        self.waiting = Gauge(
            "ki_api_requests_waiting", "API requests waiting for a slot now", registry=r, multiprocess_mode="livesum"
        )
        self.queries = Counter(
            "ki_search_queries",
            "Ranked queries by the legs that ran and the identity preflight's outcome",
            ["mode", "identity"],
            registry=r,
        )
        self.zero_results = Counter(
            "ki_search_zero_results", "Ranked queries without any hit, by reason", ["reason"], registry=r
        )
        self.hit_sources = Counter(
            "ki_search_hit_sources",
            "Hits returned, by the legs that found them: lexical_only (lexical or identifier), semantic_only, both",
            ["source"],
            registry=r,
        )
        self.stats_dropped = Counter(
            "ki_search_stats_dropped", "Statistics rows not written (buffer full or database error)", registry=r
        )
        self.audit_dropped = Counter(
            "ki_audit_rows_dropped", "Access-audit rows not written (buffer full or database error)", registry=r
        )
        self.floor_dropped = Counter(
            "ki_search_semantic_floor_dropped",
            "Semantic-leg hits below the relevance floor (retrieval.semantic_floor), left out before fusion",
            registry=r,
        )
        self.graph_augmentation = Counter(
            "ki_search_graph_augmentation",
            "Graph augmentation runs by outcome (failed: the answer came without it, flagged)",
            ["result"],
            registry=r,
        )
        # The index as OpenSearch reports it, read at each scrape (search.operations.Operations.refresh_index_gauges).
        self.index_size = Gauge(
            "ki_index_size_bytes", "Store size of the index the alias points at (primaries)", registry=r,
            multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.index_rows = Gauge(
            "ki_index_rows", "Rows (chunks) in the index the alias points at (primaries)", registry=r,
            multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.alias_target = Gauge(
            "ki_index_alias_target", "1 for the index the search alias points at, 0 for one it pointed at before",
            ["alias", "index"], registry=r, multiprocess_mode="mostrecent",
        )  # fmt: skip
        # The cluster's health as OpenSearch reports it, read at each scrape: a replica missing (yellow) or a
        # primary (red) -- the latter loses search results.
        self.cluster_status = Gauge(
            "ki_opensearch_cluster_status", "OpenSearch cluster health: 0 green, 1 yellow, 2 red", registry=r,
            multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.unassigned_shards = Gauge(
            "ki_opensearch_unassigned_shards", "Shards (primaries and replicas) no node holds", registry=r,
            multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.cluster_nodes = Gauge(
            "ki_opensearch_nodes", "Nodes in the OpenSearch cluster", registry=r, multiprocess_mode="mostrecent"
        )
        self._alias_seen: dict[str, set[str]] = {}
        for result in ("ok", "failed"):
            self.graph_augmentation.labels(result)
        for source in ("lexical_only", "semantic_only", "both"):
            self.hit_sources.labels(source)
        for result in ("hit", "miss"):
            self.embed_cache.labels(result)  # both series exist from the start
        for result in ("hit", "miss", "bypass"):
            self.scope_cache.labels(result)
            self.identity_cache.labels(result)
        self.scope_cache.labels("stale")
        for kind in ("exact", "projects", "open", "none"):
            self.scope_filter.labels(kind)

    def index_state(self, alias: str, targets: list[str], size_bytes: int, rows: int) -> None:
        for index in self._alias_seen.get(alias, set()) - set(targets):  # an index the alias left: 0
            self.alias_target.labels(alias, index).set(0)
        for index in targets:
            self.alias_target.labels(alias, index).set(1)
        self._alias_seen.setdefault(alias, set()).update(targets)
        self.index_size.set(size_bytes)
        self.index_rows.set(rows)

    def cluster_health(self, health: Mapping[str, Any]) -> None:
        self.cluster_status.set(HEALTH_LEVELS.get(str(health.get("status")), 2))
        self.unassigned_shards.set(int(health.get("unassigned_shards", 0)))
        self.cluster_nodes.set(int(health.get("number_of_nodes", 0)))

    def observe_legs(self, took_ms: Mapping[str, float]) -> None:
        for leg, ms in took_ms.items():
            self.leg_seconds.labels(leg).observe(ms / 1000)

    def admission(self, in_flight: int, waiting: int) -> None:
        self.in_flight.set(in_flight)
        self.waiting.set(waiting)

    def exposition(self) -> bytes:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, path=directory)
        return generate_latest(every_worker)

    def observe_query(self, stats: QueryStats) -> None:
        self.queries.labels(stats.mode, stats.identity).inc()
        if stats.zero_result:
            self.zero_results.labels(stats.reason or "unknown").inc()
        for source, n in (("lexical_only", stats.lexical_only), ("semantic_only", stats.semantic_only),
                          ("both", stats.both)):  # fmt: skip
            if n:
                self.hit_sources.labels(source).inc(n)
