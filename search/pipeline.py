"""A ranked search as stages over one query context (the stages: search.stages).

Every stage implements `Stage`: it says when it applies, does its work through the narrow ports it was
built with (the scoped index reader, the SQL reader, the embedder, the reranker; search.ports) — never
through the service — and owns its failure policy: a stage without a `fallback` lets its error answer the
request (rerank: never a silent fallback); a stage with one answers without its contribution and records the
fallback. The ranking's stages (embed, legs, fuse, re-verify and collapse) make the context's `kept` list;
the stages after it (graph augmentation, the authoritative document type, rerank, the named document first)
change it; the answer's stages (expansion, the evidence budget, the injection marks) shape its hits. Every
timed stage is timed by one `StageTimer` under its name; the operators' `timings_ms` is its record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from search.access.reverify import VerifiedVersion
from search.access.scope import CompiledScope
from search.names.keys import NONE, Identity
from search.plan import QueryPlan
from search.ranking.fusion import Candidate
from search.ranking.legs import LegHit, LegRun
from search.request import SearchRequest

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
    answer_gate: dict[str, Any] | None = None  # the coverage gate's reading of the answer (with `explain`)

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
            "answer_gate": self.answer_gate,
            "evidence": self.evidence,
            "graph": self.graph,
            "plan": self.plan,
        }
        out.update({key: value for key, value in optional.items() if value is not None})
        return out


@dataclass
class QueryContext:
    """What the stages read and change: the ranking's inputs, the ranked, verified, collapsed list and what
    explains it, and the answer's hits."""

    principals: Sequence[str]
    request: SearchRequest
    plan: QueryPlan  # made once (search.plan): no stage resolves mode, weights or expansion again
    scope: CompiledScope
    timer: StageTimer
    vector: Awaitable[list[float]] | None = None  # the query vector being computed (else the embed stage embeds)
    preflight: asyncio.Future[tuple[Identity, Verified]] | None = None  # the identity preflight, beside the legs
    query_vector: list[float] | None = None
    run: LegRun | None = None  # the legs' hits as OpenSearch gave them
    legs: dict[str, list[LegHit]] = field(default_factory=dict)  # the legs as fused (after the relevance floor)
    floor: float | None = None  # the relevance floor on the semantic leg, and how many hits it dropped
    below_floor: int = 0
    answer_gate: dict[str, Any] | None = None  # the coverage gate's reading of the answer (with `explain`)
    fused: list[Candidate] = field(default_factory=list)  # the whole fused list, before the re-verify
    kept: list[Candidate] = field(default_factory=list)  # verified and collapsed, in answer order
    verified: Verified = field(default_factory=dict)
    identity: Identity = NONE
    identity_verified: Verified = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    graph: dict[str, Any] | None = None  # graph augmentation's outcome, when it ran
    hits: list[dict[str, Any]] = field(default_factory=list)  # the page's hits as answered
    has_more: bool = False
    evidence: dict[str, int] | None = None  # the evidence budget's use, when a budget applies

    def admit(self, found: Verified) -> None:
        self.verified = {**self.verified, **found}


class Stage(Protocol):
    """One stage of a ranked search. `fallback`: the failures it answers without (None: its errors answer
    the request) and the name it records when it does; `timed`: recorded in the timings under `name`."""

    name: ClassVar[str]
    fallback: ClassVar[str | None] = None
    recoverable: ClassVar[tuple[type[BaseException], ...]] = ()
    timed: ClassVar[bool] = True

    def applies(self, ctx: QueryContext) -> bool:
        return True

    async def run(self, ctx: QueryContext) -> None: ...

    def failed(self, ctx: QueryContext, exc: BaseException) -> None:
        """Answer without this stage (called only for `recoverable` failures)."""
        return None


async def run_stages(stages: Sequence[Stage], ctx: QueryContext) -> None:
    for stage in stages:
        if not stage.applies(ctx):
            continue
        with ctx.timer.stage(stage.name) if stage.timed else nullcontext():
            try:
                await stage.run(ctx)
            except stage.recoverable as exc:
                log.warning("%s failed, answering without it: %s: %s", stage.name, type(exc).__name__, exc)
                stage.failed(ctx, exc)
                if stage.fallback is not None:
                    ctx.fallbacks.append(stage.fallback)
