"""The documents the query names (search.names.keys): the identity preflight, run beside the legs and waited for
after them (`identity_wait`), and, after everything else, the named document first (`identity`)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from sqlalchemy import Connection

from ki.acl import Walk
from ki.settings import RetrievalSettings, Settings
from search.access.invalidation import InvalidationFeed
from search.access.reverify import VerifiedVersion, reverify
from search.access.scope import MATCH_NONE, CompiledScope
from search.access.scope_cache import ScopeCache
from search.consistency import reading_fresh
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
from search.pipeline import QueryContext, Stage, matches
from search.ports import Background, SqlReader
from search.ranking.fusion import Candidate, put_first
from search.ranking.legs import SOURCE_INCLUDES
from search.ranking.scoped import ScopedIndex
from search.request import SearchRequest
from search.telemetry.metrics import SearchMetrics

log = logging.getLogger(__name__)


class Identities:
    """The identity preflight and the named document's hit, through the SQL reader and the scoped index."""

    def __init__(
        self,
        settings: Settings,
        sql: SqlReader,
        scoped: ScopedIndex,
        metrics: SearchMetrics,
        background: Background,
        cache: NameCache | None,
        feed: InvalidationFeed | None,
    ) -> None:
        self.settings, self.sql, self.scoped, self.metrics, self.background = settings, sql, scoped, metrics, background
        self.cache, self.feed = cache, feed

    def usable_cache(self) -> NameCache | None:
        """The identity look-up cache, if its invalidation feed is current (else None: look up in SQL)."""
        if self.cache is None or self.feed is None or not self.feed.health().usable or reading_fresh():
            return None
        return self.cache

    async def identify(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        compare_with: dt.date | str | None = None,
    ) -> tuple[Identity, dict[int, VerifiedVersion]]:
        """The identity preflight (search.names.keys): the documents the query names, among those the
        caller's scope holds, each with the version its hit would show, verified in SQL like every hit (with a
        comparison's earlier side, `compare_with`, as the ranking's re-verify has it: the named hit is labelled too)."""
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
        cache = self.usable_cache()
        generation = cache.generation if cache is not None else 0  # read before anything is looked up
        who = ScopeCache.raw_key(principals)  # a caller's entries are theirs alone (search.names.cache)
        cached, missing, stale = (
            cache.get(who, keys, self.settings.api.caches.scope_stale_s) if cache is not None else ({}, keys, [])
        )
        if self.cache is not None:
            self.metrics.identity_cache.labels("bypass" if cache is None else "miss" if missing else "hit").inc()
        if stale and cache is not None:
            self._look_up_later(principals, stale, cache, scope.reverify_walk)

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
                conn, principals, self.settings, [v.version_id for v in versions], walk=scope.reverify_walk,
                compare_with=compare_with,
            )  # fmt: skip
            view_latest = {found.document_id: found.latest_final_version_id for found in verified.values()}
            chosen = choose_versions(versions, verified.keys(), view_latest, request.as_of)
            return keep_subjects(identity, chosen), {v: verified[v] for v in chosen.values()}, found

        identity, verified, found = await self.sql.verified_read(run)
        if cache is not None and found:
            cache.put(who, found, generation)
        return identity, verified

    def _look_up_later(self, principals: Sequence[str], keys: Sequence[NameKey], cache: NameCache, walk: Walk) -> None:
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
                cache.put(who, await self.sql.verified_read(run), generation)
            except Exception as exc:  # noqa: BLE001 - the stale entries expire; a later request looks them up
                log.warning("name refresh failed: %s", exc)

        self.background.start(refresh())

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
        strict = self.scoped.request_filter(request, scope)
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


class IdentityWait(Stage):
    """The preflight started beside the legs, waited for after them."""

    name = "identity_wait"

    async def run(self, ctx: QueryContext) -> None:
        assert ctx.preflight is not None
        ctx.identity, ctx.identity_verified = await ctx.preflight


class IdentityHit(Protocol):
    """The named document's hit (`Identities.identity_hit`)."""

    def __call__(
        self, request: SearchRequest, scope: CompiledScope, subject: Subject, fused: Sequence[Candidate]
    ) -> Awaitable[Candidate | None]: ...


class NamedDocumentFirst(Stage):
    """The document the query names first, whatever the ranking and the rerank said — if the request's
    filters admit it and the caller may see the version chosen for it."""

    name = "identity"
    fallback = FILTERED_OUT = "identity_filtered_out"  # also recorded when the filters or the ACL drop it

    def __init__(self, retrieval: RetrievalSettings, identity_hit: IdentityHit) -> None:
        self.retrieval, self.identity_hit = retrieval, identity_hit

    def applies(self, ctx: QueryContext) -> bool:
        return ctx.identity.unique is not None

    async def run(self, ctx: QueryContext) -> None:
        subject = ctx.identity.unique
        assert subject is not None
        hit = await self.identity_hit(ctx.request, ctx.scope, subject, ctx.fused)
        if hit is None or not matches(hit, ctx.identity_verified):
            ctx.identity = replace(ctx.identity, extra={"hit": "filtered_out"})
            ctx.fallbacks.append(self.FILTERED_OUT)
            return
        ctx.admit(ctx.identity_verified)
        r = self.retrieval
        ctx.kept = put_first(hit, ctx.kept, per_document=r.collapse_per_document,
                             max_chunks_per_document=r.max_chunks_per_document)  # fmt: skip
