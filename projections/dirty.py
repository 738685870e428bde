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

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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


class WrittenWith(NamedTuple):
    """Row `row_id` of `table`, when transaction `tx_id` (PostgreSQL's xid) was the last to write it."""

    table: str
    row_id: int
    tx_id: int


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
    #: The principals lane's inserts (`written_with`): each one's keys, dirty unless the row it points at was
    #: last written by the inserting transaction (`settled`).
    unless_written_with: dict[WrittenWith, DirtyKeys] = field(default_factory=dict)

    def update(self, other: DirtyKeys) -> None:
        self._update_unconditional(other)
        for anchor, keys in other.unless_written_with.items():
            self.unless_written_with.setdefault(anchor, DirtyKeys()).update(keys)

    def _update_unconditional(self, other: DirtyKeys) -> None:
        for name in self.__dataclass_fields__:
            if name != "unless_written_with":
                getattr(self, name).update(getattr(other, name))

    def settled(self, written_with: Collection[WrittenWith]) -> tuple[DirtyKeys, int]:
        """These keys without conditions: each conditional insert's keys kept unless its row is in
        `written_with` (what PostgreSQL says the inserting transaction last wrote); and how many were dropped."""
        keys = DirtyKeys()
        keys._update_unconditional(self)
        dropped = 0
        for anchor, conditional in self.unless_written_with.items():
            if anchor in written_with:
                dropped += 1
            else:
                keys.update(conditional)
        return keys, dropped

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


def written_with(event: ChangeEvent) -> WrittenWith | None:
    """The row an inserted row points at (`ki.table_roles` `points_at`), with the inserting transaction: the
    insert needs no principals-lane work when that transaction also last wrote the row. None for anything but
    an insert that points at exactly one row (a grant names one target) and carries its transaction id."""
    role = table_roles.TABLE_ROLES.get(event.table)
    if role is None or event.op != "c" or event.source.tx_id is None or event.after is None:
        return None
    after = event.after
    targets = [(table, after.get(column)) for column, table in role.points_at]
    ids = [(table, row_id) for table, row_id in targets if isinstance(row_id, int) and not isinstance(row_id, bool)]
    if len(ids) != 1:
        return None
    table, row_id = ids[0]
    return WrittenWith(table, row_id, event.source.tx_id)


def dirty_keys(event: ChangeEvent | Tombstone, *, fast_path: bool = False) -> DirtyKeys:
    """The keys one event dirties, as its table's `dirty_keys` role says (`ki.table_roles`). Both the old and
    the new row count: a grant moved from project A to project B changes both. For a fast-path lane (the
    principals lane, which the access lane backs) an insert's keys are conditional on the row it points at
    (`written_with`): skipping one it needed delays that change to the access lane's pace, never loses it."""
    keys = _dirty_keys(event)
    anchor = written_with(event) if fast_path and isinstance(event, ChangeEvent) and keys else None
    return DirtyKeys(unless_written_with={anchor: keys}) if anchor is not None else keys


def _dirty_keys(event: ChangeEvent | Tombstone) -> DirtyKeys:
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
