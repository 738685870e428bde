"""Compile a caller's access scope in SQL (through `ki.acl`, the one ACL semantics) into id sets, and
encode it as an OpenSearch filter of bounded size that admits rows per *version*, as access is decided.

A scope holds the visible projects and documents, the *hidden versions* that a per-document filter or the
principal projection would otherwise let through (every hidden version of a visible document, and the
versions an allow grant of the caller reaches that the caller still may not see), and the caller's
principals that grants name. The filter every leg carries is chosen per request, first that fits within
`api.limits.max_scope_filter_bytes`:

* **exact** -- `terms` on the scope's document and project ids, minus the hidden versions: the filter
  *is* the scope, as fresh as PostgreSQL;
* **principals** -- the principal projection (`allowed_principals` names one of the caller's granted
  principals, `denied_principals` none), minus the hidden versions (and the scope's projects when they
  fit): the scope again, as far as the index has caught up with the grants;
* **projects** -- `terms` on the scope's project ids (and the projection when it fits), a superset;
* **open** -- no id clause at all (the projection when it fits), a superset (administrators, whom no
  projection names, of a large deployment).

Supersets are for administrators only. A non-administrator whose exact and principals filters both exceed the
budget (a scope of many documents and many granted groups, or an alias that leads out of the caller's
principals, which makes the projection unusable) gets the exact filter anyway: its size is a function of
what the caller may see, while a superset's fill rounds cost time per hidden row it admits (a word found only
in a hidden document took two rounds: 41.9 against 5.1 ms).

A superset filter is made exact again in the service: every leg's hits are checked against the compiled
scope (`CompiledScope.admits`, per version, a binary search) and a leg that lost hits is asked again for
more until it has as many in-scope hits as the exact filter would have returned, or none are left. So the
ranked lists, and everything computed from them, are the ones the exact filter gives; only how long that
takes still depends on rows the caller may not see, and the projection keeps those to rows an allow grant
of the caller reaches. The SQL re-verify of every returned hit comes after either way.

What the exact filters cannot hide: the index lags PostgreSQL. A version that became hidden a moment ago
can still pass the **principals** filter (and a version that became visible is still missing) until the
sync worker has rewritten its projection; the re-verify drops such a row, but it took its rank first.
"""

from __future__ import annotations

import bisect
import functools
import json
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger

from ki.acl import Caller, Walk, search_scope, walk_for
from ki.settings import SecuritySettings

MATCH_NONE: dict[str, Any] = {"match_none": {}}
FilterKind = Literal["exact", "principals", "projects", "open", "none"]
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


# What wraps a list: `{"terms": {"<field>": [...]}}`, and for a `must_not` or nested `bool` its own keys.
_TERMS_WRAPPER_BYTES = len('{"terms": {"": []}}, ')
_BOOL_WRAPPER_BYTES = len('{"bool": {"filter": [], "must_not": []}}, ')


