"""A ranked search as a pipeline over one query context.

The ranking (legs, relevance floor, fusion, status boost, decay, SQL re-verify and collapse) makes the
context's `kept` list. What follows it are steps — graph augmentation, the authoritative document type,
rerank, the named document first — run in that order. Each step says when it applies, does its work
through the service's I/O (`StepServices`), and owns its failure policy: a step without a `fallback`
lets its error answer the request (rerank: never a silent fallback); a step with one answers without
its contribution and records the fallback. Every stage is timed by one `StageTimer` under its name; the
operators' `timings_ms` is its record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from sqlalchemy.exc import SQLAlchemyError

from ki.errors import KiError
from ki.settings import RetrievalSettings
from search.access.reverify import VerifiedVersion
from search.access.scope import CompiledScope
from search.names.keys import Identity, Subject
from search.plan import QueryPlan
from search.ranking.fusion import Candidate, put_at, put_first
from search.request import SearchRequest
from search.telemetry.metrics import SearchMetrics

log = logging.getLogger(__name__)

Verified = dict[int, VerifiedVersion]


class StageTimer:
    """Milliseconds per stage of one search, and the total since it started."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.ms: dict[str, float] = {}

    def mark(self, name: str, since: float) -> float:
        """Record `name` as the time from `since` to now; answers now, the next stage's start."""
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0.0) + (now - since) * 1000
        return now

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        since = time.perf_counter()
        try:
            yield
        finally:
            self.mark(name, since)

    def finish(self) -> dict[str, float]:
        self.ms["total"] = (time.perf_counter() - self.started) * 1000
        return self.ms


def matches(candidate: Candidate, verified: Verified) -> bool:
    """The row exists in SQL, the caller may see it, and the index agrees on its identity."""
    v = verified.get(candidate.version_id)
    return v is not None and v.document_id == candidate.document_id and v.project_id == candidate.project_id


@dataclass
class QueryContext:
    """What the steps read and change: the ranked, verified, collapsed list and what explains it."""

    principals: Sequence[str]
    request: SearchRequest
    plan: QueryPlan  # made once (search.plan): no step resolves mode, weights or expansion again
    scope: CompiledScope
    fused: list[Candidate]  # the whole fused list, before the re-verify
    kept: list[Candidate]  # verified and collapsed, in answer order
    verified: Verified
    identity: Identity
    identity_verified: Verified
    timer: StageTimer
    fallbacks: list[str] = field(default_factory=list)
    graph: dict[str, Any] | None = None  # graph augmentation's outcome, when it ran

    def admit(self, found: Verified) -> None:
        self.verified = {**self.verified, **found}


class StepServices(Protocol):
    """The service's I/O the steps use (OpenSearch, SQL, the rerank gateway)."""

    settings: Any
    metrics: SearchMetrics

    async def augment(
        self,
        principals: Sequence[str],
        request: SearchRequest,
        scope: CompiledScope,
        kept: list[Candidate],
        verified: Verified,
    ) -> tuple[list[Candidate], Verified, dict[str, Any]]: ...

    async def authoritative_hit(
        self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope
    ) -> tuple[Candidate, VerifiedVersion] | None: ...

    async def rerank(self, query: str, kept: list[Candidate], verified: Verified) -> list[Candidate]: ...

    async def identity_hit(
        self, request: SearchRequest, scope: CompiledScope, subject: Subject, fused: Sequence[Candidate]
    ) -> Candidate | None: ...


class Step:
    """One feature after ranking. `fallback`: the failures it answers without (None: its errors answer
    the request) and the name it records when it does."""

    name: ClassVar[str]
    fallback: ClassVar[str | None] = None
    recoverable: ClassVar[tuple[type[BaseException], ...]] = ()

    def applies(self, ctx: QueryContext, r: RetrievalSettings) -> bool:
        raise NotImplementedError

    async def run(self, ctx: QueryContext, services: StepServices) -> None:
        raise NotImplementedError

    def failed(self, ctx: QueryContext, services: StepServices, exc: BaseException) -> None:
        """Answer without this step (called only for `recoverable` failures)."""


