"""The reference schema without services: model metadata, the frozen lists of the migration, the offline
SQL the migration renders, and the grants scope CHECK evaluated on an in-memory SQLite."""

from __future__ import annotations

import importlib.util
import io
import itertools
import re
import sqlite3
from types import ModuleType

import pytest
from alembic import command
from sqlalchemy import CheckConstraint, ForeignKeyConstraint
from sqlalchemy.dialects import postgresql

from ki.db import models
from ki.db.migrate import MIGRATIONS_DIR, alembic_config
from ki.settings import load_settings

TABLES = models.Base.metadata.tables


def _load_migration() -> ModuleType:
    path = MIGRATIONS_DIR / "versions" / "0001_reference_schema.py"
    spec = importlib.util.spec_from_file_location("ki_migration_0001", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checks(table: str) -> dict[str, str]:
    return {str(c.name): str(c.sqltext) for c in TABLES[table].constraints if isinstance(c, CheckConstraint)}


def _squash(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


def test_every_captured_table_is_a_model_table() -> None:
    assert set(models.CAPTURED_TABLES) <= set(TABLES)
    assert len(set(models.CAPTURED_TABLES)) == len(models.CAPTURED_TABLES)
    assert models.HEARTBEAT_TABLE in TABLES
    assert models.HEARTBEAT_TABLE not in models.CAPTURED_TABLES
    assert (*models.CAPTURED_TABLES, models.HEARTBEAT_TABLE) == models.PUBLISHED_TABLES


def test_every_model_table_is_captured_or_deliberately_not() -> None:
    # A new table must be classified: captured, or listed here with its reason in docs/schema.md.
    not_captured = {
        "decision_records",
        "relations",
        "ki_search_stats",
        "ki_access_audit",
        "ki_self_eval",
        "ki_dlq_operations",
        models.HEARTBEAT_TABLE,
    }
    assert set(TABLES) == set(models.CAPTURED_TABLES) | not_captured


def test_captured_tables_are_in_dependency_order() -> None:
    position = {name: i for i, name in enumerate(models.CAPTURED_TABLES)}
    for name in models.CAPTURED_TABLES:
        for fk in TABLES[name].foreign_key_constraints:
            referred = fk.referred_table.name
            if fk.use_alter or referred == name or referred not in position:
                continue
            assert position[referred] < position[name], f"{name} is listed before its parent {referred}"


def test_primary_keys_are_bigint_identities() -> None:
    for name, table in TABLES.items():
        if name == models.HEARTBEAT_TABLE:
            continue
        (pk,) = table.primary_key.columns
        assert pk.name == "id"
        assert pk.type.compile(dialect=postgresql.dialect()) == "BIGINT", name
        assert pk.identity is not None, name


def test_timestamps_are_timezone_aware() -> None:
    for table in TABLES.values():
        for column in table.columns:
            if column.name.endswith(("_at", "ts")):
                assert column.type.compile(dialect=postgresql.dialect()) == "TIMESTAMP WITH TIME ZONE", (
                    f"{table.name}.{column.name}"
                )


@pytest.mark.parametrize(
    ("table", "constraint", "values"),
    [
        ("ontology_nodes", "ck_ontology_nodes_kind", models.ONTOLOGY_KINDS),
        ("document_versions", "ck_document_versions_status", models.VERSION_STATUSES),
        ("grants", "ck_grants_scope", models.GRANT_SCOPES),
        ("grants", "ck_grants_effect", models.GRANT_EFFECTS),
        ("relations", "ck_relations_kind", models.RELATION_KINDS),
    ],
)
def test_enum_check_constraints(table: str, constraint: str, values: tuple[str, ...]) -> None:
    checks = _checks(table)
    assert constraint in checks, sorted(checks)
    listed = re.findall(r"'([a-z_]+)'", checks[constraint])
    assert listed == list(values)


def test_other_check_constraints_exist() -> None:
    assert "ck_grants_scope_target" in _checks("grants")
    assert "ck_ontology_nodes_not_own_parent" in _checks("ontology_nodes")
    assert "ck_document_versions_notable_clauses_array" in _checks("document_versions")
    assert "ck_relations_not_self" in _checks("relations")


def test_grants_scope_check_expression() -> None:
    expr = _checks("grants")["ck_grants_scope_target"]
    assert expr == models.grants_scope_check_sql()
    # Evaluate the very expression on SQLite: exactly the matching target, and only it, is accepted.
    db = sqlite3.connect(":memory:")
    db.execute(
        f"CREATE TABLE grants (scope TEXT, project_id INT, document_id INT, source_object_id INT, CHECK ({expr}))"
    )
    accepted = set()
    for scope in (*models.GRANT_SCOPES, "other"):
        for p, d, s in itertools.product((None, 1), repeat=3):
            try:
                db.execute("INSERT INTO grants VALUES (?, ?, ?, ?)", (scope, p, d, s))
            except sqlite3.IntegrityError:
                continue
            accepted.add((scope, p, d, s))
    assert accepted == {
        ("project", 1, None, None),
        ("document", None, 1, None),
        ("source_object", None, None, 1),
    }


def test_latest_final_version_fk_is_deferred_and_scoped_to_the_document() -> None:
    (fk,) = [
        c
        for c in TABLES["documents"].constraints
        if isinstance(c, ForeignKeyConstraint) and c.name == "fk_documents_latest_final_version"
    ]
    assert fk.use_alter and fk.deferrable and fk.initially == "DEFERRED"
    assert [c.name for c in fk.columns] == ["latest_final_version_id", "id"]
    assert [e.target_fullname for e in fk.elements] == [
        "document_versions.id",
        "document_versions.document_id",
    ]


def test_migration_lists_match_the_models() -> None:
    migration = _load_migration()
    assert migration.PUBLISHED == models.PUBLISHED_TABLES
    assert set(migration.REPLICA_IDENTITY_FULL) == models.REPLICA_IDENTITY_FULL
    assert set(models.PUBLISHED_TABLES) >= models.REPLICA_IDENTITY_FULL
    # Large TOASTed text: FULL would copy the whole text into the WAL on every update.
    assert "document_versions" not in models.REPLICA_IDENTITY_FULL
    for access_table in ("grants", "source_observations", "group_memberships", "principal_aliases"):
        assert access_table in models.REPLICA_IDENTITY_FULL


@pytest.fixture(scope="module")
def offline_sql() -> str:
    """The migration rendered as SQL (alembic --sql), no database involved."""
    settings = load_settings(environ={})
    cfg = alembic_config(settings, publication_name="unit_pub")
    buf = io.StringIO()
    cfg.output_buffer = buf
    command.upgrade(cfg, "head", sql=True)
    return _squash(buf.getvalue())


def test_offline_sql_creates_the_publication_for_exactly_the_published_tables(offline_sql: str) -> None:
    tables = ", ".join(models.PUBLISHED_TABLES)
    assert f"ALTER PUBLICATION unit_pub SET TABLE {tables};" in offline_sql
    assert f"CREATE PUBLICATION unit_pub FOR TABLE {tables};" in offline_sql


def test_offline_sql_sets_replica_identity_full_only_where_documented(offline_sql: str) -> None:
    full = set(re.findall(r"ALTER TABLE (\w+) REPLICA IDENTITY FULL", offline_sql))
    assert full == models.REPLICA_IDENTITY_FULL


def test_offline_sql_has_the_grants_scope_check(offline_sql: str) -> None:
    assert f"CONSTRAINT ck_grants_scope_target CHECK ({models.grants_scope_check_sql()})" in offline_sql


def test_offline_sql_rejects_an_unsafe_publication_name() -> None:
    cfg = alembic_config(load_settings(environ={}), publication_name="x; DROP TABLE grants")
    cfg.output_buffer = io.StringIO()
    with pytest.raises(ValueError, match="invalid publication name"):
        command.upgrade(cfg, "head", sql=True)


def test_offline_sql_uses_exactly_the_model_constraint_and_index_names(offline_sql: str) -> None:
    rendered: set[str] = set()
    # In order: a name dropped by a later revision is gone unless created again after (0004, 0007 rebuild).
    for m in re.finditer(r"(DROP (?:INDEX|CONSTRAINT)|CONSTRAINT|CREATE (?:UNIQUE )?INDEX) (\w+)", offline_sql):
        (rendered.discard if m.group(1).startswith("DROP") else rendered.add)(m.group(2))
    rendered.discard("alembic_version_pkc")
    expected = {str(c.name) for t in TABLES.values() for c in t.constraints}
    expected |= {str(i.name) for t in TABLES.values() for i in t.indexes}
    assert rendered == expected
