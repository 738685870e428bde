"""The query path: scope -> embed -> the legs in one `_msearch` (more rounds only when the scope's bounded
filter is a superset and a leg lost hits to it, search.ranking.scoped) -> fuse -> boost -> SQL re-verify ->
collapse -> optional rerank -> window.

Every step from the legs on is sized for the whole window (offset + limit): collapse and the
re-verify drop rows after ranking, so the offset cannot be pushed down into OpenSearch.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from opensearchpy import AsyncOpenSearch
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from ki.acl import Caller, Walk, resolve_caller
from ki.embedding import Embedder
from ki.settings import Settings
from projections.plan import VECTOR_PENDING
from search.access.invalidation import ChangeSubscriber, InvalidationFeed
from search.access.reverify import VerifiedVersion, reverify
from search.access.scope import MATCH_NONE, CompiledScope, ScopeFilter, compile_scope, strict_filter
from search.access.scope_cache import ScopeCache
from search.after_answer import start_after_answer
from search.documents import lookup as lookups
from search.documents import read as documents
from search.documents.decisions import DecisionPage, search_decisions
from search.documents.text import read_text
from search.names.cache import NameCache
from search.names.keys import (
    NONE,
    OFF,
    Identity,
    NamedDocument,
    NameKey,
    Subject,
    carried,
    choose_versions,
    keep_subjects,
    name_grams,
    resolve,
)
from search.names.sql import look_up_names, subject_versions
from search.pipeline import QueryContext, StageTimer, matches, post_ranking_steps, run_steps
from search.plan import QueryPlan, plan_query
from search.ranking import augment
from search.ranking.budget import fit_budget
from search.ranking.floor import apply_floor, floor_for
from search.ranking.fusion import Candidate, apply_boost, apply_decay, collapse, fuse
from search.ranking.hits import FusionParams, hit_json, mark_injections
from search.ranking.legs import (
    SOURCE_INCLUDES,
    LegHit,
    LegName,
    LegRun,
    build_leg_bodies,
    leg_depth,
)
from search.ranking.mode_gate import GateDecision, Mode, SelfEvidence, decide, load_reports, load_self_evidence
from search.ranking.query_vectors import EmbeddingCache
from search.ranking.rerank import RERANK_TOP_N, Reranker, RerankUnavailable, apply_rerank, passages
from search.ranking.scoped import FILL_GROWTH, ScopedIndex, admits, first_size, prefix_end, resized
from search.ranking.synonyms import DEFAULT_SYNONYMS
from search.rate_limit import RateLimiter
from search.request import (
    DecisionSearchRequest,
    FilterRequest,
    LookupRequest,
    ReadRequest,
    RelatedRequest,
    SearchRequest,
    TraverseRequest,
    metadata_clauses,
    point_in_time_clauses,
)
from search.telemetry.metrics import SearchMetrics
from search.telemetry.stats import StatsRecorder, query_stats

log = logging.getLogger(__name__)

# How long before a grid point a release stops sleeping and yields until the point (`_on_the_grid`): more than
# the poll's whole-millisecond rounding.
GRID_SPIN_S = 0.002

T = TypeVar("T")


@dataclass
class SearchResult:
    hits: list[dict[str, Any]]
    offset: int
    limit: int
    has_more: bool
    timings_ms: dict[str, float] = field(default_factory=dict)
    mode: dict[str, Any] | None = None  # ranked search: which legs ran and why
    ambiguous: list[dict[str, Any]] | None = None  # the documents the query names, when it names several
    identity: dict[str, Any] | None = None  # the identity preflight's outcome (with `explain`)
    reason: str | None = None  # why a ranked answer is empty (`search.ranking.scoped.ScopedIndex.empty_reason`)
    synonyms: list[str] | None = None  # phrases added to the query (with `explain`)
    semantic_floor: dict[str, Any] | None = None  # the relevance floor and what it dropped (with `explain`)
    evidence: dict[str, int] | None = None  # the evidence budget's use, when a budget applies
    graph: dict[str, Any] | None = None  # graph augmentation's outcome, when it is on
    plan: dict[str, Any] | None = None  # the request's plan (with `explain`)

    def to_json(self, timings: bool = False) -> dict[str, Any]:
        """The answer; `timings_ms` only for operators (`timings`): server-side times tell a caller about
        caches and rows that other callers' requests and hidden documents shaped."""
        out: dict[str, Any] = {"hits": self.hits, "offset": self.offset, "limit": self.limit, "has_more": self.has_more}
        if timings:
            out["timings_ms"] = self.timings_ms
        optional = {
            "mode": self.mode,
            "ambiguous": self.ambiguous,
            "identity": self.identity,
            "reason": self.reason,
            "synonyms_added": self.synonyms,
            "semantic_floor": self.semantic_floor,
            "evidence": self.evidence,
            "graph": self.graph,
            "plan": self.plan,
        }
        out.update({key: value for key, value in optional.items() if value is not None})
        return out


