"""The reference schema against the real PostgreSQL of the local stack.

Each test migrates its own throw-away database on the stack's server (never the stack's `ki` database,
whose publication a running Debezium connector depends on), so the stack's role needs CREATEDB.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from apps.dev.checkout import REPO_ROOT
from ki.clients import make_engine
from ki.db import models
from ki.db.migrate import current_revision, downgrade, upgrade
from ki.settings import Settings, with_overrides
from tests.conftest import wait_for

pytestmark = pytest.mark.stack

PUBLICATION = "ki_schema_test_pub"


@pytest.fixture()
def db_settings(settings: Settings) -> Iterator[Settings]:
    """Settings pointing at a fresh, empty database on the stack's server; dropped afterwards."""
    name = f"ki_schema_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(settings.database.dsn, autocommit=True) as admin:
        try:
            admin.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege:
            pytest.fail(f"role {settings.database.user!r} needs CREATEDB to run the schema tests")
    try:
        yield with_overrides(settings, {"database": {"name": name}})
    finally:
        wait_for(lambda: _dropped(settings, name), timeout=60, what=f"database {name} dropped")


def _dropped(settings: Settings, name: str) -> bool:
    """Drop the scratch database; False while an autovacuum worker (the superuser's, which our role may not
    terminate) is still in it -- it leaves on its own within moments."""
    with psycopg.connect(settings.database.dsn, autocommit=True) as admin:
        try:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.errors.InsufficientPrivilege:
            return False
    return True


@pytest.fixture()
def engine(db_settings: Settings) -> Iterator[Engine]:
    upgrade(db_settings, publication_name=PUBLICATION)
    eng = make_engine(db_settings, pooled=False)
    try:
        yield eng
    finally:
        eng.dispose()


def _publication_tables(conn: Connection, name: str = PUBLICATION) -> set[str]:
    rows = conn.execute(
        text("SELECT tablename FROM pg_publication_tables WHERE pubname = :n AND schemaname = 'public'"),
        {"n": name},
    )
    return {r.tablename for r in rows}


def _user_tables(conn: Connection) -> set[str]:
    rows = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
    return {r.tablename for r in rows}


def _seed_document(conn: Connection) -> tuple[int, int]:
    project_id = conn.execute(text("INSERT INTO projects (name) VALUES ('P') RETURNING id")).scalar_one()
    document_id = conn.execute(
        text("INSERT INTO documents (project_id, title) VALUES (:p, 'Vertrag') RETURNING id"),
        {"p": project_id},
    ).scalar_one()
    return project_id, document_id


def _seed_source_object(conn: Connection) -> int:
    source_id = conn.execute(
        text("INSERT INTO sources (kind, name) VALUES ('sharepoint', 'SP') RETURNING id")
    ).scalar_one()
    return conn.execute(
        text("INSERT INTO source_objects (source_id, external_ref) VALUES (:s, :ref) RETURNING id"),
        {"s": source_id, "ref": uuid.uuid4().hex},
    ).scalar_one()


# ---------------------------------------------------------------------------------------------- migrate


def test_ki_migrate_goes_up_and_down_to_a_revision(db_settings: Settings) -> None:
    env = {**os.environ, "KI_DATABASE__NAME": db_settings.database.name}

    def ki_migrate(*args: str) -> str:
        argv = [sys.executable, "-m", "apps.cli", "migrate", *args]
        done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    assert ki_migrate() == "schema: empty -> 0014"
    assert ki_migrate("--down-to", "0003") == "schema: 0014 -> 0003"
    assert current_revision(db_settings) == "0003"
    assert ki_migrate() == "schema: 0003 -> 0014"
    assert ki_migrate() == "schema: already at 0014"


def test_upgrade_from_empty_builds_what_the_models_describe(db_settings: Settings) -> None:
    assert current_revision(db_settings) is None
    upgrade(db_settings, publication_name=PUBLICATION)
    assert current_revision(db_settings) == "0014"
    eng = make_engine(db_settings, pooled=False)
    try:
        with eng.connect() as conn:
            assert _user_tables(conn) == set(models.Base.metadata.tables) | {"alembic_version"}
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            assert compare_metadata(ctx, models.Base.metadata) == []
    finally:
        eng.dispose()


