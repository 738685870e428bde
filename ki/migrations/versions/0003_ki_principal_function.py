"""One normalisation of principals for SQL and Python: `ki_principal(text)`.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

0002 indexed `lower(btrim(x))`. The database runs in the C locale, where `lower` folds only ASCII
letters and `btrim` trims only spaces, while callers are normalised in Python with `str.strip().lower()`:
a grant to "user:JÜRGEN" or "user:jürgen\\t" matched nobody. `ki_principal` trims exactly the characters
`str.strip()` strips (`str.isspace()`) and lower-cases with the ICU root collation, whose `lower` equals
Python's `str.lower()` (full case mapping: "İ" -> "i̇", final sigma in context; checked against every
code point by `tests/integration/test_acl_properties.py`). A blank result is NULL, so it matches nothing,
like `ki.acl.normalize_principal` returning None.

The function is IMMUTABLE so that it can be indexed, and deliberately not STRICT: PostgreSQL inlines a
non-strict SQL function (NULLIF is not strict), so queries run the bare expression instead of a function
call per row (2.5x faster on the projection's grant read); a NULL argument still gives NULL. Strictly,
its result depends on the ICU version: after an ICU upgrade that changes case mappings, `REINDEX` the
`*_folded` indexes (PostgreSQL also warns about the collation version mismatch).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Python's str.isspace() characters (what str.strip() removes), as a Unicode-escaped string literal.
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_WHITESPACE_SQL = "U&'" + "".join(f"\\{ord(c):04X}" for c in WHITESPACE) + "'"

NORMALIZED = (
    ("grants", "principal"),
    ("group_memberships", "member_principal"),
    ("group_memberships", "group_principal"),
    ("principal_aliases", "alias"),
    ("principal_aliases", "principal"),
)


def upgrade() -> None:
    op.execute(
        "CREATE FUNCTION ki_principal(raw text) RETURNS text\n"
        "LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
        f"RETURN NULLIF(lower(btrim(raw, {_WHITESPACE_SQL}) COLLATE \"und-x-icu\"), '')"
    )
    for table, column in NORMALIZED:
        op.drop_index(f"ix_{table}_{column}_normalized", table_name=table)
        op.execute(f"CREATE INDEX ix_{table}_{column}_folded ON {table} (ki_principal({column}))")


def downgrade() -> None:
    for table, column in NORMALIZED:
        op.drop_index(f"ix_{table}_{column}_folded", table_name=table)
        op.execute(f"CREATE INDEX ix_{table}_{column}_normalized ON {table} (lower(btrim({column})))")
    op.execute("DROP FUNCTION ki_principal(text)")
