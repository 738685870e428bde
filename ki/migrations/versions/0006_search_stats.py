"""Retrieval statistics: one row per ranked query, written by the search API (search.telemetry.stats).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Not in the publication: the sidecar's own data, not the structured layer's. Bounded by the API
(`api.stats.retention_days`, `api.stats.max_rows`); the query text only with `api.stats.store_query_text`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ki_search_stats",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False),
        sa.Column("lexical_only", sa.Integer(), nullable=False),
        sa.Column("semantic_only", sa.Integer(), nullable=False),
        sa.Column("both_legs", sa.Integer(), nullable=False),
        sa.Column("top_lexical", sa.Double(), nullable=True),
        sa.Column("top_semantic", sa.Double(), nullable=True),
        sa.Column("top_fused", sa.Double(), nullable=True),
        sa.Column("identity", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("fallbacks", ARRAY(sa.Text()), server_default=sa.text("'{}'::text[]"), nullable=False),
        sa.Column("took_ms", sa.Double(), nullable=False),
        sa.Column("query", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ki_search_stats"),
    )
    op.create_index("ix_ki_search_stats_at", "ki_search_stats", ["at"])


def downgrade() -> None:
    op.drop_index("ix_ki_search_stats_at", table_name="ki_search_stats")
    op.drop_table("ki_search_stats")