class SearchService:
    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        client: AsyncOpenSearch,
        embedder: Embedder,
        metrics: SearchMetrics | None = None,
        *,
        scope_cache: bool | None = None,
        verify_engine: AsyncEngine | None = None,
    ) -> None:
        self.reranker = Reranker(settings.retrieval) if settings.retrieval.rerank_enabled else None
        # The features after ranking, in order (search.pipeline).
        self.steps = post_ranking_steps(rerank=self.reranker is not None)
        self.settings, self.engine, self.client, self.embedder = settings, engine, client, embedder
        # The re-verify's connections (`ki.clients.make_async_engine(generic_plans=True)` in the API).
        self.verify_engine = verify_engine or engine
        self.cache = EmbeddingCache(settings.api.caches.embedding_size, settings.api.caches.embedding_ttl_s)
        self.limiter = RateLimiter(settings.api.limits.rate_per_s, settings.api.limits.rate_burst)
        self.metrics = metrics or SearchMetrics()
        self.index = settings.retrieval.index_name
        # Decided from the evaluation reports at start-up, then again whenever the deployment's own newest
        # self-eval report changes (`start()` re-reads it every retrieval.mode_gate.self_eval_refresh_s;
        # search.ranking.mode_gate).
        self.reports = load_reports(settings.retrieval.mode_gate.reports_dir)
        self.own_evidence: SelfEvidence | None = None
        self.gate = decide(self.reports, settings, embedder.signature)
        self._gate_task: asyncio.Task[None] | None = None
        # Refreshes of stale cache entries running in the background (kept referenced until done).
        self._background: set[asyncio.Task[None]] = set()
        self._refreshing: set[tuple[Any, ...]] = set()
        # Every OpenSearch read of a search, through the caller's scope (search.ranking.scoped).
        self.scoped = ScopedIndex(client, self.index, settings.api.limits.max_scope_filter_bytes, self.metrics)
        # The scope cache and its feed (search.access.scope_cache, search.access.invalidation); `start()`
        # starts the feed.
        use_cache = settings.api.caches.scope_size > 0 if scope_cache is None else scope_cache
        self.scope_cache: ScopeCache | None = None
        self.name_cache: NameCache | None = None
        self.feed: InvalidationFeed | None = None
        r = settings.retrieval
        self._authoritative_id: int | None = None  # ontology node of retrieval.authoritative_doc_type
        self.synonym_groups: list[list[str]] | None = None
        if r.synonyms_enabled:
            self.synonym_groups = r.synonyms if r.synonyms is not None else [list(g) for g in DEFAULT_SYNONYMS]
        # Retrieval statistics (search.telemetry.stats): buffered here, written by `start()`'s background task.
        self.stats: StatsRecorder | None = None
        if settings.api.stats.enabled:
            self.stats = StatsRecorder(engine, settings.api, on_dropped=lambda n: self.metrics.stats_dropped.inc(n))
        if use_cache:
            api = settings.api
            self.scope_cache = ScopeCache(
                api.caches.scope_size, api.caches.scope_max_ids, api.caches.scope_max_principals
            )
            if api.caches.name_keys > 0:
                self.name_cache = NameCache(api.caches.name_keys, api.caches.name_max_documents, api.caches.name_ttl_s)
            subscribers: list[ChangeSubscriber] = [self.scope_cache]
            if self.name_cache is not None:
                subscribers.append(self.name_cache)
            self.feed = InvalidationFeed(
                settings, subscribers, on_event=lambda table: self.metrics.feed_events.labels(table).inc()
            )

    def start(self) -> None:
        self._gate_task = asyncio.get_running_loop().create_task(self._refresh_gate_forever())
        if self.feed is not None:
            self.feed.start()
        if self.stats is not None:
            self.stats.start()

    async def refresh_gate(self) -> GateDecision:
        """Re-read the newest self-eval report and decide the default mode again (search.ranking.mode_gate)."""
        self.own_evidence = await load_self_evidence(self.engine)
        gate = decide(self.reports, self.settings, self.embedder.signature, self.own_evidence)
        if gate != self.gate:
            log.info("default search mode now: %s (%s)", gate.default_mode, gate.reason)
        self.gate = gate
        return gate

    async def _refresh_gate_forever(self) -> None:
        while True:
            try:
                await self.refresh_gate()
            except Exception as exc:  # noqa: BLE001 - keep the last decision; PostgreSQL may be back next time
                log.warning("evidence: could not read the self-eval report: %s", exc)
            await asyncio.sleep(self.settings.retrieval.mode_gate.self_eval_refresh_s)

    # --- steps ---------------------------------------------------------------------------------

    def usable_name_cache(self) -> NameCache | None:
        """The identity look-up cache, if its invalidation feed is current (else None: look up in SQL)."""
        if self.name_cache is None or self.feed is None or not self.feed.health().usable:
            return None
        return self.name_cache

    def usable_cache(self) -> ScopeCache | None:
        """The scope cache, if its invalidation feed is current (else None: compile in SQL)."""
        if self.scope_cache is None or self.feed is None:
            return None
        health = self.feed.health()
        self.metrics.feed_usable.set(1 if health.usable else 0)
        if health.lag_s is not None:
            self.metrics.feed_lag.set(health.lag_s)
        self.metrics.scope_cache_ids.set(self.scope_cache.ids_held)
        return self.scope_cache if health.usable else None

    async def compile_scope(self, principals: Sequence[str], project_ids: Sequence[int] | None) -> CompiledScope:
        """The caller's scope: from the cache when its feed is current and it holds it, else in SQL
        (and then cached, unless an invalidation arrived meanwhile). A cached scope that a change has made
        stale is answered once more while it is compiled again in the background (search.access.scope_cache):
        the request costs what a hit costs, whoever changed what."""
        started = time.perf_counter()
        cache = self.usable_cache()
        if cache is None and self.scope_cache is not None:
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
                        self._refresh_scope_later(principals, project_ids, None if caller_stale else caller)
                    self._observe_scope(cached, started)
                    return cached
            scope = await self._compile_and_cache(principals, project_ids, cache, None if caller_stale else caller)
            self.metrics.scope_cache.labels("miss").inc()
        else:
            scope = await self._compile_and_cache(principals, project_ids, None, None)
        self._observe_scope(scope, started)
        return scope

    async def _compile_and_cache(
        self, principals: Sequence[str], project_ids: Sequence[int] | None, cache: ScopeCache | None,
        caller: Caller | None,
    ) -> CompiledScope:  # fmt: skip
        """The scope compiled in SQL (the caller resolved there too unless given), stored in `cache` unless an
        invalidation arrived meanwhile."""
        generation = cache.generation if cache is not None else 0
        security, max_terms = self.settings.security, self.settings.opensearch.max_terms_count

        def run(conn: Connection) -> tuple[CompiledScope, Caller]:
            resolved = caller or resolve_caller(conn, principals, security)
            return compile_scope(conn, resolved, security, project_ids=project_ids, max_terms_count=max_terms), resolved

        async with self.engine.connect() as conn:
            scope, resolved = await conn.run_sync(run)
        if cache is not None:
            cache.put_caller(ScopeCache.raw_key(principals), resolved, generation)
            cache.put_scope(ScopeCache.scope_key(resolved, project_ids), scope, generation)
        return scope

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` apart from the request that started it, once its answer has left (search.after_answer;
        a context of its own: nothing the request carries, such as a trace, follows it), kept referenced
        until done."""
        loop = asyncio.get_running_loop()

        def start() -> None:
            task = loop.create_task(work, context=contextvars.Context())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        start_after_answer(start)  # not beside the request: its time would tell that something changed

    async def settled(self) -> None:
        """Until the background refreshes started so far are done (tests, benchmarks)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _refresh_scope_later(
        self, principals: Sequence[str], project_ids: Sequence[int] | None, caller: Caller | None
    ) -> None:
        """Compile a stale scope again in the background, once per scope at a time."""
        key = (ScopeCache.raw_key(principals), None if project_ids is None else tuple(sorted(set(project_ids))))
        if key in self._refreshing or self.scope_cache is None:
            return
        self._refreshing.add(key)

        async def refresh() -> None:
            try:
                await self._compile_and_cache(principals, project_ids, self.scope_cache, caller)
            except Exception as exc:  # noqa: BLE001 - the stale entry expires; the next request compiles it
                log.warning("scope refresh failed: %s", exc)
            finally:
                self._refreshing.discard(key)

        self._in_background(refresh())

    def _observe_scope(self, scope: CompiledScope, started: float) -> None:
        self.metrics.scope_seconds.observe(time.perf_counter() - started)
        self.metrics.scope_documents.observe(len(scope.document_ids))
        self.metrics.scope_projects.observe(len(scope.project_ids))

    def scope_filter(self, scope: CompiledScope) -> ScopeFilter:
        return self.scoped.scope_filter(scope)

    @property
    def filter_budget(self) -> int | None:
        """Bytes of scope clause per leg (None: always the exact filter, as the reference path in tests)."""
        return self.scoped.filter_budget

    @filter_budget.setter
    def filter_budget(self, budget: int | None) -> None:
        self.scoped.filter_budget = budget

    async def embed_query(self, query: str, principals: Sequence[str] = ()) -> list[float]:
        """The query's vector, cached for this caller (`principals`, the token's) only."""
        key = EmbeddingCache.key(self.embedder.signature, query, principals)
        cached = self.cache.get(key)
        self.metrics.embed_cache.labels("miss" if cached is None else "hit").inc()
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(None, self.embedder.embed_queries, [query])
        vector = [float(x) for x in vectors[0]]
        self.cache.put(key, vector)
        return vector

    async def _verified_read(self, work: Callable[[Connection], T]) -> T:
        """`work` (reads only) on a re-verify connection. The pool lends connections without a ping (a round
        trip on every search); one that PostgreSQL dropped meanwhile (a restart, an idle timeout) fails
        once, the pool replaces it, and the read runs again on a fresh connection."""
        try:
            async with self.verify_engine.connect() as conn:
                return await conn.run_sync(work)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            log.info("a re-verify connection was gone (%s); reading again on a fresh one", type(exc.orig).__name__)
        async with self.verify_engine.connect() as conn:
            return await conn.run_sync(work)

    async def _reverify(
        self,
        principals: Sequence[str],
        version_ids: Sequence[int],
        scope: CompiledScope,
        as_of: dt.date | None = None,
    ) -> dict[int, VerifiedVersion]:
        """`reverify` on the re-verify's connections: with `as_of` only the versions in force that day; the
        caller's groups walked as the scope found cheaper."""
        walk = scope.reverify_walk
        return await self._verified_read(lambda c: reverify(c, principals, self.settings, version_ids, as_of, walk))

    def request_filter(self, request: SearchRequest, scope: CompiledScope) -> dict[str, Any]:
        return self.scoped.request_filter(request, scope)

    async def rerank(self, query: str, kept: list[Candidate], verified: dict[int, VerifiedVersion]) -> list[Candidate]:
        """The top RERANK_TOP_N collapsed hits through the gateway (raises; never a silent fallback)."""
        assert self.reranker is not None
        top = kept[:RERANK_TOP_N]
        items = passages(top, [verified[c.version_id].title for c in top])
        started = time.perf_counter()
        try:
            scores = await self.reranker.scores(query, items)
        except RerankUnavailable:
            self.metrics.rerank_seconds.labels("error").observe(time.perf_counter() - started)
            raise
        self.metrics.rerank_seconds.labels("ok").observe(time.perf_counter() - started)
        return apply_rerank(kept, scores)

    async def close(self) -> None:
        if self._gate_task is not None:
            self._gate_task.cancel()
        if self.feed is not None:
            self.feed.stop()
        if self.stats is not None:
            await self.stats.close()
        if self.reranker is not None:
            await self.reranker.close()

    def plan(self, request: SearchRequest) -> QueryPlan:
        """The request's plan (search.plan), made from one reading of the mode gate: every later step reads it."""
        return plan_query(request, self.settings.retrieval, self.gate, self.synonym_groups)

    def plan_legs(
        self,
        request: SearchRequest,
        scope: CompiledScope | ScopeFilter,
        vector: list[float] | None,
        plan: QueryPlan | None = None,
    ) -> dict[LegName, dict[str, Any]]:
        """The `_msearch` bodies of one ranked search (also what `ki bench search` sends raw as its baseline).

        A leg weighted 0 cannot add to any score, so it is not run at all: its hits would only trail the
        ranking with score 0 (this is how `ki eval` measures one leg alone)."""
        plan = plan or self.plan(request)
        chosen = self.scope_filter(scope) if isinstance(scope, CompiledScope) else scope
        strict = strict_filter(chosen, metadata_clauses(request.filters) + point_in_time_clauses(request.as_of))
        bodies = build_leg_bodies(request.query, vector, strict, request.window, plan.legs,
                                  lexical_query=plan.expansion.text,
                                  ef_search=self.settings.retrieval.hnsw_ef_search)  # fmt: skip
        if chosen.exact:
            return bodies
        return {leg: resized(body, first_size(chosen, plan.depth)) for leg, body in bodies.items()}

    async def run_legs_in_scope(
        self, request: SearchRequest, scope: CompiledScope, vector: list[float] | None, plan: QueryPlan | None = None
    ) -> tuple[LegRun, int]:
        """Every leg's hits exactly as the exact scope filter gives them, through a filter of bounded size
        (search.ranking.scoped). Returns the legs and the number of `_msearch` round trips."""
        plan = plan or self.plan(request)
        chosen = self.scope_filter(scope)
        bodies = self.plan_legs(request, chosen, vector, plan)
        return await self.scoped.fill_legs(bodies, scope, chosen, plan.depth)

    async def verified_head(
        self,
        principals: Sequence[str],
        scope: CompiledScope,
        fused: Sequence[Candidate],
        need: int,
        as_of: dt.date | None = None,
    ) -> tuple[list[Candidate], dict[int, VerifiedVersion]]:
        """Re-verify in fused order only as far as the page needs: the collapsed survivors of a prefix
        (cut between different scores) begin exactly like those of the whole list once they number
        `need`, since everything after the prefix scores lower. Usually one statement over a few dozen
        versions instead of every candidate's."""
        r = self.settings.retrieval
        verified: dict[int, VerifiedVersion] = {}
        checked: set[int] = set()
        n, batch = 0, max(2 * need, 20)
        while True:
            end = prefix_end(fused, n + batch)
            ids = {c.version_id for c in fused[n:end]} - checked
            if ids:
                verified.update(await self._reverify(principals, sorted(ids), scope, as_of))
                checked |= ids
            n, batch = end, batch * FILL_GROWTH
            survivors = [c for c in fused[:n] if matches(c, verified)]
            kept = collapse(
                survivors,
                per_document=r.collapse_per_document,
                max_chunks_per_document=r.max_chunks_per_document,
                is_latest_final=lambda c: verified[c.version_id].latest_final_version_id == c.version_id,
            )
            if len(kept) >= need or n >= len(fused):
                return kept, verified

    async def identify(
        self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope
    ) -> tuple[Identity, dict[int, VerifiedVersion]]:
        """The identity preflight (search.names.keys): the documents the query names, among those the
        caller's scope holds, each with the version its hit would show, verified in SQL like every hit."""
        r = self.settings.retrieval
        if not r.name_lookup_enabled:
            return OFF, {}
        title_keys, identifier_keys = name_grams(
            request.query,
            max_title_tokens=r.name_lookup.max_title_tokens,
            min_title_tokens=r.name_lookup.min_title_tokens,
            max_identifier_tokens=r.name_lookup.max_identifier_tokens,
        )
        if not title_keys and not identifier_keys:
            return NONE, {}
        keys: list[NameKey] = [("title", k) for k in title_keys] + [("identifier", k) for k in identifier_keys]
        cache = self.usable_name_cache()
        generation = cache.generation if cache is not None else 0  # read before anything is looked up
        who = ScopeCache.raw_key(principals)  # a caller's entries are theirs alone (search.names.cache)
        cached, missing, stale = (
            cache.get(who, keys, self.settings.api.caches.scope_stale_s) if cache is not None else ({}, keys, [])
        )
        if self.name_cache is not None:
            self.metrics.identity_cache.labels("bypass" if cache is None else "miss" if missing else "hit").inc()
        if stale and cache is not None:
            self._look_up_names_later(principals, stale, cache, scope.reverify_walk)

        def decide(entries: Mapping[NameKey, Sequence[NamedDocument]]) -> Identity:
            named, saturated = carried(entries, r.name_lookup.max_documents_per_name)
            named = [n for n in named if scope.holds_document(n.document_id, n.project_id)]
            return resolve(named, r.name_lookup.max_candidates, saturated)

        known = None if missing else decide(cached)
        if known is not None and not known.subjects:
            return known, {}  # every key known and nothing named: no SQL at all

        def run(
            conn: Connection,
        ) -> tuple[Identity, dict[int, VerifiedVersion], dict[NameKey, tuple[NamedDocument, ...]]]:
            found = look_up_names(
                conn,
                principals,
                self.settings.security,
                [k for why, k in missing if why == "title"],
                [k for why, k in missing if why == "identifier"],
                r.name_lookup.max_documents_per_name,
                scope.reverify_walk,
            )
            identity = known if known is not None else decide({**cached, **found})
            if not identity.subjects:
                return identity, {}, found
            versions, _ = subject_versions(conn, [s.document_id for s in identity.subjects])
            verified = reverify(
                conn, principals, self.settings, [v.version_id for v in versions], walk=scope.reverify_walk
            )
            view_latest = {found.document_id: found.latest_final_version_id for found in verified.values()}
            chosen = choose_versions(versions, verified.keys(), view_latest, request.as_of)
            return keep_subjects(identity, chosen), {v: verified[v] for v in chosen.values()}, found

        identity, verified, found = await self._verified_read(run)
        if cache is not None and found:
            cache.put(who, found, generation)
        return identity, verified

    def _look_up_names_later(
        self, principals: Sequence[str], keys: Sequence[NameKey], cache: NameCache, walk: Walk
    ) -> None:
        """Look stale name entries up again in the background (the request was answered from them)."""
        r = self.settings.retrieval
        generation, who = cache.generation, ScopeCache.raw_key(principals)

        def run(conn: Connection) -> dict[NameKey, tuple[NamedDocument, ...]]:
            titles = [k for why, k in keys if why == "title"]
            identifiers = [k for why, k in keys if why == "identifier"]
            return look_up_names(conn, principals, self.settings.security, titles, identifiers,
                                 r.name_lookup.max_documents_per_name, walk)  # fmt: skip

        async def refresh() -> None:
            try:
                cache.put(who, await self._verified_read(run), generation)
            except Exception as exc:  # noqa: BLE001 - the stale entries expire; a later request looks them up
                log.warning("name refresh failed: %s", exc)

        self._in_background(refresh())

    async def augment(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        kept: list[Candidate],
        verified: dict[int, VerifiedVersion],
    ) -> tuple[list[Candidate], dict[int, VerifiedVersion], dict[str, Any]]:
        """Graph augmentation (search.ranking.augment): the top seeds' cited documents join the pool, scoped,
        re-verified, scored below their seed; nothing ranked is dropped."""
        r = self.settings.retrieval
        seeds = kept[: r.graph_rag.seeds]
        edges = await self._verified_read(lambda c: augment.cited_documents(c, seeds))
        present = {c.document_id for c in kept}
        cited = [c for c in augment.plan_additions(seeds, edges, present, r.graph_rag.max_added)
                 if scope.holds_document(c.document_id, c.project_id)]  # fmt: skip
        info: dict[str, Any] = {"status": "ok", "seeds": len(seeds), "cited": len(cited), "added": 0}
        if not cited:
            return kept, verified, info
        strict = self.request_filter(request, scope)
        if strict == MATCH_NONE:
            return kept, verified, info
        body = augment.best_chunk_body(request.query, strict, [c.document_id for c in cited], SOURCE_INCLUDES)
        added = augment.added_candidates(await self.scoped.search(body), cited, r.graph_rag.hop_penalty)
        found = await self._reverify(principals, [c.version_id for c in added], scope, request.as_of)
        added = [c for c in added if matches(c, found)]
        info["added"] = len(added)
        return augment.merge(kept, added), {**verified, **found}, info

    async def authoritative_hit(
        self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope
    ) -> tuple[Candidate, VerifiedVersion] | None:
        """The best lexical match of the authoritative document type (search.ranking.augment), scoped and verified."""
        key = self.settings.retrieval.authoritative_doc_type
        if key is None:
            return None
        if self._authoritative_id is None:  # node ids never change: looked up once it exists
            async with self.engine.connect() as conn:
                self._authoritative_id = await conn.run_sync(lambda c: augment.doc_type_id(c, key))
            if self._authoritative_id is None:
                return None
        strict = self.request_filter(request, scope)
        if strict == MATCH_NONE:
            return None
        body = augment.authoritative_body(request.query, strict, self._authoritative_id, SOURCE_INCLUDES)
        found = [
            Candidate(h["_id"], float(h.get("_score") or 0.0), h.get("_source") or {}, match_reason="authoritative")
            for h in await self.scoped.search(body)
            if admits(scope, h.get("_source") or {})
        ]
        verified = await self._reverify(principals, [c.version_id for c in found], scope, request.as_of)
        best = next((c for c in found if matches(c, verified)), None)
        return None if best is None else (best, verified[best.version_id])

    async def identity_hit(
        self, request: SearchRequest, scope: CompiledScope, subject: Subject, fused: Sequence[Candidate]
    ) -> Candidate | None:
        """The chunk that stands for the named document: its best-ranked chunk of the chosen version, or
        (not ranked at all) the version's chunk that best matches the query, through the same scope and
        metadata filters as the legs (None if they exclude it)."""
        version_id = subject.version_id
        ranked = next((c for c in fused if c.version_id == version_id), None)
        if ranked is not None:
            return replace(ranked, match_reason=subject.why)
        strict = self.request_filter(request, scope)
        if strict == MATCH_NONE:
            return None
        body = {
            "size": 3,
            "track_total_hits": False,
            "_source": {"includes": SOURCE_INCLUDES},
            "query": {
                "bool": {
                    "filter": [strict, {"term": {"document_version_id": str(version_id)}}],
                    "should": [{"match": {"text": {"query": request.query}}}],
                }
            },
        }
        found = await self.scoped.search(body)
        if not found:
            return None
        best = min(found, key=lambda h: (-float(h.get("_score") or 0.0), h["_id"]))
        return Candidate(best["_id"], 0.0, best.get("_source") or {}, match_reason=subject.why)

    # --- public --------------------------------------------------------------------------------

    async def search(self, principals: Sequence[str], request: SearchRequest) -> SearchResult:
        started = time.perf_counter()
        plan = self.plan(request)  # once: every step below reads it
        # The query vector does not depend on the scope: a cache miss is embedded while the scope SQL runs.
        vector = None
        if plan.needs_vector:
            vector = asyncio.ensure_future(self.embed_query(plan.expansion.text, principals))
        try:
            scope = await self.compile_scope(principals, request.filters.project_id)
        except BaseException:
            if vector is not None:
                vector.cancel()
            raise
        return await self.search_in_scope(principals, request, scope, started=started, vector=vector, plan=plan)

    async def search_in_scope(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        *,
        started: float | None = None,
        vector: Awaitable[list[float]] | None = None,
        plan: QueryPlan | None = None,
    ) -> SearchResult:
        """Steps 2-8 for an already compiled scope (the re-verify still checks grants in SQL afresh).

        `vector`: the query vector being computed (else embedded here); `plan`: the request's plan (else made
        here). Timings: `embed` is the wait for the vector after the scope."""
        timer = StageTimer(started)
        t = timer.mark("scope", timer.started)
        r = self.settings.retrieval
        plan = plan or self.plan(request)
        # The identity preflight runs beside the legs (it needs the scope, not their hits).
        preflight = asyncio.ensure_future(self.identify(principals, request, scope))
        try:
            if vector is None and plan.needs_vector:
                vector = self.embed_query(plan.expansion.text, principals)
            query_vector = await vector if vector is not None else None
            t = timer.mark("embed", t)
            run, rounds = await self.run_legs_in_scope(request, scope, query_vector, plan)
            t = timer.mark("msearch", t)
            identity, identity_verified = await preflight
        finally:
            preflight.cancel()  # a no-op once it is done
        timer.mark("identity_wait", t)
        if run.took_ms:
            self.metrics.msearch_seconds.observe(timer.ms["msearch"] / 1000)
            self.metrics.observe_legs({str(leg): ms for leg, ms in run.took_ms.items()})
        with timer.stage("fuse"):
            legs, fused, floor, below_floor = self.rank(request, run, plan)
        need = max(request.window, RERANK_TOP_N if self.reranker is not None else 0) + 1
        need += identity.unique is not None
        with timer.stage("reverify"):
            kept, verified = await self.verified_head(principals, scope, fused, need, request.as_of)
        ctx = QueryContext(principals, request, plan, scope, fused, kept, verified, identity, identity_verified, timer)
        if run.scope_filter != "exact":
            ctx.fallbacks.append(f"scope_filter_{run.scope_filter}")
        await run_steps(self.steps, ctx, self)
        kept, verified, identity, graph = ctx.kept, ctx.verified, ctx.identity, ctx.graph
        page = kept[request.offset : request.window]
        fusion = FusionParams(plan.weights, plan.fusion_rrf_k, plan.mode, plan.fusion_method)
        explain = fusion if request.explain else None
        hits = [hit_json(c, verified[c.version_id], explain) for c in page]
        if request.expand and hits:
            with timer.stage("expand"):
                await self.scoped.add_neighbours(hits, r.neighbours_max_chunks_per_document)
        has_more = len(kept) > request.window
        budget = request.evidence_budget_chars or r.evidence_budget_chars
        evidence = None
        if budget is not None and hits:
            hits, use = fit_budget(hits, budget, request.offset)
            has_more = has_more or use.hits_dropped > 0
            evidence = use.to_json()
        mark_injections(hits, self.settings.api.evidence.injection)  # last: its spans are into the text handed out
        reason = await self.scoped.empty_reason(request, scope) if not kept else None
        timings = timer.finish()
        mode_info = plan.mode_json()
        pending = sum(1 for c in page if c.source.get(VECTOR_PENDING))  # the caller's own hits only
        if pending:
            mode_info["vectors_pending"] = pending
        fallbacks = ctx.fallbacks
        if request.mode is None and plan.mode != "hybrid":
            fallbacks.append(f"default_mode_{plan.mode}")
        self._record(request, plan.mode, page, legs, identity, reason, fallbacks, timings["total"])
        ambiguous = [s.to_json() for s in identity.subjects] if identity.outcome == "ambiguous" else None
        return SearchResult(
            hits,
            request.offset,
            request.limit,
            has_more,
            timings,
            mode_info,
            ambiguous=ambiguous,
            identity=identity.to_json() if request.explain else None,
            synonyms=list(plan.expansion.added) if request.explain else None,
            semantic_floor={"similarity": floor, "dropped": below_floor} if request.explain else None,
            evidence=evidence,
            graph=graph,
            reason=reason,
            plan=plan.to_json() if request.explain else None,
        )

    def rank(
        self, request: SearchRequest, run: LegRun, plan: QueryPlan
    ) -> tuple[dict[str, list[LegHit]], list[Candidate], float | None, int]:
        """The legs' lists as one ranking: the relevance floor on the semantic leg, fusion, status boost,
        decay. Also answers the legs as fused, the floor and how many hits it dropped."""
        r = self.settings.retrieval
        legs = {str(leg): found for leg, found in run.hits.items()}
        floor = floor_for(r, self.embedder.signature)
        below_floor = 0
        if "semantic" in legs:
            legs["semantic"], below_floor = apply_floor(legs["semantic"], floor, r.vector_space_type)
        if below_floor:
            self.metrics.floor_dropped.inc(below_floor)
        fused = fuse(legs, plan.weights, plan.fusion_method, plan.fusion_rrf_k, request.query)
        fused = apply_boost(fused, r.version_status_boost)
        if r.decay_enabled:
            fused = apply_decay(fused, request.as_of or dt.datetime.now(dt.UTC).date(), r.decay_min_weight)
        return legs, fused, floor, below_floor

    def _record(
        self,
        request: SearchRequest,
        mode: Mode,
        page: Sequence[Candidate],
        legs: Mapping[str, Sequence[LegHit]],
        identity: Identity,
        reason: str | None,
        fallbacks: Sequence[str],
        took_ms: float,
    ) -> None:
        """The query's retrieval statistics: metrics now, the statistics table in the background."""
        stats = query_stats(
            mode=mode,
            page=page,
            legs=legs,
            identity=identity.outcome,
            reason=reason,
            fallbacks=fallbacks,
            took_ms=took_ms,
            query=request.query if self.settings.api.stats.store_query_text else None,
        )
        self.metrics.observe_query(stats)
        if self.stats is not None:
            self.stats.record(stats)

    async def search_filter(self, principals: Sequence[str], request: FilterRequest) -> SearchResult:
        """Metadata-only: filter-only query, doc_date descending, one hit per version, score 0."""
        t0 = time.perf_counter()
        scope = await self.compile_scope(principals, request.filters.project_id)
        candidates = await self.scoped.newest_versions(scope, request.filters, leg_depth(request.window))
        verified = await self._reverify(principals, [c.version_id for c in candidates], scope) if candidates else {}
        seen: set[int] = set()
        survivors = []
        for c in candidates:
            if matches(c, verified) and c.version_id not in seen:
                seen.add(c.version_id)
                survivors.append(c)
        page = survivors[request.offset : request.window]
        explain = FusionParams({}, self.settings.retrieval.fusion_rrf_k) if request.explain else None
        hits = [hit_json(c, verified[c.version_id], explain) for c in page]
        mark_injections(hits, self.settings.api.evidence.injection)
        timings = {"total": (time.perf_counter() - t0) * 1000}
        return SearchResult(hits, request.offset, request.limit, len(survivors) > request.window, timings)

    async def _on_the_grid(self, work: Awaitable[T]) -> T:
        """`work`'s answer (or its error), released at the next multiple of `api.limits.release_quantum_ms` from
        now: what PostgreSQL does below the same statements and rows (probes finding a hidden row, then
        refusing it) cannot show in when the answer leaves (a quantum the work exceeds rounds up to the next)."""
        quantum = self.settings.api.limits.release_quantum_ms / 1000
        started = time.perf_counter()

        async def released() -> None:
            if quantum <= 0:
                return
            elapsed = time.perf_counter() - started
            release = started + quantum * max(1, math.ceil(elapsed / quantum))
            # The event loop's poll sleeps whole milliseconds counted from when it went to sleep, so a timer
            # alone would release at the grid point plus the work's own sub-millisecond remainder: sleep to
            # just before the point, then yield until it.
            coarse = release - time.perf_counter() - GRID_SPIN_S
            if coarse > 0:
                await asyncio.sleep(coarse)
            while time.perf_counter() < release:
                await asyncio.sleep(0)

        try:
            answer = await work
        except Exception:
            await released()
            raise
        await released()
        return answer

    async def get_document(self, principals: Sequence[str], document_id: int) -> dict[str, Any] | None:
        """The document with the versions the caller may see (None: not visible or not there)."""
        security = self.settings.security
        read = self._verified_read(lambda c: documents.get_document(c, principals, security, document_id))
        return await self._on_the_grid(read)

    async def read_text(
        self, principals: Sequence[str], document_id: int, version_id: int | None, request: ReadRequest
    ) -> dict[str, Any] | None:
        """A slice of a version's text the caller may see (None: not visible or not there; search.documents.text)."""
        security, api = self.settings.security, self.settings.api
        length, injection = request.characters(api), api.evidence.injection

        def run(conn: Connection) -> dict[str, Any] | None:
            return read_text(conn, principals, security, document_id, version_id, request.offset, length, injection)

        return await self._on_the_grid(self._verified_read(run))

    async def related(
        self, principals: Sequence[str], document_id: int, request: RelatedRequest
    ) -> dict[str, Any] | None:
        """A visible document's relations whose other end the caller may see (None: not visible)."""
        security = self.settings.security

        def run(conn: Connection) -> dict[str, Any] | None:
            return documents.related(
                conn, principals, security, document_id,
                kinds=request.kinds, direction=request.direction, limit=request.limit,
            )  # fmt: skip

        return await self._on_the_grid(self._verified_read(run))

    async def traverse(self, principals: Sequence[str], request: TraverseRequest) -> dict[str, Any]:
        """Documents reachable from the start documents, each one checked against the caller's access."""
        security, api = self.settings.security, self.settings.api

        def run(conn: Connection) -> dict[str, Any]:
            return documents.run_traversal(
                conn, principals, security, request.start, kinds=request.kinds, direction=request.direction,
                depth=request.depth, fanout=request.max_fanout or api.limits.max_traverse_fanout,
            )  # fmt: skip

        return await self._on_the_grid(self._verified_read(run))

    async def search_decisions(self, principals: Sequence[str], request: DecisionSearchRequest) -> DecisionPage:
        """Decision records by token overlap, checked against the caller's principals (SQL only)."""
        security = self.settings.security

        async def run() -> DecisionPage:
            async with self.engine.connect() as conn:
                return await conn.run_sync(lambda c: search_decisions(c, principals, security, request))

        return await self._on_the_grid(run())

    async def lookup(self, principals: Sequence[str], request: LookupRequest) -> dict[str, Any]:
        """Exactly one document and version by an identifier or an exact title, `ambiguous` or `not_found`,
        never a ranking (search.documents.lookup); the chunk holding an asked provision's heading from the index."""
        security = self.settings.security

        async def run() -> dict[str, Any]:
            found = await self._verified_read(lambda c: lookups.look_up(c, principals, security, request))
            query = found.chunk_query()
            if query is not None:
                found = found.with_chunk_of(await self.scoped.search(query))
            return found.to_json()

        return await self._on_the_grid(run())
