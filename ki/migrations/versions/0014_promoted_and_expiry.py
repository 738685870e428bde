"""Promoted documents and expiry: `documents.promoted`, `documents.expires_at`, `sources.expires_at`.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-09

`promoted` gives a document's rows a small bonus on the fused score (`retrieval.promoted_bonus`). From
`expires_at` on, a document's versions are visible to nobody, and an observation at an object of an expired
source makes nothing visible or citable (`ki.acl`: decided in SQL at query time, exactly); the sync drops
an expired document's rows when it sees the change, and the access lane's sweep (`streams.expiry_sweep_s`)
when no change announces it. All three columns are in tables already in the publication: no publication
change. An index on `documents.expires_at` (partial: only rows that have one) serves the sweep.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("documents", sa.Column("promoted", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.add_column("documents", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("sources", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_documents_expires_at", "documents", ["expires_at"], postgresql_where=sa.text("expires_at IS NOT NULL")
    )


def downgrade() -> None:
    op.drop_index("ix_documents_expires_at", table_name="documents")
    op.drop_column("sources", "expires_at")
    op.drop_column("documents", "expires_at")
    op.drop_column("documents", "promoted")
