"""The answer gate's second signal (search.ranking.coverage, `retrieval.answer_coverage_gate`): after the
re-verify, an answer whose first hits neither reach the similarity bar nor hold enough of the question's content
words is made empty (`no_credible_evidence`). Read on re-verified rows only, so whether an answer is emptied never
depends on a row the caller may not see."""

from __future__ import annotations

from collections.abc import Callable

from ki.settings import RetrievalSettings
from search.pipeline import QueryContext, Stage
from search.ranking.coverage import answer_evidence, coverage_empties_answer
from search.stages.rerank import PageRows


class AnswerCoverageStage(Stage):
    name = "answer_gate"
    timed = False

    def __init__(self, retrieval: RetrievalSettings, signature: Callable[[], str], page_rows: PageRows) -> None:
        self.retrieval, self.signature, self.page_rows = retrieval, signature, page_rows

    def applies(self, ctx: QueryContext) -> bool:
        return bool(ctx.kept) and (self.retrieval.answer_coverage_gate_enabled or ctx.request.explain)

    async def run(self, ctx: QueryContext) -> None:
        r, gate = self.retrieval, self.retrieval.answer_coverage_gate
        semantic = ctx.legs.get("semantic") if "semantic" in ctx.legs else None
        # The legs read no text: the first hits' rows are read here (re-verified ids only), and kept for the page.
        head = await self.page_rows(ctx.kept[: gate.hits])
        ctx.kept = head + ctx.kept[gate.hits :]
        evidence = answer_evidence(ctx.request.query, head, semantic, r.vector_space_type)
        bar = gate.similarity.get(self.signature()) if r.answer_coverage_gate_enabled else None
        empty = (
            bar is not None
            and not evidence.identifier
            and ctx.identity.outcome == "none"  # a document the query names is never emptied
            and coverage_empties_answer(evidence.similarity, evidence.coverage, bar, gate.min_coverage)
        )
        if empty:
            ctx.kept = []
        ctx.answer_gate = evidence.to_json(empty)
