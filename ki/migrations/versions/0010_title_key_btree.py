"""The title's identity key indexed in a B-tree, by its first 255 characters.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

0005 indexed `ki_identity_key(title)` in a hash index, which keeps only hashes: every row a probe finds is
checked again by computing the key from the title (NFC, casefold, four regular expressions). So a name that
a document carries cost the identity preflight that computation per carrier -- hidden carriers included,
which made a name only hidden documents carry slower to look up than a name nobody carries. A B-tree keeps
the key itself and is not checked again; `left(..., 255)` keeps every entry within a B-tree page (a key of
up to 255 characters, 4 bytes each at most). A key asked for that is shorter than 255 characters is equal to
the prefix exactly when it is equal to the whole key (`ki.acl.TITLE_KEY_PREFIX`); longer names are never
looked up.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PREFIX_CHARS = 255


def upgrade() -> None:
    op.execute("DROP INDEX ix_documents_title_identity")
    op.execute(
        "CREATE INDEX ix_documents_title_identity ON documents "
        f"USING btree (left(ki_identity_key(title), {PREFIX_CHARS})) WHERE deleted_at IS NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_documents_title_identity")
    op.execute(
        "CREATE INDEX ix_documents_title_identity ON documents USING hash (ki_identity_key(title)) "
        "WHERE deleted_at IS NULL"
    )
