"""The steps after ranking (search.pipeline): order, failure policies, fallback records, one timer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from ki.errors import TransientError
from ki.settings import Settings, load_settings
from search.access.reverify import VerifiedVersion
from search.access.scope import CompiledScope
from search.names.keys import NONE, Identity, Subject
from search.pipeline import QueryContext, StageTimer, matches, run_stages
from search.plan import plan_query
from search.ranking.fusion import Candidate
from search.ranking.mode_gate import GateDecision
from search.ranking.rerank import RerankUnavailable
from search.request import SearchRequest
from search.stages.ranked import post_ranking_stages
from search.telemetry.metrics import SearchMetrics

METRICS = SearchMetrics()


def chunk(version: int, document: int, score: float = 1.0) -> Candidate:
    source = {"document_id": str(document), "document_version_id": str(version), "project_id": "1"}
    return Candidate(f"{version}:0", score, source)


def version(v: int, d: int) -> VerifiedVersion:
    return VerifiedVersion(v, d, 1, f"Dokument {d}", 1, v, ())


class Services:
    """The service's I/O as the steps see it, answering from fixed tables."""

    def __init__(self, **retrieval: Any) -> None:
        self.settings = Settings().model_copy(update={"retrieval": Settings().retrieval.model_copy(update=retrieval)})
        self.metrics = METRICS
        self.calls: list[str] = []
        self.augment_error: Exception | None = None
        self.rerank_error: Exception | None = None
        self.named_hit: Candidate | None = None
        self.authoritative: tuple[Candidate, VerifiedVersion] | None = None

    async def augment(self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope,
                      kept: list[Candidate], verified: dict[int, VerifiedVersion]) -> Any:  # fmt: skip
        self.calls.append("graph")
        if self.augment_error is not None:
            raise self.augment_error
        added = chunk(90, 9, 0.1)
        return [*kept, added], {**verified, 90: version(90, 9)}, {"status": "ok", "added": 1}

    async def authoritative_hit(self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope) -> Any:
        self.calls.append("authoritative")
        return self.authoritative

    async def rerank(self, query: str, kept: list[Candidate], verified: dict[int, VerifiedVersion]) -> list[Candidate]:
        self.calls.append("rerank")
        if self.rerank_error is not None:
            raise self.rerank_error
        return list(reversed(kept))

    async def identity_hit(self, request: SearchRequest, scope: CompiledScope, subject: Subject,
                           fused: Sequence[Candidate]) -> Candidate | None:  # fmt: skip
        self.calls.append("identity")
        return self.named_hit


def context(identity: Identity = NONE, identity_verified: dict[int, VerifiedVersion] | None = None) -> QueryContext:
    kept = [chunk(1, 1, 3.0), chunk(2, 2, 2.0), chunk(3, 3, 1.0)]
    request = SearchRequest(query="Kündigungsfrist", limit=3)
    return QueryContext(
        principals=["user:anna"],
        request=request,
        plan=plan_query(request, load_settings(environ={}).retrieval, GateDecision("lexical", "test"), None),
        scope=CompiledScope.of([1], [1, 2, 3, 9]),
        fused=list(kept),
        kept=list(kept),
        verified={c.version_id: version(c.version_id, c.document_id) for c in kept},
        identity=identity,
        identity_verified=identity_verified or {},
        timer=StageTimer(),
    )


def named(document: int, version_id: int) -> Identity:
    return Identity("unique", (Subject(document, f"Dokument {document}", "title", "dokument", version_id),))


def run(ctx: QueryContext, services: Services, rerank: bool = False) -> None:
    stages = post_ranking_stages(
        services.settings.retrieval, services.metrics, augment=services.augment,
        authoritative=services.authoritative_hit, rerank=services.rerank if rerank else None,
        identity_hit=services.identity_hit,
    )  # fmt: skip
    asyncio.run(run_stages(stages, ctx))


def test_steps_that_do_not_apply_neither_run_nor_show_in_the_timings() -> None:
    services, ctx = Services(), context()
    run(ctx, services)
    assert services.calls == [] and ctx.fallbacks == [] and set(ctx.timer.ms) == set()


def test_steps_run_in_order_each_timed_under_its_name() -> None:
    services = Services(graph_rag_enabled=True, authoritative_doc_type="statute")
    services.named_hit = chunk(3, 3)
    ctx = context(named(3, 3), {3: version(3, 3)})
    run(ctx, services, rerank=True)
    assert services.calls == ["graph", "authoritative", "rerank", "identity"]
    assert set(ctx.timer.ms) == {"graph", "authoritative", "rerank", "identity"}
    assert ctx.kept[0].version_id == 3  # named first, after the rerank reversed the list
    assert ctx.graph == {"status": "ok", "added": 1} and 90 in ctx.verified


def test_a_failed_augmentation_answers_without_it_and_records_the_fallback() -> None:
    services = Services(graph_rag_enabled=True)
    services.augment_error = TransientError("opensearch away")
    ctx = context()
    before = [c.chunk_id for c in ctx.kept]
    run(ctx, services)
    assert [c.chunk_id for c in ctx.kept] == before
    assert ctx.graph == {"status": "failed", "error": "TransientError"} and ctx.fallbacks == ["graph_failed"]


def test_a_failed_rerank_answers_the_request() -> None:
    services = Services()
    services.rerank_error = RerankUnavailable("gateway down")
    with pytest.raises(RerankUnavailable):
        run(context(), services, rerank=True)


def test_a_named_document_the_filters_exclude_is_recorded_not_shown() -> None:
    services = Services()
    services.named_hit = None  # the request's filters exclude its chunks
    ctx = context(named(7, 70), {70: version(70, 7)})
    run(ctx, services)
    assert all(c.document_id != 7 for c in ctx.kept)
    assert ctx.identity.extra == {"hit": "filtered_out"} and ctx.fallbacks == ["identity_filtered_out"]


def test_a_named_hit_whose_version_the_caller_may_not_see_is_not_shown() -> None:
    services = Services()
    services.named_hit = chunk(70, 7)
    ctx = context(named(7, 70), {})  # the version chosen for it did not verify
    run(ctx, services)
    assert all(c.document_id != 7 for c in ctx.kept) and 70 not in ctx.verified


def test_the_authoritative_match_goes_to_the_end_of_the_first_page_unless_on_it() -> None:
    services = Services(authoritative_doc_type="statute")
    services.authoritative = (chunk(80, 8, 0.5), version(80, 8))
    ctx = context()
    run(ctx, services)
    assert [c.document_id for c in ctx.kept[: ctx.request.window]][-1] == 8 and 80 in ctx.verified
    services.authoritative = (chunk(1, 1), version(1, 1))  # already on the page: nothing moves
    again = context()
    run(again, services)
    assert [c.chunk_id for c in again.kept] == [c.chunk_id for c in context().kept]


def test_matches_needs_the_version_verified_with_the_same_document_and_project() -> None:
    c = chunk(5, 50)
    assert matches(c, {5: version(5, 50)})
    assert not matches(c, {})
    assert not matches(c, {5: version(5, 51)})


def test_the_timer_adds_up_stages_and_the_total() -> None:
    timer = StageTimer(started=time.perf_counter() - 0.05)
    with timer.stage("fuse"):
        pass
    since = timer.mark("scope", timer.started)
    timer.mark("embed", since)
    total = timer.finish()["total"]
    assert total >= 50 and timer.ms["scope"] >= 50 and 0 <= timer.ms["fuse"] < total
