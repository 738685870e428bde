"""Reference schema of the structured layer, its CDC publication and replica identities.

Revision ID: 0001
Revises:
Create Date: 2025-11-29

Hand-written. The table lists below are frozen for this revision on purpose (a later revision that adds a
captured table changes the publication itself); `ki.db.models` must agree with what this builds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# In the publication (the Debezium-captured tables plus the heartbeat table), parents first.
PUBLISHED = (
    "projects",
    "matters",
    "ontology_nodes",
    "sources",
    "source_objects",
    "group_memberships",
    "principal_aliases",
    "documents",
    "document_versions",
    "source_observations",
    "grants",
    "debezium_heartbeat",
)

# REPLICA IDENTITY FULL: the old row travels with updates and deletes. Reasons per table: docs/schema.md.
# All other published tables keep DEFAULT (primary key).
REPLICA_IDENTITY_FULL = (
    "matters",
    "ontology_nodes",
    "sources",
    "source_objects",
    "group_memberships",
    "principal_aliases",
    "documents",
    "source_observations",
    "grants",
)


def _pk() -> sa.Column:
    return sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True)


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def _updated_at() -> sa.Column:
    return sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def _check(sqltext: str, name: str) -> sa.CheckConstraint:
    # op.f(): the name is final. Without it the models' naming convention (alembic passes the target
    # metadata's convention to create_table) would prefix "ck_<table>_" a second time.
    return sa.CheckConstraint(sqltext, name=op.f(name))


def _fk(table: str, column: str, target: str, ondelete: str, *, nullable: bool, name: str | None = None) -> sa.Column:
    """A bigint FK column; constraint named fk_<table>_<column>_<referred table> unless `name`."""
    referred = target.split(".")[0]
    return sa.Column(
        column,
        sa.BigInteger,
        sa.ForeignKey(target, ondelete=ondelete, name=name or f"fk_{table}_{column}_{referred}"),
        nullable=nullable,
    )


def _publication_name() -> str:
    name = context.config.attributes["publication_name"]
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"invalid publication name {name!r}: use lower-case letters, digits and _")
    return name


def upgrade() -> None:
    # ---------------------------------------------------------------- projects, matters, ontology
    op.create_table(
        "projects",
        _pk(),
        sa.Column("name", sa.Text, nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
    )

    op.create_table(
        "matters",
        _pk(),
        _fk("matters", "project_id", "projects.id", "CASCADE", nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("reference", sa.Text),
        sa.PrimaryKeyConstraint("id", name="pk_matters"),
    )
    op.create_index("ix_matters_project_id", "matters", ["project_id"])

    op.create_table(
        "ontology_nodes",
        _pk(),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        _fk("ontology_nodes", "parent_id", "ontology_nodes.id", "RESTRICT", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ontology_nodes"),
        sa.UniqueConstraint("key", name="uq_ontology_nodes_key"),
        _check("kind IN ('doc_type', 'clause_type')", name="ck_ontology_nodes_kind"),
        _check("parent_id <> id", name="ck_ontology_nodes_not_own_parent"),
        _check("btrim(key) <> ''", name="ck_ontology_nodes_key_nonblank"),
    )
    op.create_index("ix_ontology_nodes_parent_id", "ontology_nodes", ["parent_id"])

    # ---------------------------------------------------------------- sources
    op.create_table(
        "sources",
        _pk(),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sources"),
        _check("btrim(kind) <> ''", name="ck_sources_kind_nonblank"),
    )

    op.create_table(
        "source_objects",
        _pk(),
        _fk("source_objects", "source_id", "sources.id", "CASCADE", nullable=False),
        sa.Column("external_ref", sa.Text, nullable=False),
        sa.Column("acl_known", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.PrimaryKeyConstraint("id", name="pk_source_objects"),
        sa.UniqueConstraint("source_id", "external_ref", name="uq_source_objects_source_id_external_ref"),
    )

    # ---------------------------------------------------------------- principals
    op.create_table(
        "group_memberships",
        _pk(),
        _fk("group_memberships", "source_id", "sources.id", "CASCADE", nullable=True),
        sa.Column("group_principal", sa.Text, nullable=False),
        sa.Column("member_principal", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_group_memberships"),
        # NULLS NOT DISTINCT (PostgreSQL 15+): local memberships (source_id NULL) are deduplicated too.
        sa.UniqueConstraint(
            "source_id",
            "group_principal",
            "member_principal",
            name="uq_group_memberships_source_group_member",
            postgresql_nulls_not_distinct=True,
        ),
        _check("btrim(group_principal) <> ''", name="ck_group_memberships_group_principal_nonblank"),
        _check("btrim(member_principal) <> ''", name="ck_group_memberships_member_principal_nonblank"),
    )
    op.create_index("ix_group_memberships_member_principal", "group_memberships", ["member_principal"])

    op.create_table(
        "principal_aliases",
        _pk(),
        sa.Column("alias", sa.Text, nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_principal_aliases"),
        sa.UniqueConstraint("alias", name="uq_principal_aliases_alias"),
        _check("btrim(alias) <> ''", name="ck_principal_aliases_alias_nonblank"),
        _check("btrim(principal) <> ''", name="ck_principal_aliases_principal_nonblank"),
    )

    # ---------------------------------------------------------------- documents and versions
    op.create_table(
        "documents",
        _pk(),
        _fk("documents", "project_id", "projects.id", "CASCADE", nullable=False),
        _fk("documents", "matter_id", "matters.id", "SET NULL", nullable=True),
        sa.Column("title", sa.Text, nullable=False),
        _fk("documents", "doc_type_id", "ontology_nodes.id", "RESTRICT", nullable=True),
        sa.Column("identifiers", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column("latest_final_version_id", sa.BigInteger),  # FK added below, after document_versions
        sa.Column("deleted_at", sa.DateTime(timezone=True)),
        _created_at(),
        _updated_at(),
        sa.PrimaryKeyConstraint("id", name="pk_documents"),
        _check("array_position(identifiers, NULL) IS NULL", name="ck_documents_identifiers_no_nulls"),
    )
    op.create_index("ix_documents_project_id", "documents", ["project_id"])
    op.create_index("ix_documents_matter_id", "documents", ["matter_id"])
    op.create_index("ix_documents_doc_type_id", "documents", ["doc_type_id"])

    op.create_table(
        "document_versions",
        _pk(),
        _fk("document_versions", "document_id", "documents.id", "CASCADE", nullable=False),
        sa.Column("version_no", sa.Integer, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("language", sa.Text, nullable=False, server_default=sa.text("'de'")),
        sa.Column("doc_date", sa.Date),
        sa.Column("text", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("notable_clauses", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        _created_at(),
        _updated_at(),
        sa.PrimaryKeyConstraint("id", name="pk_document_versions"),
        # Also the "versions by document" index.
        sa.UniqueConstraint("document_id", "version_no", name="uq_document_versions_document_id_version_no"),
        # Target of the composite latest-final-version FK below.
        sa.UniqueConstraint("id", "document_id", name="uq_document_versions_id_document_id"),
        _check("status IN ('draft', 'final', 'executed', 'unknown')", name="ck_document_versions_status"),
        _check("version_no >= 1", name="ck_document_versions_version_no_positive"),
        _check("jsonb_typeof(notable_clauses) = 'array'", name="ck_document_versions_notable_clauses_array"),
    )

    # The pointer may only name a version of the same document. Deferred to commit, so a writer can
    # insert a version and point at it (or repoint and delete) in any order within one transaction.
    op.create_foreign_key(
        "fk_documents_latest_final_version",
        "documents",
        "document_versions",
        ["latest_final_version_id", "id"],
        ["id", "document_id"],
        deferrable=True,
        initially="DEFERRED",
    )

    op.create_table(
        "source_observations",
        _pk(),
        _fk(
            "source_observations",
            "document_version_id",
            "document_versions.id",
            "CASCADE",
            nullable=False,
            name="fk_source_observations_document_version_id",
        ),
        _fk("source_observations", "source_object_id", "source_objects.id", "CASCADE", nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("deleted_at", sa.DateTime(timezone=True)),  # active iff NULL
        sa.PrimaryKeyConstraint("id", name="pk_source_observations"),
    )
    op.create_index("ix_source_observations_document_version_id", "source_observations", ["document_version_id"])
    op.create_index("ix_source_observations_source_object_id", "source_observations", ["source_object_id"])

    # ---------------------------------------------------------------- grants
    op.create_table(
        "grants",
        _pk(),
        sa.Column("scope", sa.Text, nullable=False),
        _fk("grants", "project_id", "projects.id", "CASCADE", nullable=True),
        _fk("grants", "document_id", "documents.id", "CASCADE", nullable=True),
        _fk("grants", "source_object_id", "source_objects.id", "CASCADE", nullable=True),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("effect", sa.Text, nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_grants"),
        _check("scope IN ('project', 'document', 'source_object')", name="ck_grants_scope"),
        _check("effect IN ('allow', 'deny')", name="ck_grants_effect"),
        # Exactly the target column that matches the scope is set.
        _check(
            "(scope = 'project' AND project_id IS NOT NULL"
            " AND document_id IS NULL AND source_object_id IS NULL)"
            " OR (scope = 'document' AND document_id IS NOT NULL"
            " AND project_id IS NULL AND source_object_id IS NULL)"
            " OR (scope = 'source_object' AND source_object_id IS NOT NULL"
            " AND project_id IS NULL AND document_id IS NULL)",
            name="ck_grants_scope_target",
        ),
        _check("btrim(principal) <> ''", name="ck_grants_principal_nonblank"),
    )
    # target -> principals (projection, re-verify)
    for target in ("project_id", "document_id", "source_object_id"):
        op.create_index(
            f"ix_grants_{target}_principal",
            "grants",
            [target, "principal"],
            postgresql_where=sa.text(f"{target} IS NOT NULL"),
        )
    # principal -> targets (scope compilation)
    op.create_index("ix_grants_principal_scope", "grants", ["principal", "scope"])

    # ---------------------------------------------------------------- not captured
    op.create_table(
        "decision_records",
        _pk(),
        _fk("decision_records", "project_id", "projects.id", "CASCADE", nullable=False),
        _fk("decision_records", "document_id", "documents.id", "SET NULL", nullable=True),
        sa.Column("locus", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("change_summary", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("rationale", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column(
            "evidence_source_object_ids",
            pg.ARRAY(sa.BigInteger),
            nullable=False,
            server_default=sa.text("'{}'::bigint[]"),
        ),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_decision_records"),
    )
    op.create_index("ix_decision_records_project_id", "decision_records", ["project_id"])
    op.create_index("ix_decision_records_document_id", "decision_records", ["document_id"])

    op.create_table(
        "relations",
        _pk(),
        sa.Column("kind", sa.Text, nullable=False),
        _fk("relations", "from_document_id", "documents.id", "CASCADE", nullable=False),
        _fk("relations", "to_document_id", "documents.id", "CASCADE", nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_relations"),
        _check(
            "kind IN ('supersedes', 'annex_of', 'responds_to', 'references', 'thread')",
            name="ck_relations_kind",
        ),
        _check("from_document_id <> to_document_id", name="ck_relations_not_self"),
        sa.UniqueConstraint(
            "kind",
            "from_document_id",
            "to_document_id",
            name="uq_relations_kind_from_document_id_to_document_id",
        ),
    )
    op.create_index("ix_relations_from_document_id", "relations", ["from_document_id"])
    op.create_index("ix_relations_to_document_id", "relations", ["to_document_id"])

    op.create_table(
        "debezium_heartbeat",
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_debezium_heartbeat"),
    )

    # ---------------------------------------------------------------- functions and triggers
    op.execute(
        """
        CREATE FUNCTION ki_touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.updated_at := now();
            RETURN NEW;
        END
        $$
        """
    )
    for table in ("documents", "document_versions"):
        op.execute(
            f"CREATE TRIGGER {table}_touch_updated_at BEFORE UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION ki_touch_updated_at()"
        )

    # The node itself (depth 0) and every ancestor up to the root. parent_id stays the only stored tree;
    # the tree guard below keeps it acyclic, so the recursion terminates.
    op.execute(
        """
        CREATE FUNCTION ontology_ancestors(node_id bigint) RETURNS TABLE (id bigint, depth integer)
        LANGUAGE sql STABLE AS $$
            WITH RECURSIVE up (id, parent_id, depth) AS (
                SELECT n.id, n.parent_id, 0 FROM ontology_nodes n WHERE n.id = node_id
                UNION ALL
                SELECT p.id, p.parent_id, up.depth + 1 FROM ontology_nodes p JOIN up ON p.id = up.parent_id
            )
            SELECT up.id, up.depth FROM up
        $$
        """
    )
    # The node itself (depth 0) and its whole subtree: the documents typed at any of these nodes are the
    # ones whose doc_type_ancestors change when the node moves.
    op.execute(
        """
        CREATE FUNCTION ontology_descendants(node_id bigint) RETURNS TABLE (id bigint, depth integer)
        LANGUAGE sql STABLE AS $$
            WITH RECURSIVE down (id, depth) AS (
                SELECT n.id, 0 FROM ontology_nodes n WHERE n.id = node_id
                UNION ALL
                SELECT c.id, down.depth + 1 FROM ontology_nodes c JOIN down ON c.parent_id = down.id
            )
            SELECT down.id, down.depth FROM down
        $$
        """
    )
    # Tree guard: no cycles, and a node's parent has the node's kind. Parent changes are serialised
    # with a transaction-level advisory lock so two concurrent moves cannot close a cycle together.
    op.execute(
        """
        CREATE FUNCTION ki_ontology_tree_guard() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            parent_kind text;
        BEGIN
            IF NEW.parent_id IS NOT NULL THEN
                PERFORM pg_advisory_xact_lock(hashtext('ki.ontology_nodes.tree'));
                SELECT n.kind INTO parent_kind FROM ontology_nodes n WHERE n.id = NEW.parent_id;
                IF parent_kind IS DISTINCT FROM NEW.kind AND parent_kind IS NOT NULL THEN
                    RAISE EXCEPTION 'ontology node % (%) cannot have parent % of kind %',
                        NEW.key, NEW.kind, NEW.parent_id, parent_kind
                        USING ERRCODE = 'check_violation';
                END IF;
                IF EXISTS (SELECT 1 FROM ontology_ancestors(NEW.parent_id) a WHERE a.id = NEW.id) THEN
                    RAISE EXCEPTION 'ontology node % cannot be placed under itself or its descendant %',
                        NEW.key, NEW.parent_id
                        USING ERRCODE = 'check_violation';
                END IF;
            END IF;
            IF TG_OP = 'UPDATE' AND NEW.kind IS DISTINCT FROM OLD.kind
               AND EXISTS (SELECT 1 FROM ontology_nodes c WHERE c.parent_id = NEW.id) THEN
                RAISE EXCEPTION 'ontology node % has children; its kind cannot change', NEW.key
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER ontology_nodes_tree_guard BEFORE INSERT OR UPDATE OF parent_id, kind "
        "ON ontology_nodes FOR EACH ROW EXECUTE FUNCTION ki_ontology_tree_guard()"
    )

    # ---------------------------------------------------------------- CDC: replica identity, publication
    for table in REPLICA_IDENTITY_FULL:
        op.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")

    # Idempotent: a publication left behind (e.g. by a downgrade that could not drop it, or created by
    # an operator beforehand) is reset to exactly these tables.
    name = _publication_name()
    tables = ", ".join(PUBLISHED)
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '{name}') THEN
                ALTER PUBLICATION {name} SET TABLE {tables};
            ELSE
                CREATE PUBLICATION {name} FOR TABLE {tables};
            END IF;
        END
        $$
        """
    )


def downgrade() -> None:
    op.execute(f"DROP PUBLICATION IF EXISTS {_publication_name()}")

    op.execute("DROP TRIGGER ontology_nodes_tree_guard ON ontology_nodes")
    op.execute("DROP FUNCTION ki_ontology_tree_guard()")
    op.execute("DROP FUNCTION ontology_descendants(bigint)")
    op.execute("DROP FUNCTION ontology_ancestors(bigint)")
    for table in ("documents", "document_versions"):
        op.execute(f"DROP TRIGGER {table}_touch_updated_at ON {table}")
    op.execute("DROP FUNCTION ki_touch_updated_at()")

    op.drop_constraint("fk_documents_latest_final_version", "documents", type_="foreignkey")
    for table in (
        "debezium_heartbeat",
        "relations",
        "decision_records",
        "grants",
        "source_observations",
        "document_versions",
        "documents",
        "principal_aliases",
        "group_memberships",
        "source_objects",
        "sources",
        "ontology_nodes",
        "matters",
        "projects",
    ):
        op.drop_table(table)
