"""The one registry of table roles: every table Debezium captures, declared once with what its changes do.

Each role used to be a list of its own in the module that acts on it, and a table added to one list but
forgotten in another failed silently (a new ACL table missing from the scope tables would leave the scope
cache stale: a security bug). Now those lists are derived from `CAPTURED` below:

* `CAPTURED_TABLES`, `PUBLISHED_TABLES` (the publication, the connector's include list, the access lane's
  topics) and `REPLICA_IDENTITY_FULL` (re-exported by `ki.db.models`; the migration keeps its frozen copy,
  compared with these by `tests/unit/ki/test_table_roles.py`);
* the sync path: `CONTENT_TABLES` (the content lane's topics, `projections.dirty`, `streams.topics`) and
  `ACCESS_TABLES`;
* the dirty keys each event names (`projections.dirty.dirty_keys`);
* `SCOPE_TABLES`, the tables whose changes can change who sees what: the invalidation feed's topics
  (`search.access.invalidation`), the scope cache's rules (`search.access.scope_cache`) and the name
  cache's (`search.names.cache`).

Pure data, no imports beyond the standard library: every layer may import it. Why each table has the
replica identity it has: docs/schema.md, "Replica identity".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

ReplicaIdentity = Literal["full", "default"]
SyncPath = Literal["content", "access"]
ScopeEffect = Literal["every_change", "column_change", "grantee_scopes", "caller_resolutions"]


@dataclass(frozen=True)
class ScopeRole:
    """How a change of the table can change who sees what (`search.access.scope_cache.invalidation_for`).

    * `every_change`: every row event can change anybody's scope (drops every scope);
    * `column_change`: a row appearing or going, or one of `columns` changing, drops every scope (other
      columns, e.g. a title, leave the same documents visible);
    * `grantee_scopes`: drops the scopes of the principals named in `columns`;
    * `caller_resolutions`: drops the resolved callers (aliases, groups) of the principals named in `columns`.
    """

    effect: ScopeEffect
    columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class CapturedTable:
    """One captured table and its roles.

    `sync_path`: "content" when a change can alter an embedded string (text, title, type label, matter), so the
    content lane reads it too; "access" when it only rewrites the principal projection (access lane only).
    `dirty_keys`: which `projections.dirty.DirtyKeys` field each event fills, from which columns of its old and
    new rows (`id`, the primary key, is also read from the record's key, which carries it even when neither row
    image does). `inserts_dirty_nothing`: a new row cannot change any existing index row (whatever refers to
    it is written afterwards, with an event of its own). `scope`: None when no change of it alters who sees
    what. `points_at`: (column, table) pairs naming the row an inserted row attaches to (itself for `id`). An
    insert made by the transaction that also last wrote that row is the principals lane's to skip
    (`projections.dirty.written_with`): when the row is new, every link from it to a version was written by that
    transaction or later, with an event of its own; when the transaction changed the row,
    that change's own event re-projects every version it reaches (in the access lane for a document or a
    version, which are content tables)."""

    name: str
    replica_identity: ReplicaIdentity
    sync_path: SyncPath
    dirty_keys: tuple[tuple[str, tuple[str, ...]], ...]
    scope: ScopeRole | None
    inserts_dirty_nothing: bool = False
    points_at: tuple[tuple[str, str], ...] = ()


#: Every captured table, parents before children (the publication's order).
CAPTURED: tuple[CapturedTable, ...] = (
    CapturedTable(
        "projects", replica_identity="default", sync_path="access",
        dirty_keys=(("access_projects", ("id",)),),
        scope=ScopeRole("every_change"),
        points_at=(("id", "projects"),),
    ),
    CapturedTable(
        "matters", replica_identity="full", sync_path="content",
        dirty_keys=(("content_matters", ("id",)),),
        scope=None,
        inserts_dirty_nothing=True,
    ),
    CapturedTable(
        "ontology_nodes", replica_identity="full", sync_path="content",
        dirty_keys=(("content_ontology_nodes", ("id",)),),
        scope=None,
        inserts_dirty_nothing=True,
    ),
    CapturedTable(
        "sources", replica_identity="full", sync_path="access",
        dirty_keys=(("access_sources", ("id",)),),
        scope=ScopeRole("every_change"),
        points_at=(("id", "sources"),),
    ),
    CapturedTable(
        "source_objects", replica_identity="full", sync_path="access",
        dirty_keys=(("access_source_objects", ("id",)),),
        scope=ScopeRole("every_change"),
        points_at=(("id", "source_objects"),),
    ),
    CapturedTable(
        # Who is in the group changed: every version granted to the group (or a group containing it).
        "group_memberships", replica_identity="full", sync_path="access",
        dirty_keys=(("access_principals", ("group_principal", "member_principal")),),
        scope=ScopeRole("caller_resolutions", ("group_principal", "member_principal")),
    ),
    CapturedTable(
        "principal_aliases", replica_identity="full", sync_path="access",
        dirty_keys=(("access_principals", ("alias", "principal")),),
        scope=ScopeRole("caller_resolutions", ("alias", "principal")),
    ),
    CapturedTable(
        "documents", replica_identity="full", sync_path="content",
        dirty_keys=(("content_documents", ("id",)),),
        scope=ScopeRole("column_change", ("deleted_at", "project_id")),
    ),
    CapturedTable(
        # DEFAULT: FULL would write the whole (TOASTed) text into the WAL on every update.
        "document_versions", replica_identity="default", sync_path="content",
        dirty_keys=(("content_versions", ("id",)),),
        scope=ScopeRole("column_change", ("document_id",)),
    ),
    CapturedTable(
        "source_observations", replica_identity="full", sync_path="access",
        dirty_keys=(("access_versions", ("document_version_id",)),),
        scope=ScopeRole("every_change"),
        points_at=(("document_version_id", "document_versions"),),
    ),
    CapturedTable(
        # Old and new target both: a grant moved from project A to project B changes both.
        "grants", replica_identity="full", sync_path="access",
        dirty_keys=(
            ("access_projects", ("project_id",)),
            ("access_documents", ("document_id",)),
            ("access_source_objects", ("source_object_id",)),
        ),
        scope=ScopeRole("grantee_scopes", ("principal",)),
        points_at=(("project_id", "projects"), ("document_id", "documents"), ("source_object_id", "source_objects")),
    ),
)  # fmt: skip

#: Each captured table's roles by name.
TABLE_ROLES: Mapping[str, CapturedTable] = MappingProxyType({table.name: table for table in CAPTURED})

#: Tables streamed by Debezium, parents before children.
CAPTURED_TABLES: tuple[str, ...] = tuple(table.name for table in CAPTURED)

#: Written by Debezium's `heartbeat.action.query` so the replication slot advances on an idle database.
#: It is in the publication (a heartbeat that touches no published table would not move the slot) but
#: not captured: its topic carries no domain data (DEFAULT identity).
HEARTBEAT_TABLE = "debezium_heartbeat"

#: Every table in the publication.
PUBLISHED_TABLES: tuple[str, ...] = (*CAPTURED_TABLES, HEARTBEAT_TABLE)

#: Tables with REPLICA IDENTITY FULL: Debezium carries the complete old row ("before") on update and delete.
REPLICA_IDENTITY_FULL: frozenset[str] = frozenset(t.name for t in CAPTURED if t.replica_identity == "full")

#: Tables whose changes can alter an embedded string (text, title, type label, matter): the content lane's.
CONTENT_TABLES: tuple[str, ...] = tuple(t.name for t in CAPTURED if t.sync_path == "content")

#: Tables whose changes only rewrite the principal projection (the access-only path, nothing embedded).
ACCESS_TABLES: tuple[str, ...] = tuple(t.name for t in CAPTURED if t.sync_path == "access")

#: Tables whose changes can alter a caller's scope or resolution: what the invalidation feed follows.
SCOPE_TABLES: tuple[str, ...] = tuple(t.name for t in CAPTURED if t.scope is not None)


def scope_tables(effect: ScopeEffect) -> dict[str, tuple[str, ...]]:
    """The tables whose scope role has `effect`, each with its role's columns."""
    return {t.name: t.scope.columns for t in CAPTURED if t.scope is not None and t.scope.effect == effect}
