"""Index principals in the form the ACL compares them: lower(btrim(principal)).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Scope compilation, caller expansion and the principal projection all match trimmed, lower-cased
principals (`ki.acl`). The plain-column indexes of 0001 could not serve those predicates, so a caller
with a handful of principals made PostgreSQL scan every grant and membership. They are replaced here.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NORMALIZED = (
    ("grants", "principal"),
    ("group_memberships", "member_principal"),
    ("group_memberships", "group_principal"),
    ("principal_aliases", "alias"),
    ("principal_aliases", "principal"),
)


def upgrade() -> None:
    op.drop_index("ix_grants_principal_scope", table_name="grants")
    op.drop_index("ix_group_memberships_member_principal", table_name="group_memberships")
    for table, column in NORMALIZED:
        op.execute(f"CREATE INDEX ix_{table}_{column}_normalized ON {table} (lower(btrim({column})))")


def downgrade() -> None:
    for table, column in NORMALIZED:
        op.drop_index(f"ix_{table}_{column}_normalized", table_name=table)
    op.create_index("ix_group_memberships_member_principal", "group_memberships", ["member_principal"])
    op.create_index("ix_grants_principal_scope", "grants", ["principal", "scope"])
