"""The authoritative document type's best lexical match (search.ranking.augment) on the first page: at its end
unless already on it (`authoritative` in the timings)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from ki.settings import RetrievalSettings
from search.access.reverify import VerifiedVersion
from search.access.scope import MATCH_NONE, CompiledScope
from search.pipeline import QueryContext, Stage, matches
from search.ports import SqlReader
from search.ranking import augment, sql_reads
from search.ranking.fusion import Candidate, put_at
from search.ranking.legs import SOURCE_INCLUDES
from search.ranking.scoped import ScopedIndex, admits
from search.request import SearchRequest


class AuthoritativeFinder:
    """The authoritative type's best match, scoped and verified (its ontology node looked up once it exists)."""

    def __init__(self, retrieval: RetrievalSettings, scoped: ScopedIndex, sql: SqlReader) -> None:
        self.retrieval, self.scoped, self.sql = retrieval, scoped, sql
        self._node_id: int | None = None  # ontology node of retrieval.authoritative_doc_type

    async def authoritative_hit(
        self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope
    ) -> tuple[Candidate, VerifiedVersion] | None:
        key = self.retrieval.authoritative_doc_type
        if key is None:
            return None
        if self._node_id is None:  # node ids never change: looked up once it exists
            self._node_id = await self.sql.read(lambda c: sql_reads.doc_type_id(c, key))
            if self._node_id is None:
                return None
        strict = self.scoped.request_filter(request, scope)
        if strict == MATCH_NONE:
            return None
        body = augment.authoritative_body(request.query, strict, self._node_id, SOURCE_INCLUDES)
        found = [
            Candidate(h["_id"], float(h.get("_score") or 0.0), h.get("_source") or {}, match_reason="authoritative")
            for h in await self.scoped.search(body)
            if admits(scope, h.get("_source") or {})
        ]
        verified = await self.sql.reverify(principals, [c.version_id for c in found], scope, request.as_of)
        best = next((c for c in found if matches(c, verified)), None)
        return None if best is None else (best, verified[best.version_id])


class FindAuthoritative(Protocol):
    """The authoritative match port (`AuthoritativeFinder.authoritative_hit`)."""

    def __call__(
        self, principals: Sequence[str], request: SearchRequest, scope: CompiledScope
    ) -> Awaitable[tuple[Candidate, VerifiedVersion] | None]: ...


class AuthoritativeType(Stage):
    name = "authoritative"

    def __init__(self, retrieval: RetrievalSettings, find: FindAuthoritative) -> None:
        self.retrieval, self.find = retrieval, find

    def applies(self, ctx: QueryContext) -> bool:
        return self.retrieval.authoritative_doc_type is not None and ctx.request.offset == 0

    async def run(self, ctx: QueryContext) -> None:
        found = await self.find(ctx.principals, ctx.request, ctx.scope)
        if found is None:
            return
        hit, version = found
        window = ctx.request.window
        if any(c.document_id == hit.document_id for c in ctx.kept[:window]):
            return
        r = self.retrieval
        ctx.kept = put_at(hit, ctx.kept, window - 1, per_document=r.collapse_per_document,
                          max_chunks_per_document=r.max_chunks_per_document)  # fmt: skip
        ctx.admit({hit.version_id: version})
