"""The answer's stages, over the page's hits: the neighbours of each hit (`expand` in the timings), the evidence
budget (search.ranking.budget), the links of the source objects each hit may be cited at (search.documents.sources)
and, last, the injection marks (search.evidence.injection: its spans are into the text handed out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ki.settings import Settings
from search.access.reverify import VerifiedVersion
from search.documents.sources import refs_json
from search.pipeline import QueryContext, Stage
from search.ranking.budget import fit_budget
from search.ranking.hits import mark_injections
from search.ranking.scoped import ScopedIndex


class Neighbours(Stage):
    name = "expand"

    def __init__(self, scoped: ScopedIndex, per_document: int) -> None:
        self.scoped, self.per_document = scoped, per_document

    def applies(self, ctx: QueryContext) -> bool:
        return ctx.request.expand and bool(ctx.hits)

    async def run(self, ctx: QueryContext) -> None:
        await self.scoped.add_neighbours(ctx.hits, self.per_document)


class EvidenceBudget(Stage):
    name = "budget"
    timed = False

    def __init__(self, default_chars: int | None) -> None:
        self.default_chars = default_chars

    def applies(self, ctx: QueryContext) -> bool:
        return (ctx.request.evidence_budget_chars or self.default_chars) is not None and bool(ctx.hits)

    async def run(self, ctx: QueryContext) -> None:
        budget = ctx.request.evidence_budget_chars or self.default_chars
        assert budget is not None
        ctx.hits, use = fit_budget(ctx.hits, budget, ctx.request.offset)
        ctx.has_more = ctx.has_more or use.hits_dropped > 0
        ctx.evidence = use.to_json()


def link_sources(
    hits: list[dict[str, Any]], verified: Mapping[int, VerifiedVersion], templates: Mapping[str, str]
) -> None:
    """Each hit's `citation.sources`: its citable source objects with their kind, ref and link, as the re-verify
    read them (no statement of its own)."""
    for hit in hits:
        found = verified.get(hit["version_id"])
        hit["citation"]["sources"] = refs_json(found.sources if found is not None else (), templates)


class SourceLinks(Stage):
    name = "sources"
    timed = False

    def __init__(self, templates: Mapping[str, str]) -> None:
        self.templates = templates

    async def run(self, ctx: QueryContext) -> None:
        link_sources(ctx.hits, ctx.verified, self.templates)


class InjectionMarks(Stage):
    name = "injections"
    timed = False

    def __init__(self, settings: Settings) -> None:
        self.policy = settings.api.evidence.injection

    async def run(self, ctx: QueryContext) -> None:
        mark_injections(ctx.hits, self.policy)


def answer_stages(settings: Settings, scoped: ScopedIndex) -> list[Stage]:
    r = settings.retrieval
    return [Neighbours(scoped, r.neighbours_max_chunks_per_document), EvidenceBudget(r.evidence_budget_chars),
            SourceLinks(settings.api.evidence.source_urls), InjectionMarks(settings)]  # fmt: skip
