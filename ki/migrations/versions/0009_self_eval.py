"""The deployment's own retrieval evidence: one row per `ki eval --self` run (apps.dev.eval.self_check).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Kept in PostgreSQL, not in a file, because every API process on every machine reads it: each re-reads the
newest row every `retrieval.mode_gate.self_eval_refresh_s` and lets it decide the default mode
(search.ranking.mode_gate).
`report` is the whole JSON report; query texts in it are hashed unless `api.stats.store_query_text`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ki_self_eval",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("binding_hash", sa.Text(), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.Column("report", JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ki_self_eval"),
        sa.CheckConstraint("decision IN ('hybrid', 'lexical')", name=op.f("ck_ki_self_eval_decision")),
    )


def downgrade() -> None:
    op.drop_table("ki_self_eval")
