"""Principals fold only case: no two names that differ in more than case share a canonical form.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

0004's full case folding merged names that are distinct to every person reading them: "anna.ſchmidt" (long
s) was anna.schmidt, "katharina.\u212arueger" (the Kelvin sign) was katharina.krueger, so whoever could
choose such a name at an identity provider inherited another user's grants. `ki_principal` now returns NULL
(matches nobody, and the `ck_*_form` checks refuse the write) unless the trimmed value is in Unicode normal
form NFC (the Kelvin, Ångström and Ohm signs and decomposed accents are not) and its lower-casing, with the
final sigma "ς" written "σ", contains none of 0004's `CASEFOLD` code points (so its case folding *is* that
lower-casing: no "ß", "ſ", "ﬁ"). The sigma is kept as 0004 folded it: lower-casing writes "ς" for a final
"Σ" by a context that depends on the Unicode version (ICU's is newer than Python's), and "ς" is "σ".
`ki.principals.canonical_principal` is the same rule in Python.

Stored rows that the new rule refuses are touched (`SET col = col`) in the same transaction, before the
function changes: the change-data capture then sends them again and the access lane rewrites the principal
projection of every version they reach with the new function (their grants stop applying). Their check is
then left NOT VALID with a warning, as in 0004; fix the rows and `VALIDATE CONSTRAINT`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_0004 = importlib.import_module("ki.migrations.versions.0004_casefolded_principals")

_TRIMMED = f"btrim(raw, {_0004._WHITESPACE_SQL})"
# 0004's first branch alone: lower-cased (ICU), the final sigma folded, then well-formed without a code
# point folding would change.
PRINCIPAL_SQL = (
    "CREATE OR REPLACE FUNCTION {name}(raw text) RETURNS text\n"
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
    f"RETURN CASE WHEN {_TRIMMED} IS NFC NORMALIZED\n"
    f"            THEN substring(translate({_0004._LOWERED}, U&'\\03C2', U&'\\03C3') COLLATE \"C\" FROM {_0004._PLAIN})"
    " END"
)


def _touch_refused_rows() -> None:
    op.execute(PRINCIPAL_SQL.format(name="ki_principal_0007"))
    for table, column in _0004.PRINCIPAL_COLUMNS:
        op.execute(
            f"UPDATE {table} SET {column} = {column} "
            f"WHERE ki_principal({column}) IS NOT NULL AND ki_principal_0007({column}) IS NULL"
        )
    op.execute("DROP FUNCTION ki_principal_0007(text)")


def upgrade() -> None:
    _touch_refused_rows()
    op.execute(PRINCIPAL_SQL.format(name="ki_principal"))
    _0004._rebuild_indexes()
    for table, column in _0004.PRINCIPAL_COLUMNS:
        name = f"ck_{table}_{column}_form"
        _0004.add_form_check(table, column, name, "kind:name in NFC, case folding only changing case")


def downgrade() -> None:
    op.execute(_0004.PRINCIPAL_SQL)
    _0004._rebuild_indexes()
