"""The access audit: one row per API request -- who asked, which endpoint, what status, which documents
the answer named (search.telemetry.audit).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

Written by the API (HTTP and MCP), readable by administrators only (`GET /v1/audit`); kept for
`api.audit.retention_days`. What a firm's compliance team asks for: which user saw which document when.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ki_access_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("principals", ARRAY(sa.Text()), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("document_ids", ARRAY(sa.BigInteger()), server_default=sa.text("'{}'::bigint[]"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ki_access_audit"),
    )
    op.create_index("ix_ki_access_audit_at", "ki_access_audit", ["at"])


def downgrade() -> None:
    op.drop_index("ix_ki_access_audit_at", table_name="ki_access_audit")
    op.drop_table("ki_access_audit")
