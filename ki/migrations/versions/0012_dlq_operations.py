"""The operations log of the dead-letter topic: one row per dead letter `ki dlq replay` or `ki dlq drop` acted on.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-08

The DLQ topic is append-only, so whether a dead letter is handled is kept here: a `replayed` or `dropped` row for
its (topic, partition, offset) handles it, at most once (a partial unique index); a `failed` replay leaves it
waiting. Who (`operator`: the OS user or `--by`), when, the key `ki dlq list` showed, the reason (required for a
drop), the outcome and, for a failure, what failed. Not in the publication: the sidecar's own data.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ki_dlq_operations",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("dlq_topic", sa.Text(), nullable=False),
        sa.Column("dlq_partition", sa.Integer(), nullable=False),
        sa.Column("dlq_offset", sa.BigInteger(), nullable=False),
        sa.Column("record_key", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ki_dlq_operations"),
        sa.CheckConstraint("action IN ('replay', 'drop')", name=op.f("ck_ki_dlq_operations_action")),
        sa.CheckConstraint("outcome IN ('replayed', 'dropped', 'failed')", name=op.f("ck_ki_dlq_operations_outcome")),
        sa.CheckConstraint(
            "action <> 'drop' OR btrim(coalesce(reason, '')) <> ''", name=op.f("ck_ki_dlq_operations_drop_has_reason")
        ),
    )
    op.create_index(
        "ix_ki_dlq_operations_handled",
        "ki_dlq_operations",
        ["dlq_topic", "dlq_partition", "dlq_offset"],
        unique=True,
        postgresql_where=sa.text("outcome IN ('replayed', 'dropped')"),
    )


def downgrade() -> None:
    op.drop_index("ix_ki_dlq_operations_handled", table_name="ki_dlq_operations")
    op.drop_table("ki_dlq_operations")
