"""The access audit names the versions an answer showed the text of.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

`GET /v1/documents/{id}/versions/{version_id}/text` and the MCP `read_document` tool hand out a version's
text; the audit row of such a request says which version (`version_ids`, beside `document_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "ki_access_audit",
        sa.Column("version_ids", ARRAY(sa.BigInteger()), server_default=sa.text("'{}'::bigint[]"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("ki_access_audit", "version_ids")
