"""The document reads behind the service (documents, text slices, relations, traversals, decision records, chunks):
each in SQL on the re-verify's connections (search.ports.SqlReader.verified_read), checked against the caller's
principals there, and released on the grid (`SqlReader.on_the_grid`) so that what PostgreSQL did below the same
statements cannot show in when the answer leaves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import Connection

from ki.settings import Settings
from search.access.scope import CompiledScope
from search.documents import lookup as lookups
from search.documents import read as documents
from search.documents.chunks import ChunkId, read_chunk
from search.documents.decisions import DecisionPage, ScopeBound, search_decisions
from search.documents.text import read_text
from search.ports import SqlReader
from search.ranking.scoped import ScopedIndex
from search.request import DecisionSearchRequest, LookupRequest, ReadRequest, RelatedRequest, TraverseRequest

#: The caller's compiled scope (the scope stage's, cached per caller): decision search bounds its candidates by it.
CompileScope = Callable[[Sequence[str], Sequence[int] | None], Awaitable[CompiledScope]]


class DocumentReads:
    def __init__(self, settings: Settings, sql: SqlReader, scoped: ScopedIndex, compile_scope: CompileScope) -> None:
        self.settings, self.sql, self.scoped, self.compile_scope = settings, sql, scoped, compile_scope

    async def get_document(self, principals: Sequence[str], document_id: int) -> dict[str, Any] | None:
        """The document with the versions the caller may see (None: not visible or not there)."""
        security = self.settings.security
        read = self.sql.verified_read(lambda c: documents.get_document(c, principals, security, document_id))
        return await self.sql.on_the_grid(read)

    async def read_text(
        self, principals: Sequence[str], document_id: int, version_id: int | None, request: ReadRequest
    ) -> dict[str, Any] | None:
        """A slice of a version's text the caller may see (None: not visible or not there; search.documents.text)."""
        security, api = self.settings.security, self.settings.api
        length, injection = request.characters(api), api.evidence.injection

        def run(conn: Connection) -> dict[str, Any] | None:
            return read_text(
                conn, principals, security, document_id, version_id, request.offset, length, injection,
                api.evidence.source_urls,
            )  # fmt: skip

        return await self.sql.on_the_grid(self.sql.verified_read(run))

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

        return await self.sql.on_the_grid(self.sql.verified_read(run))

    async def traverse(self, principals: Sequence[str], request: TraverseRequest) -> dict[str, Any]:
        """Documents reachable from the start documents, each one checked against the caller's access."""
        security, api = self.settings.security, self.settings.api

        def run(conn: Connection) -> dict[str, Any]:
            return documents.run_traversal(
                conn, principals, security, request.start, kinds=request.kinds, direction=request.direction,
                depth=request.depth, fanout=request.max_fanout or api.limits.max_traverse_fanout,
            )  # fmt: skip

        return await self.sql.on_the_grid(self.sql.verified_read(run))

    async def search_decisions(self, principals: Sequence[str], request: DecisionSearchRequest) -> DecisionPage:
        """Decision records by token overlap among those the caller's compiled scope bounds, checked against the
        caller's principals in SQL."""
        security = self.settings.security

        async def run() -> DecisionPage:
            scope = await self.compile_scope(principals, request.filters.project_id)
            bound = ScopeBound.of(scope.project_ids, scope.document_ids)
            return await self.sql.read(lambda c: search_decisions(c, principals, security, request, bound))

        return await self.sql.on_the_grid(run())

    async def read_chunk(self, principals: Sequence[str], chunk: ChunkId) -> dict[str, Any] | None:
        """A chunk by its id, its text from PostgreSQL where it is a span of the version's (None: not visible or
        not there; search.documents.chunks)."""

        async def index_row(row_id: str) -> dict[str, Any] | None:
            found = await self.scoped.search(
                {"size": 1, "query": {"ids": {"values": [row_id]}}, "_source": {"excludes": ["embedding"]}}
            )
            return found[0].get("_source") if found else None

        read = read_chunk(principals, self.settings, chunk, self.sql.verified_read, index_row)
        return await self.sql.on_the_grid(read)

    async def lookup(self, principals: Sequence[str], request: LookupRequest) -> dict[str, Any]:
        """Exactly one document and version by an identifier or an exact title, `ambiguous` or `not_found`,
        never a ranking (search.documents.lookup); the chunk holding an asked provision's heading from the index."""
        security = self.settings.security

        async def run() -> dict[str, Any]:
            found = await self.sql.verified_read(lambda c: lookups.look_up(c, principals, security, request))
            query = found.chunk_query()
            if query is not None:
                found = found.with_chunk_of(await self.scoped.search(query))
            return found.to_json()

        return await self.sql.on_the_grid(run())