def test_publication_contains_exactly_the_published_tables(engine: Engine) -> None:
    with engine.connect() as conn:
        assert _publication_tables(conn) == set(models.PUBLISHED_TABLES)
        assert models.HEARTBEAT_TABLE in _publication_tables(conn)
        ops = conn.execute(
            text("SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = :n"),
            {"n": PUBLICATION},
        ).one()
        assert tuple(ops) == (True, True, True)


def test_replica_identity_per_table(engine: Engine) -> None:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.relname, c.relreplident FROM pg_class c "
                "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'"
            )
        )
        identity = {r.relname: r.relreplident for r in rows}
    expected = {t: ("f" if t in models.REPLICA_IDENTITY_FULL else "d") for t in models.Base.metadata.tables}
    assert {t: identity[t] for t in expected} == expected
    assert identity["document_versions"] == "d"
    assert identity["grants"] == "f"


def test_upgrade_resets_a_preexisting_publication(db_settings: Settings) -> None:
    with psycopg.connect(db_settings.database.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {PUBLICATION}")  # empty, as an operator might have left it
    upgrade(db_settings, publication_name=PUBLICATION)
    eng = make_engine(db_settings, pooled=False)
    try:
        with eng.connect() as conn:
            assert _publication_tables(conn) == set(models.PUBLISHED_TABLES)
    finally:
        eng.dispose()


def test_publication_name_defaults_to_the_settings(db_settings: Settings) -> None:
    upgrade(db_settings)
    eng = make_engine(db_settings, pooled=False)
    try:
        with eng.connect() as conn:
            assert _publication_tables(conn, db_settings.connect.publication_name) == set(models.PUBLISHED_TABLES)
    finally:
        eng.dispose()


def test_downgrade_to_base_and_upgrade_again(engine: Engine, db_settings: Settings) -> None:
    downgrade(db_settings, "base", publication_name=PUBLICATION)
    with engine.connect() as conn:
        assert _user_tables(conn) == {"alembic_version"}
        assert conn.execute(text("SELECT count(*) FROM pg_publication")).scalar_one() == 0
        functions = conn.execute(
            text("SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
        ).scalar_one()
        assert functions == 0
    assert current_revision(db_settings) is None

    upgrade(db_settings, publication_name=PUBLICATION)
    assert current_revision(db_settings) == "0014"
    with engine.connect() as conn:
        assert _publication_tables(conn) == set(models.PUBLISHED_TABLES)


# ---------------------------------------------------------------------------------------------- grants


@pytest.mark.parametrize(
    ("scope", "columns"),
    [
        ("document", {"project_id"}),  # scope names one target, a different one is set
        ("project", {"project_id", "document_id"}),  # the right target plus another
        ("document", {"document_id", "source_object_id"}),
        ("source_object", {"source_object_id", "project_id"}),
        ("project", set()),  # none
        ("everyone", {"project_id"}),  # unknown scope
    ],
)
def test_grants_check_rejects_a_wrong_target(engine: Engine, scope: str, columns: set[str]) -> None:
    with engine.begin() as conn:
        project_id, document_id = _seed_document(conn)
        source_object_id = _seed_source_object(conn)
    ids = {"project_id": project_id, "document_id": document_id, "source_object_id": source_object_id}
    values = {c: (ids[c] if c in columns else None) for c in ids}
    with pytest.raises(IntegrityError) as err, engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO grants (scope, project_id, document_id, source_object_id, principal, effect) "
                "VALUES (:scope, :project_id, :document_id, :source_object_id, 'user:a', 'allow')"
            ),
            {"scope": scope, **values},
        )
    assert isinstance(err.value.orig, psycopg.errors.CheckViolation)
    assert err.value.orig.diag.constraint_name in {"ck_grants_scope_target", "ck_grants_scope"}


def test_grants_check_accepts_the_matching_target(engine: Engine) -> None:
    with engine.begin() as conn:
        project_id, document_id = _seed_document(conn)
        conn.execute(
            text(
                "INSERT INTO grants (scope, project_id, principal, effect) VALUES"
                " ('project', :p, 'group:x', 'allow'), ('project', :p, 'user:b', 'deny')"
            ),
            {"p": project_id},
        )
        conn.execute(
            text(
                "INSERT INTO grants (scope, document_id, principal, effect) VALUES ('document', :d, 'user:a', 'allow')"
            ),
            {"d": document_id},
        )
        conn.execute(
            text(
                "INSERT INTO grants (scope, source_object_id, principal, effect)"
                " VALUES ('source_object', :s, 'group:sp-legal', 'allow')"
            ),
            {"s": _seed_source_object(conn)},
        )
        assert conn.execute(text("SELECT count(*) FROM grants")).scalar_one() == 4


