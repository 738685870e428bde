"""The one registry of table roles (ki.table_roles): every captured table has each role it needs, every list
derived from it equals the list the module kept before the registry existed, and the migration's frozen
lists equal it. No services."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
from types import ModuleType
from typing import Any

import pytest

import ki.acl
from ki import table_roles
from ki.db import models
from ki.db.migrate import MIGRATIONS_DIR
from ki.table_roles import CAPTURED, SCOPE_TABLES, CapturedTable
from projections import cdc, dirty
from projections.cdc import ChangeEvent, SourceInfo
from projections.dirty import DirtyKeys, dirty_keys
from search.access import invalidation, scope_cache
from search.access.scope_cache import NOTHING, invalidation_for
from search.names import cache as name_cache
from search.names.keys import NameKey, identity_key

MODEL_TABLES = models.Base.metadata.tables


def _load_migration() -> ModuleType:
    path = MIGRATIONS_DIR / "versions" / "0001_reference_schema.py"
    spec = importlib.util.spec_from_file_location("ki_migration_0001_roles", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _full_row(table: str) -> dict[str, Any]:
    """Every column of the table with a value: ids 7, texts a well-formed principal, the rest None."""
    row: dict[str, Any] = {}
    for column in MODEL_TABLES[table].columns:
        try:
            python_type = column.type.python_type
        except NotImplementedError:
            python_type = object
        row[column.name] = 7 if python_type is int else "user:x" if python_type is str else None
    return row


def _event(table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> ChangeEvent:
    return ChangeEvent(f"ki.public.{table}", table, op, {"id": 7}, before, after, SourceInfo(1, 1, False))  # type: ignore[arg-type]


# --- behaviour unchanged: the derived lists equal the literal lists they replaced ------------------------


def test_the_derived_lists_equal_the_lists_they_replaced() -> None:
    captured = (
        "projects", "matters", "ontology_nodes", "sources", "source_objects", "group_memberships",
        "principal_aliases", "documents", "document_versions", "source_observations", "grants",
    )  # fmt: skip
    content = {"documents", "document_versions", "matters", "ontology_nodes"}
    access = set(captured) - content
    derived = {
        "models.CAPTURED_TABLES": models.CAPTURED_TABLES,  # the order too: parents first, the publication's
        "models.PUBLISHED_TABLES": models.PUBLISHED_TABLES,
        "models.HEARTBEAT_TABLE": models.HEARTBEAT_TABLE,
        "models.REPLICA_IDENTITY_FULL": models.REPLICA_IDENTITY_FULL,
        "dirty.CONTENT_TABLES": sorted(dirty.CONTENT_TABLES),
        "dirty.IGNORED_TABLES": dirty.IGNORED_TABLES,
        "table_roles.ACCESS_TABLES": set(table_roles.ACCESS_TABLES),
        "cdc.KNOWN_TABLES": cdc.KNOWN_TABLES,
        "invalidation.SCOPE_TABLES": set(invalidation.SCOPE_TABLES),
        "scope_cache._DATA_TABLES": scope_cache._DATA_TABLES,
        "scope_cache._SCOPE_COLUMNS": scope_cache._SCOPE_COLUMNS,
        "scope_cache._PRINCIPAL_COLUMNS": scope_cache._PRINCIPAL_COLUMNS,
        "scope_cache._GRANT_COLUMNS": set(scope_cache._GRANT_COLUMNS),  # the only one naming scopes, not callers
        "name_cache._VISIBILITY_TABLES": name_cache._VISIBILITY_TABLES,
    }
    before = {
        "models.CAPTURED_TABLES": captured,
        "models.PUBLISHED_TABLES": (*captured, "debezium_heartbeat"),
        "models.HEARTBEAT_TABLE": "debezium_heartbeat",
        "models.REPLICA_IDENTITY_FULL": set(captured) - {"projects", "document_versions"},
        "dirty.CONTENT_TABLES": sorted(content),
        "dirty.IGNORED_TABLES": {"decision_records", "relations", "debezium_heartbeat"},
        "table_roles.ACCESS_TABLES": {"projects", "sources", "source_objects", "source_observations", "grants",
                                      "group_memberships", "principal_aliases"},
        "cdc.KNOWN_TABLES": content | access,
        "invalidation.SCOPE_TABLES": set(captured) - {"matters", "ontology_nodes"},
        "scope_cache._DATA_TABLES": {"source_observations", "source_objects", "sources", "projects"},
        "scope_cache._SCOPE_COLUMNS": {"documents": ("deleted_at", "project_id"),
                                       "document_versions": ("document_id",)},
        "scope_cache._PRINCIPAL_COLUMNS": {
            "grants": ("principal",),
            "group_memberships": ("group_principal", "member_principal"),
            "principal_aliases": ("alias", "principal"),
        },
        "scope_cache._GRANT_COLUMNS": {"grants"},
        "name_cache._VISIBILITY_TABLES": {"document_versions", "source_observations", "source_objects", "sources",
                                          "projects", "grants", "group_memberships", "principal_aliases"},
    }  # fmt: skip
    assert derived == before


def test_the_migration_keeps_the_registry_s_publication_and_replica_identities() -> None:
    # The migration's lists are frozen on purpose (it must build the same database forever); a captured table
    # added to the registry needs a new migration that changes the publication and identities the same way.
    migration = _load_migration()
    assert migration.PUBLISHED == table_roles.PUBLISHED_TABLES
    assert set(migration.REPLICA_IDENTITY_FULL) == table_roles.REPLICA_IDENTITY_FULL


# --- every captured table has each role it needs ------------------------------------------------------------


def test_every_captured_table_is_declared_once_and_is_a_model_table() -> None:
    names = [table.name for table in CAPTURED]
    assert len(names) == len(set(names))
    assert set(names) <= set(MODEL_TABLES)
    assert table_roles.HEARTBEAT_TABLE in MODEL_TABLES and table_roles.HEARTBEAT_TABLE not in names
    assert dict(table_roles.TABLE_ROLES) == {table.name: table for table in CAPTURED}
    assert set(table_roles.CONTENT_TABLES) | set(table_roles.ACCESS_TABLES) == set(names)
    assert set(table_roles.CONTENT_TABLES).isdisjoint(table_roles.ACCESS_TABLES)


@pytest.mark.parametrize("table", CAPTURED, ids=lambda t: t.name)
def test_every_column_a_role_reads_is_a_column_of_its_table(table: CapturedTable) -> None:
    columns = set(MODEL_TABLES[table.name].columns.keys())
    assert {c for _, read in table.dirty_keys for c in read} <= columns
    if table.scope is not None:
        assert set(table.scope.columns) <= columns
        # Only a rule on columns reads columns; it cannot work without any.
        assert bool(table.scope.columns) == (table.scope.effect != "every_change")
    for column, pointed_at in table.points_at:
        # A column of the table naming a row of a captured table by its id (a foreign key to it, or the row itself).
        assert column in columns and pointed_at in table_roles.TABLE_ROLES
        targets = {fk.column.table.name for fk in MODEL_TABLES[table.name].columns[column].foreign_keys}
        assert targets == {pointed_at} if column != "id" else pointed_at == table.name
    # Only the access tables' inserts are the principals lane's to skip (it reads no content table).
    assert not table.points_at or table.sync_path == "access"


@pytest.mark.parametrize("table", CAPTURED, ids=lambda t: t.name)
def test_every_captured_table_names_dirty_keys_of_its_own_sync_path(table: CapturedTable) -> None:
    fields = {f.name for f in dataclasses.fields(DirtyKeys)}
    assert table.dirty_keys, f"{table.name} names no dirty keys: its changes would never reach the index"
    for field_name, _ in table.dirty_keys:
        assert field_name in fields
        # A content table's change must take the content path (it may re-embed); an access table's must not.
        assert field_name.startswith(f"{table.sync_path}_")


def test_every_dirty_key_is_named_by_some_table() -> None:
    named = {field_name for table in CAPTURED for field_name, _ in table.dirty_keys}
    # `truncated` is named by a truncate of any table (no row image), not by a column; `unless_written_with` holds
    # other keys, on a condition (an insert's, in the principals lane).
    assert named == {f.name for f in dataclasses.fields(DirtyKeys)} - {"truncated", "unless_written_with"}


@pytest.mark.parametrize("table", CAPTURED, ids=lambda t: t.name)
def test_every_captured_table_s_change_dirties_the_keys_it_declares(table: CapturedTable) -> None:
    row = _full_row(table.name)
    keys = dirty_keys(_event(table.name, "u", row, row))
    filled = {f.name for f in dataclasses.fields(DirtyKeys) if getattr(keys, f.name)}
    assert filled == {field_name for field_name, _ in table.dirty_keys}
    inserted = dirty_keys(_event(table.name, "c", None, row))
    assert bool(inserted) != table.inserts_dirty_nothing


@pytest.mark.parametrize("table", CAPTURED, ids=lambda t: t.name)
def test_a_table_decides_scope_exactly_when_it_has_a_scope_role(table: CapturedTable) -> None:
    deleted = invalidation_for(_event(table.name, "d", _full_row(table.name), None))
    if table.scope is None:
        assert deleted == NOTHING
    else:
        assert not deleted.empty, f"deleting a {table.name} row invalidates no scope"
        assert table.name in invalidation.SCOPE_TABLES  # so the feed follows its topic


@pytest.mark.parametrize("table", CAPTURED, ids=lambda t: t.name)
def test_the_name_cache_goes_stale_on_every_table_that_decides_visibility(table: CapturedTable) -> None:
    if table.name == "documents":
        return  # invalidates by name: tests/unit/search/names/test_name_cache.py
    cache = name_cache.NameCache(max_keys=10, max_documents=10)
    key: NameKey = ("title", identity_key("Mietvertrag"))
    assert cache.put(("user:x",), {key: ()}, cache.generation)
    row = _full_row(table.name)
    cache.on_change(_event(table.name, "u", row, row))
    stale = cache.get(("user:x",), [key], max_stale_s=60)[2]
    assert stale == ([key] if table.scope is not None else [])


def test_the_name_cache_reads_only_tables_the_invalidation_feed_follows() -> None:
    assert name_cache._VISIBILITY_TABLES | {"documents"} <= set(SCOPE_TABLES)


def test_every_table_the_acl_statements_read_decides_scope() -> None:
    """A table the one ACL semantics reads (ki.acl) decides who sees what: its changes must invalidate the
    scope cache, or a scope would stay stale (a revocation unseen). `relations` only picks the neighbours a
    request asks for; each is then checked like any other document."""
    read = set(re.findall(r"\b(?:FROM|JOIN)\s+([a-z_]+)", inspect.getsource(ki.acl))) & set(MODEL_TABLES)
    assert {"grants", "group_memberships", "principal_aliases", "source_observations", "documents"} <= read
    assert read - {"relations"} <= set(SCOPE_TABLES)
    assert read - {"relations"} <= set(table_roles.CAPTURED_TABLES)


@pytest.mark.parametrize("table", CAPTURED, ids=lambda t: t.name)
def test_a_table_whose_old_row_names_what_it_loses_has_replica_identity_full(table: CapturedTable) -> None:
    """With DEFAULT, an update or delete carries no old row (a delete only the key): a grant moved or revoked
    would not name its old target or principal, and the index and the scope cache would keep them."""
    reads_old_columns = any(c != "id" for _, read in table.dirty_keys for c in read)
    names_principals = table.scope is not None and table.scope.effect in ("grantee_scopes", "caller_resolutions")
    if reads_old_columns or names_principals:
        assert table.replica_identity == "full"
