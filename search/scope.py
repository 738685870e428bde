"""Compile a caller's access scope in SQL (through `ki.acl`, the one ACL semantics) into id sets and
the strict OpenSearch filter every leg carries.

Large scopes: OpenSearch caps one `terms` query at `index.max_terms_count` values (65,536 by default,
`opensearch.max_terms_count` here). A scope with more document ids is split into several `terms`
clauses of at most that many values, OR-ed in a `bool.should` with `minimum_should_match: 1`. We chose
splitting over alternatives because it keeps the filter an exact projection of the SQL decision
(the principal projection fields can lag behind SQL, and integer bitmaps would need a numeric copy of
the id fields in the mapping). Cost: the request body grows linearly with the scope (roughly 8 bytes
per id), and each clause counts against `indices.query.bool.max_clause_count` — 1,024 chunks of
65,536 ids cover 67 million documents. Whatever the filter lets through, every candidate is
re-verified in SQL before it is returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from ki.acl import Caller, visible_scope
from ki.settings import SecuritySettings

MATCH_NONE: dict[str, Any] = {"match_none": {}}


def _terms(field: str, ids: Sequence[int], max_terms: int) -> dict[str, Any]:
    values = [str(i) for i in ids]
    if len(values) <= max_terms:
        return {"terms": {field: values}}
    parts = [{"terms": {field: values[i : i + max_terms]}} for i in range(0, len(values), max_terms)]
    return {"bool": {"should": parts, "minimum_should_match": 1}}


@dataclass(frozen=True)
class CompiledScope:
    """The concrete ids the SQL authorisation produced for one caller (sorted, de-duplicated)."""

    project_ids: tuple[int, ...]
    document_ids: tuple[int, ...]
    max_terms_count: int = 65_536

    @classmethod
    def of(
        cls, project_ids: Iterable[int], document_ids: Iterable[int], max_terms_count: int = 65_536
    ) -> CompiledScope:
        return cls(tuple(sorted(set(project_ids))), tuple(sorted(set(document_ids))), max_terms_count)

    @property
    def is_empty(self) -> bool:
        return not self.document_ids

    def opensearch_filter(self) -> dict[str, Any]:
        """Terms on document_id and project_id; an empty scope is `match_none`, never unfiltered."""
        if self.is_empty:
            return MATCH_NONE
        return {
            "bool": {
                "filter": [
                    _terms("document_id", self.document_ids, self.max_terms_count),
                    _terms("project_id", self.project_ids, self.max_terms_count),
                ]
            }
        }


def compile_scope(
    conn: Connection,
    caller: Caller,
    security: SecuritySettings,
    *,
    project_ids: Sequence[int] | None = None,
    max_terms_count: int = 65_536,
) -> CompiledScope:
    """Every project and document holding at least one version the caller may see (fails closed)."""
    if caller.is_anonymous:
        return CompiledScope.of((), (), max_terms_count)
    projects, documents = visible_scope(conn, caller, security, project_ids=project_ids)
    return CompiledScope(projects, documents, max_terms_count)  # already sorted and distinct


def strict_filter(scope: CompiledScope, metadata: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The one filter all legs carry: the compiled scope AND the metadata filters."""
    scope_filter = scope.opensearch_filter()
    if scope_filter == MATCH_NONE:
        return MATCH_NONE
    return {"bool": {"filter": [scope_filter, *metadata]}}