# ---------------------------------------------------------------------------------------------- ontology


def _tree(conn: Connection) -> tuple[int, int, int]:
    def node(key: str, parent: int | None, kind: str = "doc_type") -> int:
        return conn.execute(
            text("INSERT INTO ontology_nodes (kind, key, label, parent_id) VALUES (:k, :key, :key, :p) RETURNING id"),
            {"k": kind, "key": key, "p": parent},
        ).scalar_one()

    root = node("vertrag", None)
    mid = node("vertrag.kauf", root)
    leaf = node("vertrag.kauf.grundstueck", mid)
    return root, mid, leaf


def test_ancestors_return_the_closure_of_a_three_level_tree(engine: Engine) -> None:
    with engine.begin() as conn:
        root, mid, leaf = _tree(conn)
        sibling = conn.execute(
            text(
                "INSERT INTO ontology_nodes (kind, key, label, parent_id)"
                " VALUES ('doc_type', 'x', 'x', :p) RETURNING id"
            ),
            {"p": root},
        ).scalar_one()

        via_sql = conn.execute(text("SELECT id, depth FROM ontology_ancestors(:n) ORDER BY depth"), {"n": leaf})
        assert [tuple(r) for r in via_sql] == [(leaf, 0), (mid, 1), (root, 2)]
        assert [tuple(r) for r in conn.execute(text("SELECT id, depth FROM ontology_ancestors(:n)"), {"n": root})] == [
            (root, 0)
        ]
        assert conn.execute(text("SELECT count(*) FROM ontology_ancestors(-1)")).scalar_one() == 0

        subtree = conn.execute(text("SELECT id FROM ontology_descendants(:n)"), {"n": mid}).scalars().all()
        assert sorted(subtree) == sorted([mid, leaf])
        assert sibling not in subtree


def test_ontology_tree_guard_rejects_cycles_and_mixed_kinds(engine: Engine) -> None:
    with engine.begin() as conn:
        root, _mid, leaf = _tree(conn)
    with pytest.raises(IntegrityError, match="under itself or its descendant"), engine.begin() as conn:
        conn.execute(text("UPDATE ontology_nodes SET parent_id = :leaf WHERE id = :root"), {"leaf": leaf, "root": root})
    with pytest.raises(IntegrityError, match="under itself"), engine.begin() as conn:
        conn.execute(text("UPDATE ontology_nodes SET parent_id = id WHERE id = :root"), {"root": root})
    with pytest.raises(IntegrityError, match="ck_ontology_nodes_not_own_parent"), engine.begin() as conn:
        conn.execute(
            text("INSERT INTO ontology_nodes (id, kind, key, label, parent_id) VALUES (999, 'doc_type', 's', 's', 999)")
        )
    with pytest.raises(IntegrityError, match="cannot have parent"), engine.begin() as conn:
        conn.execute(
            text("INSERT INTO ontology_nodes (kind, key, label, parent_id) VALUES ('clause_type', 'c', 'c', :p)"),
            {"p": root},
        )


# ---------------------------------------------------------------------------------------------- documents


def test_updated_at_trigger_touches_documents_and_versions(engine: Engine) -> None:
    with engine.begin() as conn:
        _project_id, document_id = _seed_document(conn)
        conn.execute(
            text("INSERT INTO document_versions (document_id, version_no, status) VALUES (:d, 1, 'draft')"),
            {"d": document_id},
        )
    with engine.begin() as conn:  # a later transaction: now() is later
        conn.execute(text("UPDATE documents SET title = 'Vertrag v2' WHERE id = :d"), {"d": document_id})
        conn.execute(text("UPDATE document_versions SET status = 'final' WHERE document_id = :d"), {"d": document_id})
    with engine.connect() as conn:
        for table, key in (("documents", "id"), ("document_versions", "document_id")):
            created, updated = conn.execute(
                text(f"SELECT created_at, updated_at FROM {table} WHERE {key} = :d"), {"d": document_id}
            ).one()
            assert updated > created, table


