"""Principals in one canonical form, `kind:name`, trimmed and casefolded, in SQL as in Python.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

The spec says principals are trimmed and *casefolded*; 0003's `ki_principal` lower-cased ("Straße" and
"STRASSE" were two principals, so were "ς" and "σ"). PostgreSQL 15 has no casefold. Full case folding
differs from full lower-casing only on the code points of `CASEFOLD` (generated from Python's
`str.casefold`: every lower-case code point whose casefold is not itself, "ß" -> "ss", "ﬁ" -> "fi",
"ς" -> "σ", Cherokee small letters -> capitals ...), and `casefold(x) == casefold(lower(x))` for every
code point, so `ki_principal` lower-cases as before (ICU root collation, equal to Python's `str.lower()`)
and then maps those code points (`ki_casefold_lowered`). Most principals contain none of them: a regular
expression sends only those that do through the per-character mapping, so the common case costs one
match more than 0003 and the function still inlines.

A principal is also *well-formed* now: a kind of ASCII letters, digits, `_`, `.`, `-`, a colon, a
non-empty name (`ki.principals.KIND_NAME`). `ki_principal` returns NULL for anything else, so a stored
value without a kind matches nobody, and CHECK constraints `ck_<table>_<column>_form` (replacing the
`*_nonblank` ones) reject such values where upstream systems write them. Rows already in the table that
violate them are not rejected retroactively: the constraints are then left NOT VALID (new writes are
checked, old rows are not) and the migration warns; fix the rows and run `ALTER TABLE … VALIDATE
CONSTRAINT …`.

The `*_folded` expression indexes are rebuilt, as their values change with the function.
`tests/unit/test_principal_migration.py` fails when Python's Unicode database no longer gives `CASEFOLD`
(a Python upgrade that changes case folding needs a new migration), and
`tests/integration/test_acl_properties.py` proves `ki_principal` equal to `ki.principals.canonical_principal`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from alembic import context, op
from sqlalchemy import text

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")

# Python's str.isspace() characters (what str.strip() removes), as in 0003.
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

# Lower-case code point -> its full case folding, where the two differ (Python 3.11, Unicode 14.0).
# fmt: off
CASEFOLD = {
    "\u00b5": "\u03bc", "\u00df": "\u0073\u0073", "\u0149": "\u02bc\u006e", "\u017f": "\u0073",
    "\u01f0": "\u006a\u030c", "\u0345": "\u03b9", "\u0390": "\u03b9\u0308\u0301", "\u03b0": "\u03c5\u0308\u0301",
    "\u03c2": "\u03c3", "\u03d0": "\u03b2", "\u03d1": "\u03b8", "\u03d5": "\u03c6", "\u03d6": "\u03c0",
    "\u03f0": "\u03ba", "\u03f1": "\u03c1", "\u03f5": "\u03b5", "\u0587": "\u0565\u0582", "\u13f8": "\u13f0",
    "\u13f9": "\u13f1", "\u13fa": "\u13f2", "\u13fb": "\u13f3", "\u13fc": "\u13f4", "\u13fd": "\u13f5",
    "\u1c80": "\u0432", "\u1c81": "\u0434", "\u1c82": "\u043e", "\u1c83": "\u0441", "\u1c84": "\u0442",
    "\u1c85": "\u0442", "\u1c86": "\u044a", "\u1c87": "\u0463", "\u1c88": "\ua64b", "\u1e96": "\u0068\u0331",
    "\u1e97": "\u0074\u0308", "\u1e98": "\u0077\u030a", "\u1e99": "\u0079\u030a", "\u1e9a": "\u0061\u02be",
    "\u1e9b": "\u1e61", "\u1f50": "\u03c5\u0313", "\u1f52": "\u03c5\u0313\u0300", "\u1f54": "\u03c5\u0313\u0301",
    "\u1f56": "\u03c5\u0313\u0342", "\u1f80": "\u1f00\u03b9", "\u1f81": "\u1f01\u03b9", "\u1f82": "\u1f02\u03b9",
    "\u1f83": "\u1f03\u03b9", "\u1f84": "\u1f04\u03b9", "\u1f85": "\u1f05\u03b9", "\u1f86": "\u1f06\u03b9",
    "\u1f87": "\u1f07\u03b9", "\u1f90": "\u1f20\u03b9", "\u1f91": "\u1f21\u03b9", "\u1f92": "\u1f22\u03b9",
    "\u1f93": "\u1f23\u03b9", "\u1f94": "\u1f24\u03b9", "\u1f95": "\u1f25\u03b9", "\u1f96": "\u1f26\u03b9",
    "\u1f97": "\u1f27\u03b9", "\u1fa0": "\u1f60\u03b9", "\u1fa1": "\u1f61\u03b9", "\u1fa2": "\u1f62\u03b9",
    "\u1fa3": "\u1f63\u03b9", "\u1fa4": "\u1f64\u03b9", "\u1fa5": "\u1f65\u03b9", "\u1fa6": "\u1f66\u03b9",
    "\u1fa7": "\u1f67\u03b9", "\u1fb2": "\u1f70\u03b9", "\u1fb3": "\u03b1\u03b9", "\u1fb4": "\u03ac\u03b9",
    "\u1fb6": "\u03b1\u0342", "\u1fb7": "\u03b1\u0342\u03b9", "\u1fbe": "\u03b9", "\u1fc2": "\u1f74\u03b9",
    "\u1fc3": "\u03b7\u03b9", "\u1fc4": "\u03ae\u03b9", "\u1fc6": "\u03b7\u0342", "\u1fc7": "\u03b7\u0342\u03b9",
    "\u1fd2": "\u03b9\u0308\u0300", "\u1fd3": "\u03b9\u0308\u0301", "\u1fd6": "\u03b9\u0342",
    "\u1fd7": "\u03b9\u0308\u0342", "\u1fe2": "\u03c5\u0308\u0300", "\u1fe3": "\u03c5\u0308\u0301",
    "\u1fe4": "\u03c1\u0313", "\u1fe6": "\u03c5\u0342", "\u1fe7": "\u03c5\u0308\u0342", "\u1ff2": "\u1f7c\u03b9",
    "\u1ff3": "\u03c9\u03b9", "\u1ff4": "\u03ce\u03b9", "\u1ff6": "\u03c9\u0342", "\u1ff7": "\u03c9\u0342\u03b9",
    "\uab70": "\u13a0", "\uab71": "\u13a1", "\uab72": "\u13a2", "\uab73": "\u13a3", "\uab74": "\u13a4",
    "\uab75": "\u13a5", "\uab76": "\u13a6", "\uab77": "\u13a7", "\uab78": "\u13a8", "\uab79": "\u13a9",
    "\uab7a": "\u13aa", "\uab7b": "\u13ab", "\uab7c": "\u13ac", "\uab7d": "\u13ad", "\uab7e": "\u13ae",
    "\uab7f": "\u13af", "\uab80": "\u13b0", "\uab81": "\u13b1", "\uab82": "\u13b2", "\uab83": "\u13b3",
    "\uab84": "\u13b4", "\uab85": "\u13b5", "\uab86": "\u13b6", "\uab87": "\u13b7", "\uab88": "\u13b8",
    "\uab89": "\u13b9", "\uab8a": "\u13ba", "\uab8b": "\u13bb", "\uab8c": "\u13bc", "\uab8d": "\u13bd",
    "\uab8e": "\u13be", "\uab8f": "\u13bf", "\uab90": "\u13c0", "\uab91": "\u13c1", "\uab92": "\u13c2",
    "\uab93": "\u13c3", "\uab94": "\u13c4", "\uab95": "\u13c5", "\uab96": "\u13c6", "\uab97": "\u13c7",
    "\uab98": "\u13c8", "\uab99": "\u13c9", "\uab9a": "\u13ca", "\uab9b": "\u13cb", "\uab9c": "\u13cc",
    "\uab9d": "\u13cd", "\uab9e": "\u13ce", "\uab9f": "\u13cf", "\uaba0": "\u13d0", "\uaba1": "\u13d1",
    "\uaba2": "\u13d2", "\uaba3": "\u13d3", "\uaba4": "\u13d4", "\uaba5": "\u13d5", "\uaba6": "\u13d6",
    "\uaba7": "\u13d7", "\uaba8": "\u13d8", "\uaba9": "\u13d9", "\uabaa": "\u13da", "\uabab": "\u13db",
    "\uabac": "\u13dc", "\uabad": "\u13dd", "\uabae": "\u13de", "\uabaf": "\u13df", "\uabb0": "\u13e0",
    "\uabb1": "\u13e1", "\uabb2": "\u13e2", "\uabb3": "\u13e3", "\uabb4": "\u13e4", "\uabb5": "\u13e5",
    "\uabb6": "\u13e6", "\uabb7": "\u13e7", "\uabb8": "\u13e8", "\uabb9": "\u13e9", "\uabba": "\u13ea",
    "\uabbb": "\u13eb", "\uabbc": "\u13ec", "\uabbd": "\u13ed", "\uabbe": "\u13ee", "\uabbf": "\u13ef",
    "\ufb00": "\u0066\u0066", "\ufb01": "\u0066\u0069", "\ufb02": "\u0066\u006c", "\ufb03": "\u0066\u0066\u0069",
    "\ufb04": "\u0066\u0066\u006c", "\ufb05": "\u0073\u0074", "\ufb06": "\u0073\u0074", "\ufb13": "\u0574\u0576",
    "\ufb14": "\u0574\u0565", "\ufb15": "\u0574\u056b", "\ufb16": "\u057e\u0576", "\ufb17": "\u0574\u056d",
}
# fmt: on

PRINCIPAL_COLUMNS = (
    ("grants", "principal"),
    ("group_memberships", "member_principal"),
    ("group_memberships", "group_principal"),
    ("principal_aliases", "alias"),
    ("principal_aliases", "principal"),
)


def _literal(value: str) -> str:
    """A SQL string literal with everything but printable ASCII Unicode-escaped (the SQL stays ASCII)."""
    return "U&'" + "".join(c if " " <= c <= "~" and c not in "\\'" else _escape(c) for c in value) + "'"


def _escape(c: str) -> str:
    return f"\\{ord(c):04X}" if ord(c) < 0x10000 else f"\\+{ord(c):06X}"


_WHITESPACE_SQL = _literal(WHITESPACE)
_LOWERED = f'lower(btrim(raw, {_WHITESPACE_SQL}) COLLATE "und-x-icu")'
# Already canonical once lower-cased: a kind, a colon and a name without any code point of CASEFOLD.
_PLAIN = _literal("^[a-z0-9_.-]+:[^" + "".join(sorted(CASEFOLD)) + "]+$")
_FORM = "'^[a-z0-9_.-]+:.+$'"

CASEFOLD_LOWERED_SQL = (
    "CREATE FUNCTION ki_casefold_lowered(lowered text) RETURNS text\n"
    "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE\n"
    f"RETURN (SELECT coalesce(string_agg(coalesce(CAST('{json.dumps(CASEFOLD, sort_keys=True)}' AS jsonb) ->> c, c),"
    " '' ORDER BY n), '')\n"
    "        FROM unnest(string_to_array(lowered, NULL)) WITH ORDINALITY AS t(c, n))"
)

# Regular expressions run in the C collation: under ICU, PostgreSQL's matcher is ten times slower.
PRINCIPAL_SQL = (
    "CREATE OR REPLACE FUNCTION ki_principal(raw text) RETURNS text\n"
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
    f'RETURN coalesce(substring({_LOWERED} COLLATE "C" FROM {_PLAIN}),\n'
    f'                substring(ki_casefold_lowered({_LOWERED}) COLLATE "C" FROM {_FORM}))'
)

# 0003's definition, for the downgrade.
PRINCIPAL_0003_SQL = (
    "CREATE OR REPLACE FUNCTION ki_principal(raw text) RETURNS text\n"
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
    f"RETURN NULLIF({_LOWERED}, '')"
)


def _rebuild_indexes() -> None:
    """Dropped and built again rather than `REINDEX`ed: a session caches an index's expressions with SQL
    functions inlined, so a REINDEX in the transaction that replaced `ki_principal` could build it with the
    old body (or one calling a function dropped since)."""
    for table, column in PRINCIPAL_COLUMNS:
        op.execute(f"DROP INDEX ix_{table}_{column}_folded")
        op.execute(f"CREATE INDEX ix_{table}_{column}_folded ON {table} (ki_principal({column}))")


def add_form_check(table: str, column: str, replaces: str, rule: str) -> None:
    """Replace the check `replaces` by `ck_<table>_<column>_form`, validated unless stored rows break it
    (then NOT VALID: new writes are checked, and a warning says so; `rule` says what a principal is)."""
    name = f"ck_{table}_{column}_form"
    op.drop_constraint(op.f(replaces), table, type_="check")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK (ki_principal({column}) IS NOT NULL) NOT VALID")
    # Decided by the server, so that offline SQL (`--sql`) does the same.
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM {table} WHERE ki_principal({column}) IS NULL) THEN "
        f"RAISE WARNING '{table}.{column} holds values that are not principals; {name} stays NOT VALID'; "
        f"ELSE ALTER TABLE {table} VALIDATE CONSTRAINT {name}; END IF; END $$"
    )
    if not context.is_offline_mode():
        bad = op.get_bind().execute(text(f"SELECT count(*) FROM {table} WHERE ki_principal({column}) IS NULL"))
        if count := bad.scalar_one():
            log.warning(
                "%s rows of %s have a %s that is not a principal (%s) and match nobody; %s checks "
                "new writes only. Fix them, then: ALTER TABLE %s VALIDATE CONSTRAINT %s",
                *(count, table, column, rule, name, table, name),
            )


def upgrade() -> None:
    op.execute(CASEFOLD_LOWERED_SQL)
    op.execute(PRINCIPAL_SQL)
    _rebuild_indexes()
    for table, column in PRINCIPAL_COLUMNS:
        add_form_check(table, column, f"ck_{table}_{column}_nonblank", "kind:name")


def downgrade() -> None:
    for table, column in PRINCIPAL_COLUMNS:
        op.drop_constraint(op.f(f"ck_{table}_{column}_form"), table, type_="check")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{column}_nonblank CHECK (btrim({column}) <> '')")
    op.execute(PRINCIPAL_0003_SQL)
    op.execute("DROP FUNCTION ki_casefold_lowered(text)")
    _rebuild_indexes()
