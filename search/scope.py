"""Compile a caller's access scope in SQL (through `ki.acl`, the one ACL semantics) into id sets, and
encode it as an OpenSearch filter of bounded size.

The filter every leg carries is chosen per request, smallest first within `api.max_scope_filter_bytes`:

* **exact** -- `terms` on the scope's document ids and project ids: the filter *is* the scope;
* **projects** -- `terms` on the scope's project ids only, a superset of the scope (documents of those
  projects the caller may not see pass it);
* **open** -- no scope clause at all (the metadata filters only), for callers whose projects alone exceed
  the budget (administrators of a large deployment).

A superset filter is made exact again in the service: every leg's hits are checked against the compiled
scope (`CompiledScope.admits`, a binary search) and a leg that lost hits is asked again for more until
it has as many in-scope hits as the exact filter would have returned, or none are left. So the ranked
lists, and everything computed from them, are the ones the exact filter gives; the request stays small
whatever the scope size (1M visible documents would be ~10 MB of ids). The SQL re-verify of every
returned hit comes after either way.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger

from ki.acl import Caller, visible_scope
from ki.settings import SecuritySettings

MATCH_NONE: dict[str, Any] = {"match_none": {}}
FilterKind = Literal["exact", "projects", "open", "none"]
# A JSON string id costs its digits, two quotes, a comma and (some serialisers) a space.
_ID_OVERHEAD_BYTES = 4


def _terms(field: str, ids: Sequence[int], max_terms: int) -> dict[str, Any]:
    values = [str(i) for i in ids]
    if len(values) <= max_terms:
        return {"terms": {field: values}}
    parts = [{"terms": {field: values[i : i + max_terms]}} for i in range(0, len(values), max_terms)]
    return {"bool": {"should": parts, "minimum_should_match": 1}}


def terms_bytes(ids: Sequence[int]) -> int:
    """An upper bound of the JSON size of `ids` as a `terms` list (sorted ids: the last is the longest)."""
    if not ids:
        return 0
    return len(ids) * (len(str(ids[-1])) + _ID_OVERHEAD_BYTES)


def _sorted_ids(values: Iterable[int]) -> array[int]:
    return array("q", sorted(set(values)))


@dataclass(frozen=True)
class ScopeFilter:
    """The scope clause of one request. `exact`: the clause admits exactly the scope's documents;
    otherwise it admits a superset and every hit must pass `CompiledScope.admits`. `density`: the share
    of the documents it admits that are in scope (1.0 when exact; 0.5 when unknown), so a leg can ask
    for enough hits at once."""

    kind: FilterKind
    clause: dict[str, Any] | None  # None: no scope clause (kind "open")
    density: float = 1.0

    @property
    def exact(self) -> bool:
        return self.kind in ("exact", "none")


@dataclass(frozen=True, eq=False)
class CompiledScope:
    """The concrete ids the SQL authorisation produced for one caller (sorted, distinct, 8 bytes each:
    a cached scope of a million documents is 8 MB)."""

    project_ids: array[int]
    document_ids: array[int]
    max_terms_count: int = 65_536
    # Live documents in the scope's projects, and in the database (0: unknown): what a superset filter
    # admits, for its density.
    project_documents: int = 0
    all_documents: int = 0

    @classmethod
    def of(
        cls, project_ids: Iterable[int], document_ids: Iterable[int], max_terms_count: int = 65_536
    ) -> CompiledScope:
        return cls(_sorted_ids(project_ids), _sorted_ids(document_ids), max_terms_count)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompiledScope):
            return NotImplemented
        return self.project_ids == other.project_ids and self.document_ids == other.document_ids

    __hash__ = None  # type: ignore[assignment]

    @property
    def is_empty(self) -> bool:
        return not self.document_ids

    @property
    def size(self) -> int:
        """Ids held (what the scope cache counts against its memory bound)."""
        return len(self.project_ids) + len(self.document_ids)

    def admits(self, document_id: int, project_id: int) -> bool:
        """Is this (document, project) pair in the scope? The same test as the exact filter's."""
        return _contains(self.document_ids, document_id) and _contains(self.project_ids, project_id)

    def opensearch_filter(self) -> dict[str, Any]:
        """The exact filter: terms on document_id and project_id; an empty scope is `match_none`."""
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

    def bounded_filter(self, max_bytes: int | None) -> ScopeFilter:
        """The smallest-first choice of the module docstring; `max_bytes=None`: always exact."""
        if self.is_empty:
            return ScopeFilter("none", MATCH_NONE)
        projects = terms_bytes(self.project_ids)
        if max_bytes is None or terms_bytes(self.document_ids) + projects <= max_bytes:
            return ScopeFilter("exact", self.opensearch_filter())
        if projects <= max_bytes:
            clause = _terms("project_id", self.project_ids, self.max_terms_count)
            return ScopeFilter("projects", clause, self._density(self.project_documents))
        return ScopeFilter("open", None, self._density(self.all_documents))

    def _density(self, admitted: int) -> float:
        return min(1.0, len(self.document_ids) / admitted) if admitted > 0 else 0.5


def _contains(ids: Sequence[int], value: int) -> bool:
    i = bisect.bisect_left(ids, value)
    return i < len(ids) and ids[i] == value


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
    population = conn.execute(_POPULATION_SQL, {"p": list(projects)}).one() if documents else None
    return CompiledScope(  # ids already sorted and distinct
        array("q", projects),
        array("q", documents),
        max_terms_count,
        project_documents=int(population.in_projects) if population else 0,
        all_documents=int(population.everywhere) if population else 0,
    )


# What a superset filter admits: live documents of the scope's projects (index on project_id), and the
# planner's estimate of all documents (an exact count of millions of rows would cost more than it saves).
_POPULATION_SQL = text(
    """
    SELECT (SELECT count(*) FROM documents WHERE deleted_at IS NULL AND project_id = ANY(CAST(:p AS bigint[])))
               AS in_projects,
           (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'documents'::regclass) AS everywhere
    """
).bindparams(bindparam("p", type_=ARRAY(BigInteger)))


def strict_filter(scope: CompiledScope | ScopeFilter, metadata: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The one filter all legs carry: the scope clause (exact unless a `ScopeFilter` says otherwise) AND
    the metadata filters."""
    chosen = scope if isinstance(scope, ScopeFilter) else scope.bounded_filter(None)
    if chosen.clause == MATCH_NONE:
        return MATCH_NONE
    clauses = [*([chosen.clause] if chosen.clause is not None else []), *metadata]
    return {"bool": {"filter": clauses}}