def test_version_defaults(engine: Engine) -> None:
    with engine.begin() as conn:
        _project_id, document_id = _seed_document(conn)
        row = conn.execute(
            text(
                "INSERT INTO document_versions (document_id, version_no, status) VALUES (:d, 1, 'draft') "
                "RETURNING language, text, notable_clauses"
            ),
            {"d": document_id},
        ).one()
        assert tuple(row) == ("de", "", [])
        identifiers = conn.execute(text("SELECT identifiers FROM documents WHERE id = :d"), {"d": document_id})
        assert identifiers.scalar_one() == []


def test_latest_final_version_must_belong_to_the_document(engine: Engine) -> None:
    with engine.begin() as conn:
        _p, doc_a = _seed_document(conn)
        _p, doc_b = _seed_document(conn)
        version_b = conn.execute(
            text(
                "INSERT INTO document_versions (document_id, version_no, status) VALUES (:d, 1, 'final') RETURNING id"
            ),
            {"d": doc_b},
        ).scalar_one()
    # Deferred: the violating UPDATE itself succeeds, the commit fails.
    with pytest.raises(IntegrityError, match="fk_documents_latest_final_version"), engine.begin() as conn:
        conn.execute(
            text("UPDATE documents SET latest_final_version_id = :v WHERE id = :d"),
            {"v": version_b, "d": doc_a},
        )

    # Pointer first, version second, same transaction: fine because the check waits for the commit.
    with engine.begin() as conn:
        conn.execute(text("UPDATE documents SET latest_final_version_id = 4242 WHERE id = :d"), {"d": doc_a})
        conn.execute(
            text("INSERT INTO document_versions (id, document_id, version_no, status) VALUES (4242, :d, 1, 'final')"),
            {"d": doc_a},
        )
    # Deleting the document takes its versions along, pointer and all.
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM documents WHERE id = :d"), {"d": doc_a})
        assert conn.execute(text("SELECT count(*) FROM document_versions WHERE id = 4242")).scalar_one() == 0


def test_group_membership_uniqueness_covers_local_memberships(engine: Engine) -> None:
    insert = text(
        "INSERT INTO group_memberships (source_id, group_principal, member_principal)"
        " VALUES (NULL, 'group:g', 'user:u')"
    )
    with engine.begin() as conn:
        conn.execute(insert)
    with (
        pytest.raises(IntegrityError, match="uq_group_memberships_source_group_member"),
        engine.begin() as conn,
    ):
        conn.execute(insert)


# ------------------------------------------------------------------------------------------ principals

PRINCIPAL_COLUMNS = (
    ("grants", "principal"),
    ("group_memberships", "group_principal"),
    ("group_memberships", "member_principal"),
    ("principal_aliases", "alias"),
    ("principal_aliases", "principal"),
)


def _write_principal(conn: Connection, table: str, column: str, value: str) -> None:
    row: dict[str, object]
    if table == "grants":
        project = conn.execute(text("INSERT INTO projects (name) VALUES ('P') RETURNING id")).scalar_one()
        row = {"principal": "user:x", "project_id": project, "scope": "project", "effect": "allow"}
    elif table == "group_memberships":
        row = {"group_principal": "group:x", "member_principal": "user:x"}
    else:
        row = {"alias": "mail:x", "principal": "user:x"}
    row[column] = value
    names = ", ".join(row)
    conn.execute(text(f"INSERT INTO {table} ({names}) VALUES ({', '.join(':' + n for n in row)})"), row)


@pytest.mark.parametrize(("table", "column"), PRINCIPAL_COLUMNS)
@pytest.mark.parametrize("value", ["anna.schmidt@kanzlei-demo.de", "user:", " \t", "sp group:x", "grüppe:x"])
def test_a_principal_without_a_kind_is_rejected(engine: Engine, table: str, column: str, value: str) -> None:
    with pytest.raises(IntegrityError, match=f"ck_{table}_{column}_form"), engine.begin() as conn:
        _write_principal(conn, table, column, value)