async def run_steps(steps: Sequence[Step], ctx: QueryContext, services: StepServices) -> None:
    r: RetrievalSettings = services.settings.retrieval
    for step in steps:
        if not step.applies(ctx, r):
            continue
        with ctx.timer.stage(step.name):
            try:
                await step.run(ctx, services)
            except step.recoverable as exc:
                log.warning("%s failed, answering without it: %s: %s", step.name, type(exc).__name__, exc)
                step.failed(ctx, services, exc)
                if step.fallback is not None:
                    ctx.fallbacks.append(step.fallback)


class GraphAugmentation(Step):
    """The top seeds' cited documents join the pool (search.ranking.augment). Its own failure must not
    take the ranked answer with it: answered without it, flagged and counted."""

    name = "graph"
    fallback = "graph_failed"
    recoverable = (KiError, SQLAlchemyError)

    def applies(self, ctx: QueryContext, r: RetrievalSettings) -> bool:
        return r.graph_rag_enabled and bool(ctx.kept)

    async def run(self, ctx: QueryContext, services: StepServices) -> None:
        ctx.kept, ctx.verified, ctx.graph = await services.augment(
            ctx.principals, ctx.request, ctx.scope, ctx.kept, ctx.verified
        )
        services.metrics.graph_augmentation.labels(ctx.graph["status"]).inc()

    def failed(self, ctx: QueryContext, services: StepServices, exc: BaseException) -> None:
        ctx.graph = {"status": "failed", "error": type(exc).__name__}
        services.metrics.graph_augmentation.labels("failed").inc()


class AuthoritativeType(Step):
    """The authoritative document type's best match on the first page: at its end unless already on it."""

    name = "authoritative"

    def applies(self, ctx: QueryContext, r: RetrievalSettings) -> bool:
        return r.authoritative_doc_type is not None and ctx.request.offset == 0

    async def run(self, ctx: QueryContext, services: StepServices) -> None:
        found = await services.authoritative_hit(ctx.principals, ctx.request, ctx.scope)
        if found is None:
            return
        hit, version = found
        window = ctx.request.window
        if any(c.document_id == hit.document_id for c in ctx.kept[:window]):
            return
        r = services.settings.retrieval
        ctx.kept = put_at(hit, ctx.kept, window - 1, per_document=r.collapse_per_document,
                          max_chunks_per_document=r.max_chunks_per_document)  # fmt: skip
        ctx.admit({hit.version_id: version})


class Rerank(Step):
    """The top collapsed hits through the rerank gateway; its failure answers the request (never a silent
    fallback to the unreranked order)."""

    name = "rerank"

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def applies(self, ctx: QueryContext, r: RetrievalSettings) -> bool:
        return self.enabled and bool(ctx.kept)

    async def run(self, ctx: QueryContext, services: StepServices) -> None:
        ctx.kept = await services.rerank(ctx.request.query, ctx.kept, ctx.verified)


class NamedDocumentFirst(Step):
    """The document the query names first, whatever the ranking and the rerank said — if the request's
    filters admit it and the caller may see the version chosen for it."""

    name = "identity"
    fallback = FILTERED_OUT = "identity_filtered_out"  # also recorded when the filters or the ACL drop it

    def applies(self, ctx: QueryContext, r: RetrievalSettings) -> bool:
        return ctx.identity.unique is not None

    async def run(self, ctx: QueryContext, services: StepServices) -> None:
        subject = ctx.identity.unique
        assert subject is not None
        hit = await services.identity_hit(ctx.request, ctx.scope, subject, ctx.fused)
        if hit is None or not matches(hit, ctx.identity_verified):
            ctx.identity = replace(ctx.identity, extra={"hit": "filtered_out"})
            ctx.fallbacks.append(self.FILTERED_OUT)
            return
        ctx.admit(ctx.identity_verified)
        r = services.settings.retrieval
        ctx.kept = put_first(hit, ctx.kept, per_document=r.collapse_per_document,
                             max_chunks_per_document=r.max_chunks_per_document)  # fmt: skip


def post_ranking_steps(rerank: bool) -> list[Step]:
    """The order matters: augmentation and the authoritative type widen the list the rerank orders; the
    named document goes first after everything else."""
    return [GraphAugmentation(), AuthoritativeType(), Rerank(rerank), NamedDocumentFirst()]
