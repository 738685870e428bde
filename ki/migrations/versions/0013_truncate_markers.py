"""TRUNCATE markers: a statement trigger on every captured table emits a logical-decoding message when it is truncated.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

Debezium's own truncate event has no key, and the CDC topics are compacted: the broker rejects a record without a
key there, which would fail the connector task, so Debezium keeps skipping truncates (`skipped.operations`). Instead
`ki_truncate_marker()` emits `pg_logical_emit_message(true, 'ki.truncate.<table>', '')`: transactional (delivered
at the TRUNCATE's commit, in order), keyed by its prefix on Debezium's `<prefix>.message` topic, and decoded as that
table's truncate (`projections.cdc`). TRUNCATE ... CASCADE fires the trigger of every table it truncates. The table
list is this revision's frozen copy of the captured tables (`ki.table_roles.CAPTURED_TABLES`).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
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
)


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION ki_truncate_marker() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_logical_emit_message(true, 'ki.truncate.' || TG_TABLE_NAME, '');
            RETURN NULL;
        END
        $$
        """
    )
    for table in TABLES:
        op.execute(
            f"CREATE TRIGGER ki_truncate_marker AFTER TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION ki_truncate_marker()"
        )


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS ki_truncate_marker ON {table}")
    op.execute("DROP FUNCTION IF EXISTS ki_truncate_marker()")