@pytest.mark.parametrize(("table", "column"), PRINCIPAL_COLUMNS)
def test_principals_are_stored_as_written_and_indexed_casefolded(engine: Engine, table: str, column: str) -> None:
    with engine.begin() as conn:
        _write_principal(conn, table, column, "\u3000User:Jürgen.STRASSER\t")
        stored = conn.execute(text(f"SELECT {column}, ki_principal({column}) AS canonical FROM {table}")).one()
    assert tuple(stored) == ("\u3000User:Jürgen.STRASSER\t", "user:jürgen.strasser")


# Names that full case folding would merge with another (0007): long s, sharp s, the Kelvin sign, a ligature,
# a decomposed accent.
FOLDING_MERGES = ["user:anna.\u017fchmidt", "user:stra\u00dfe", "user:\u212aatharina", "user:\ufb01nn", "user:e\u0301"]


@pytest.mark.parametrize(("table", "column"), PRINCIPAL_COLUMNS)
@pytest.mark.parametrize("value", FOLDING_MERGES)
def test_a_principal_that_folding_would_merge_is_rejected(engine: Engine, table: str, column: str, value: str) -> None:
    with pytest.raises(IntegrityError, match=f"ck_{table}_{column}_form"), engine.begin() as conn:
        _write_principal(conn, table, column, value)


def test_upgrade_to_0007_touches_the_rows_it_refuses_and_leaves_their_check_not_valid(
    engine: Engine, db_settings: Settings
) -> None:
    """A grant to "user:anna.ſchmidt" written under 0004 was anna.schmidt's; after 0007 it is nobody's, it
    was written again (so CDC sends it and the access lane rewrites its projections) and its check stays
    NOT VALID; rows it does not refuse are untouched."""
    downgrade(db_settings, "0006", publication_name=PUBLICATION)
    with engine.begin() as conn:
        _write_principal(conn, "grants", "principal", "user:anna.\u017fchmidt")
        _write_principal(conn, "grants", "principal", "user:anna.schmidt")
        before = dict(conn.execute(text("SELECT principal, xmin::text FROM grants")).all())
        assert ki_principal(conn, "user:anna.\u017fchmidt") == "user:anna.schmidt"
    upgrade(db_settings, publication_name=PUBLICATION)
    with engine.connect() as conn:
        after = dict(conn.execute(text("SELECT principal, xmin::text FROM grants")).all())
        valid = dict(
            conn.execute(text("SELECT conname, convalidated FROM pg_constraint WHERE conname LIKE 'ck_%_form'")).all()
        )
        assert ki_principal(conn, "user:anna.\u017fchmidt") is None
    assert after["user:anna.schmidt"] == before["user:anna.schmidt"]
    assert after["user:anna.\u017fchmidt"] != before["user:anna.\u017fchmidt"]
    assert valid == {f"ck_{t}_{c}_form": (t, c) != ("grants", "principal") for t, c in PRINCIPAL_COLUMNS}


def test_upgrade_over_stored_values_without_a_kind_leaves_the_check_not_valid(
    engine: Engine, db_settings: Settings
) -> None:
    """Rows written before 0004 are not rejected retroactively: their check stays NOT VALID (new writes are
    checked), the others are validated; the rows match nobody."""
    downgrade(db_settings, "0003", publication_name=PUBLICATION)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO principal_aliases (alias, principal) VALUES ('anna@kanzlei.de', 'user:anna')"))
    upgrade(db_settings, publication_name=PUBLICATION)
    with engine.connect() as conn:
        valid = dict(
            conn.execute(text("SELECT conname, convalidated FROM pg_constraint WHERE conname LIKE 'ck_%_form'")).all()
        )
        assert ki_principal(conn, "anna@kanzlei.de") is None
    assert valid == {f"ck_{t}_{c}_form": (t, c) != ("principal_aliases", "alias") for t, c in PRINCIPAL_COLUMNS}
    with pytest.raises(IntegrityError, match="ck_principal_aliases_alias_form"), engine.begin() as conn:
        conn.execute(text("INSERT INTO principal_aliases (alias, principal) VALUES ('bob@kanzlei.de', 'user:bob')"))


def ki_principal(conn: Connection, value: str) -> str | None:
    return conn.execute(text("SELECT ki_principal(:v)"), {"v": value}).scalar()