def _clause_bytes(field: str, list_bytes: int, *, nested: bool = False) -> int:
    """An upper bound of the JSON size of one `terms` clause on `field` (0: no clause)."""
    if not list_bytes:
        return 0
    return list_bytes + len(field) + _TERMS_WRAPPER_BYTES + (_BOOL_WRAPPER_BYTES if nested else 0)


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
        return self.kind in ("exact", "principals", "none")


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
    # Versions the document and projection clauses would admit although the caller may not see them.
    hidden_version_ids: array[int] = field(default_factory=lambda: array("q"))
    # The caller's principals that allow and deny grants name; `projection`: whether the principal
    # projection decides for this caller (not for administrators, whom grants do not bind).
    allow_principals: tuple[str, ...] = ()
    deny_principals: tuple[str, ...] = ()
    projection: bool = False
    # How the re-verify finds the caller's groups (`ki.acl.Walk`): a plan hint by the caller's principals.
    reverify_walk: Walk = "from_caller"
    # Whether a superset filter may be sent (administrators only; see the module docstring).
    administrator: bool = False

    @classmethod
    def of(
        cls,
        project_ids: Iterable[int],
        document_ids: Iterable[int],
        max_terms_count: int = 65_536,
        *,
        hidden_version_ids: Iterable[int] = (),
        allow_principals: Iterable[str] | None = None,
        deny_principals: Iterable[str] = (),
        administrator: bool | None = None,
    ) -> CompiledScope:
        """`allow_principals` None: no projection clause (as for an administrator, which `administrator` None
        then means too)."""
        return cls(
            _sorted_ids(project_ids),
            _sorted_ids(document_ids),
            max_terms_count,
            hidden_version_ids=_sorted_ids(hidden_version_ids),
            allow_principals=tuple(sorted(set(allow_principals or ()))),
            deny_principals=tuple(sorted(set(deny_principals))),
            projection=allow_principals is not None,
            administrator=allow_principals is None if administrator is None else administrator,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompiledScope):
            return NotImplemented
        return (
            self.project_ids == other.project_ids
            and self.document_ids == other.document_ids
            and self.hidden_version_ids == other.hidden_version_ids
            and self.allow_principals == other.allow_principals
            and self.deny_principals == other.deny_principals
            and self.projection == other.projection
            and self.administrator == other.administrator
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def is_empty(self) -> bool:
        return not self.document_ids

    @property
    def size(self) -> int:
        """Ids held (what the scope cache counts against its memory bound)."""
        return len(self.project_ids) + len(self.document_ids) + len(self.hidden_version_ids)

    def holds_document(self, document_id: int, project_id: int) -> bool:
        """Does the caller see at least one version of this document (in this project)?"""
        return _contains(self.document_ids, document_id) and _contains(self.project_ids, project_id)

    def admits(self, document_id: int, project_id: int, version_id: int) -> bool:
        """May the caller see this version (of this document, in this project)? The exact filter's test."""
        return self.holds_document(document_id, project_id) and not _contains(self.hidden_version_ids, version_id)

    def opensearch_filter(self) -> dict[str, Any]:
        """The exact filter: terms on document_id and project_id, minus the hidden versions; an empty scope
        is `match_none`."""
        if self.is_empty:
            return MATCH_NONE
        return self._clause([self._documents(), self._projects()])

    def _documents(self) -> dict[str, Any]:
        return _terms("document_id", self.document_ids, self.max_terms_count)

    def _projects(self) -> dict[str, Any]:
        return _terms("project_id", self.project_ids, self.max_terms_count)

    def _projection(self) -> dict[str, Any]:
        """The principal projection admits the caller: an allowed principal is theirs, no denied one is."""
        allowed: dict[str, Any] = {"terms": {"allowed_principals": list(self.allow_principals)}}
        if not self.deny_principals:
            return allowed
        return {
            "bool": {"filter": [allowed], "must_not": [{"terms": {"denied_principals": list(self.deny_principals)}}]}
        }

    def _clause(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """`parts` AND-ed, minus the hidden versions."""
        out: dict[str, Any] = {"filter": parts}
        if self.hidden_version_ids:
            out["must_not"] = [_terms("document_version_id", self.hidden_version_ids, self.max_terms_count)]
        return {"bool": out}

    @functools.cached_property
    def _projection_bytes(self) -> int:
        """The projection clause's JSON size, exactly (escapes make strings up to 6x their UTF-8 size)."""
        return len(json.dumps(self._projection())) + len(", ")

    def bounded_filter(self, max_bytes: int | None) -> ScopeFilter:
        """The first of the module docstring's filters that fits in `max_bytes` (None: always exact)."""
        if self.is_empty:
            return ScopeFilter("none", MATCH_NONE)
        documents = _clause_bytes("document_id", terms_bytes(self.document_ids))
        projects = _clause_bytes("project_id", terms_bytes(self.project_ids))
        hidden = _clause_bytes("document_version_id", terms_bytes(self.hidden_version_ids), nested=True)
        projection = self._projection_bytes if self.projection else None

        def fits(*sizes: int | None) -> bool:  # None: a clause this caller cannot have
            if any(size is None for size in sizes):
                return False
            return max_bytes is None or sum(size or 0 for size in sizes) <= max_bytes

        def with_projection(parts: list[dict[str, Any]], *sizes: int | None) -> list[dict[str, Any]]:
            return [*parts, self._projection()] if self.projection and fits(*sizes, projection) else parts

        if fits(documents, projects, hidden):  # no projection: a grant made a moment ago counts at once
            return ScopeFilter("exact", self._clause([self._documents(), self._projects()]))
        if fits(projection, hidden):
            parts = [self._projection(), *([self._projects()] if fits(projection, hidden, projects) else [])]
            return ScopeFilter("principals", self._clause(parts))
        if not self.administrator:  # over the budget, but exact and as fresh as PostgreSQL: never a superset
            return ScopeFilter("exact", self._clause([self._documents(), self._projects()]))
        if fits(projects):
            parts = with_projection([self._projects()], projects)
            return ScopeFilter("projects", {"bool": {"filter": parts}}, self._density(self.project_documents))
        parts = with_projection([])
        clause = {"bool": {"filter": parts}} if parts else None
        return ScopeFilter("open", clause, self._density(self.all_documents))

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
    """Every project and document holding at least one version the caller may see, the hidden versions a
    per-document or projection filter would admit, and the caller's granted principals (fails closed)."""
    if caller.is_anonymous:
        return CompiledScope.of((), (), max_terms_count)
    found = search_scope(conn, caller, security, project_ids=project_ids)
    population = conn.execute(_POPULATION_SQL, {"p": list(found.project_ids)}).one() if found.document_ids else None
    return CompiledScope(  # ids already sorted and distinct
        array("q", found.project_ids),
        array("q", found.document_ids),
        max_terms_count,
        project_documents=int(population.in_projects) if population else 0,
        all_documents=int(population.everywhere) if population else 0,
        hidden_version_ids=array("q", found.hidden_version_ids),
        allow_principals=found.allow_principals,
        deny_principals=found.deny_principals,
        projection=not caller.is_admin and not found.aliases_escape,
        reverify_walk=walk_for(len(caller.principals)),
        administrator=caller.is_admin,
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
