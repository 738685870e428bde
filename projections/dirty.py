"""Which parts of the index a change touches.

A CDC event is a *trigger*: the sync re-reads the current state from PostgreSQL (the authority) for
everything the event may have changed, so duplicated, reordered or replayed events all converge on the
same index. This module maps one event to the keys it dirties; SQL then resolves the keys to versions.

Two kinds of dirt, two paths through the sync (`projections.plan` describes both):
* content (documents, document_versions, matters, ontology_nodes) — the version's rows are rebuilt
  and compared with the stored ones (text, title, type, matter, identifiers, status, latest version);
* access (projects, grants, source_observations, source_objects, sources, group_memberships,
  principal_aliases) — only the principal projection is rewritten, nothing is embedded.
Content work always recomputes the projection too, so access work is only what content work is not
(`projections.plan.access_only_versions`). An observation change is named as access dirt but can also
change the rows' `meta.source_object_id`, which only the content path writes, so the worker puts its
versions on the content path (which re-embeds nothing unless a text changed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ki import table_roles
from ki.table_roles import HEARTBEAT_TABLE
from projections.cdc import ChangeEvent, Tombstone, is_unavailable

# Tables whose changes never reach the index (served from SQL) and Debezium's own heartbeat.
IGNORED_TABLES = frozenset({"decision_records", "relations", HEARTBEAT_TABLE})

#: Tables whose changes can alter an embedded string (text, title, type label, matter): the only ones the
#: content lane reads. Every other captured table names access keys only.
CONTENT_TABLES: tuple[str, ...] = table_roles.CONTENT_TABLES

#: The one DirtyKeys field that holds principal names (read as text, folded) rather than ids.
_PRINCIPAL_KEYS = "access_principals"


@dataclass
class DirtyKeys:
    """Ids whose index rows need work, grouped by what they name."""

    content_versions: set[int] = field(default_factory=set)
    content_documents: set[int] = field(default_factory=set)
    content_matters: set[int] = field(default_factory=set)
    content_ontology_nodes: set[int] = field(default_factory=set)
    access_versions: set[int] = field(default_factory=set)
    access_documents: set[int] = field(default_factory=set)
    access_projects: set[int] = field(default_factory=set)
    access_source_objects: set[int] = field(default_factory=set)
    access_sources: set[int] = field(default_factory=set)
    access_principals: set[str] = field(default_factory=set)
    #: Tables truncated upstream: every indexed version is checked (rows of versions gone are deleted, the
    #: principal projection of the others rewritten), as `ki reconcile` would.
    truncated: set[str] = field(default_factory=set)

    def update(self, other: DirtyKeys) -> None:
        for name in self.__dataclass_fields__:
            getattr(self, name).update(getattr(other, name))

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in self.__dataclass_fields__)

    @property
    def names_access(self) -> bool:
        """Whether any access key is set (only then must the access path be resolved)."""
        return any(getattr(self, name) for name in self.__dataclass_fields__ if name.startswith("access_"))


def _ids(rows: Iterable[Mapping[str, Any] | None], column: str) -> set[int]:
    out: set[int] = set()
    for row in rows:
        if not row:
            continue
        value = row.get(column)
        if value is not None and not is_unavailable(value):
            out.add(int(value))
    return out


def _texts(rows: Iterable[Mapping[str, Any] | None], *columns: str) -> set[str]:
    out: set[str] = set()
    for row in rows:
        if not row:
            continue
        for column in columns:
            value = row.get(column)
            if isinstance(value, str) and not is_unavailable(value) and value.strip():
                out.add(value.strip().lower())
    return out


def dirty_keys(event: ChangeEvent | Tombstone) -> DirtyKeys:
    """The keys one event dirties, as its table's `dirty_keys` role says (`ki.table_roles`). Both the old and
    the new row count: a grant moved from project A to project B changes both."""
    keys = DirtyKeys()
    if isinstance(event, Tombstone) or event.table in IGNORED_TABLES:
        return keys  # a tombstone only follows a delete event that was already handled
    role = table_roles.TABLE_ROLES.get(event.table)
    if role is None:
        raise ValueError(f"no projection rule for table {event.table!r}")
    if event.op == "t":
        keys.truncated.add(event.table)  # no row image: which rows went is only known by comparing
        return keys
    if role.inserts_dirty_nothing and event.op in ("c", "r"):
        # A new matter or type node cannot change an existing row: a document that refers to it was
        # inserted or updated afterwards, and that change has its own event. Resolving it anyway would
        # re-project every version of the matter (a whole corpus on a first load) in one batch whose
        # offsets then wait for all of it.
        return keys
    rows = (event.before, event.after)
    for field_name, columns in role.dirty_keys:
        dirty: set[Any] = getattr(keys, field_name)
        if field_name == _PRINCIPAL_KEYS:
            dirty.update(_texts(rows, *columns))
            continue
        for column in columns:
            # The record's key carries the primary key even when neither row image does.
            dirty.update(_ids((*rows, event.key) if column == "id" else rows, column))
    return keys
