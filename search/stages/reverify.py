"""The SQL re-verify and collapse of the fused list (search.access.reverify, search.ranking.fusion.collapse),
only as far as the page needs (`reverify` in the timings)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Sequence
from typing import Protocol

from ki.settings import RetrievalSettings
from search.access.reverify import VerifiedVersion
from search.access.scope import CompiledScope
from search.pipeline import QueryContext, Stage, matches
from search.ranking.fusion import Candidate, collapse
from search.ranking.rerank import RERANK_TOP_N
from search.ranking.scoped import FILL_GROWTH, prefix_end


class Reverify(Protocol):
    """The re-verify port (search.ports.SqlReader.reverify)."""

    def __call__(
        self,
        principals: Sequence[str],
        version_ids: Sequence[int],
        scope: CompiledScope,
        as_of: dt.date | None = None,
        compare_with: dt.date | str | None = None,
    ) -> Awaitable[dict[int, VerifiedVersion]]: ...


async def verified_head(
    reverify: Reverify,
    retrieval: RetrievalSettings,
    principals: Sequence[str],
    scope: CompiledScope,
    fused: Sequence[Candidate],
    need: int,
    as_of: dt.date | None = None,
    compare_with: dt.date | str | None = None,
) -> tuple[list[Candidate], dict[int, VerifiedVersion]]:
    """Re-verify in fused order only as far as the page needs: the collapsed survivors of a prefix
    (cut between different scores) begin exactly like those of the whole list once they number
    `need`, since everything after the prefix scores lower. Usually one statement over a few dozen
    versions instead of every candidate's."""
    r = retrieval
    verified: dict[int, VerifiedVersion] = {}
    checked: set[int] = set()
    n, batch = 0, max(2 * need, 20)
    while True:
        end = prefix_end(fused, n + batch)
        ids = {c.version_id for c in fused[n:end]} - checked
        if ids:
            verified.update(await reverify(principals, sorted(ids), scope, as_of, compare_with))
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


class ReverifyStage(Stage):
    name = "reverify"

    def __init__(self, reverify: Reverify, retrieval: RetrievalSettings, rerank: bool) -> None:
        self.reverify, self.retrieval, self.rerank = reverify, retrieval, rerank

    async def run(self, ctx: QueryContext) -> None:
        """As far as the window needs (the rerank's top too, and one more for `has_more`; one more again when
        the query names a document, which may take a place of the page)."""
        need = max(ctx.request.window, RERANK_TOP_N if self.rerank else 0) + 1
        need += ctx.identity.unique is not None
        ctx.kept, ctx.verified = await verified_head(
            self.reverify,
            self.retrieval,
            ctx.principals,
            ctx.scope,
            ctx.fused,
            need,
            ctx.request.as_of,
            ctx.plan.compare_with,
        )
