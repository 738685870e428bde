"""Identity keys of titles and identifiers, indexed, for the search's identity preflight.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

`ki_identity_key(text)` is the SQL twin of `search.names.keys.identity_key`: NFC, casefolded (0004's
`ki_casefold_lowered` after the ICU lower-casing, only when a code point needs it), every separator
(ASCII other than [0-9a-z], Unicode spaces, `§`, dashes, quotes ...) a space, a space between a digit
and anything else, runs of spaces collapsed, trimmed. `ki_identity_keys(text[])` maps it over an array,
each key cut at 256 characters (a GIN entry must fit a page; longer names are never looked up).

Indexes: a hash index on the title's key (no length limit, equality only) and a GIN index on the
identifiers' keys, both only over documents that are not soft-deleted, as the preflight reads them.
`tests/integration/test_identity_sql.py` proves the function equal to the Python one.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_0004 = importlib.import_module("ki.migrations.versions.0004_casefolded_principals")

# Frozen copy of search.names.keys.UNICODE_SEPARATORS at this revision.
UNICODE_SEPARATORS = (
    "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f"
    "\u205f\u3000"
    "\u00a7\u00b6\u00ab\u00bb\u00b7\u00ad\u00b4"
    "\u200b\u2060\ufeff"
    "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"
    "\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\u2026\u2032\u2033"
)
MAX_KEY_CHARS = 256

_lit = _0004._literal
_NEEDS_CASEFOLD = _lit("[" + "".join(sorted(_0004.CASEFOLD)) + "]")
_SEPARATOR = _lit("[^0-9a-z\u0080-\U0010ffff]|[" + UNICODE_SEPARATORS + "]")

# Regular expressions run in the C collation (code points, and fast); the lower-casing under ICU.
CASEFOLD_SQL = (
    "CREATE FUNCTION ki_casefold(raw text) RETURNS text\n"
    "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE\n"
    'RETURN CASE WHEN lower(raw COLLATE "und-x-icu") COLLATE "C" ~ ' + _NEEDS_CASEFOLD + "\n"
    '            THEN ki_casefold_lowered(lower(raw COLLATE "und-x-icu"))\n'
    '            ELSE lower(raw COLLATE "und-x-icu") END'
)

IDENTITY_KEY_SQL = (
    "CREATE FUNCTION ki_identity_key(raw text) RETURNS text\n"
    "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE\n"
    "RETURN btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(\n"
    '    ki_casefold(normalize(raw, NFC)) COLLATE "C", ' + _SEPARATOR + ", ' ', 'g'),\n"
    "    '([0-9])([^0-9 ])', '\\1 \\2', 'g'),\n"
    "    '([^0-9 ])([0-9])', '\\1 \\2', 'g'),\n"
    "    ' +', ' ', 'g'), ' ')"
)

IDENTITY_KEYS_SQL = (
    "CREATE FUNCTION ki_identity_keys(raw text[]) RETURNS text[]\n"
    "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE\n"
    f"RETURN ARRAY(SELECT left(ki_identity_key(x), {MAX_KEY_CHARS}) FROM unnest(raw) AS x WHERE x IS NOT NULL)"
)


def upgrade() -> None:
    op.execute(CASEFOLD_SQL)
    op.execute(IDENTITY_KEY_SQL)
    op.execute(IDENTITY_KEYS_SQL)
    op.execute(
        "CREATE INDEX ix_documents_title_identity ON documents USING hash (ki_identity_key(title)) "
        "WHERE deleted_at IS NULL"
    )
    op.execute(
        "CREATE INDEX ix_documents_identifiers_identity ON documents USING gin (ki_identity_keys(identifiers)) "
        "WHERE deleted_at IS NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_documents_identifiers_identity")
    op.execute("DROP INDEX ix_documents_title_identity")
    op.execute("DROP FUNCTION ki_identity_keys(text[])")
    op.execute("DROP FUNCTION ki_identity_key(text)")
    op.execute("DROP FUNCTION ki_casefold(text)")
