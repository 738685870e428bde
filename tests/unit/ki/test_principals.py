"""The canonical form of a principal in Python (`ki.principals`) and the case-folding table migration 0004
gives SQL: the table must be what Python's `str.casefold` says, or SQL and Python fold differently
(the SQL side itself is compared with Python on PostgreSQL by `tests/integration/test_acl_properties.py`)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from ki.db.migrate import MIGRATIONS_DIR
from ki.principals import canonical_principal, check_principal

CODE_POINTS = [chr(c) for c in range(1, sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]


def _migration_0004() -> ModuleType:
    path = MIGRATIONS_DIR / "versions" / "0004_casefolded_principals.py"
    spec = importlib.util.spec_from_file_location("ki_migration_0004", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migrations_table_is_pythons_casefold() -> None:
    """Every lower-case code point whose casefold is not itself, mapped to that casefold. A Python whose
    Unicode database folds differently fails here: the table (and SQL) then needs a new migration."""
    expected = {c: c.casefold() for c in CODE_POINTS if c.lower() == c and c.casefold() != c}
    table = _migration_0004().CASEFOLD
    assert table == expected, {c: (table.get(c), expected.get(c)) for c in set(table) ^ set(expected)}


def test_casefold_is_the_table_applied_to_the_lower_case() -> None:
    """What `ki_principal` relies on: lower-case first (ICU, as `str.lower()`), then map the table's code
    points; for every code point, and across a final sigma (lower-cased in context, folded without)."""
    table = _migration_0004().CASEFOLD

    def fold(text: str) -> str:
        return "".join(table.get(c, c) for c in text.lower())

    assert [c for c in CODE_POINTS if fold(c) != c.casefold()] == []
    for text in ("ΟΔΟΣ", "ΟΔΟΣ ΣΑΣ", "Σ", "AΣ", "AΣ\u0345", "ẞΣ"):
        assert fold(text) == text.casefold()


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("  User:Anna.Schmidt\u3000", "user:anna.schmidt"),
        ("GROUP:STRASSE", "group:strasse"),
        ("role:ΟΔΟΣ", "role:οδοσ"),  # lower-cased to a final "ς": the letter "σ"
        ("role:οδος σας", "role:οδοσ σασ"),
        ("user:Jürgen", "user:jürgen"),
        # Folding would merge these with a name that differs in more than case (migration 0007).
        ("group:Straße", None),
        ("user:anna.\u017fchmidt", None),
        ("user:katharina.\u212arueger", None),
        ("user:\ufb01nn", None),
        ("user:ju\u0308rgen", None),  # decomposed: not NFC
        ("sid:S-1-5-21-7-1100", "sid:s-1-5-21-7-1100"),
        ("mail:anna@kanzlei-demo.de:x", "mail:anna@kanzlei-demo.de:x"),
        ("anna.schmidt@kanzlei-demo.de", None),  # no kind: not a principal
        ("user:", None),
        (":anna", None),
        ("sp group:x", None),
        ("grüppe:x", None),
        ("\t\u2028", None),
        (None, None),
        (7, None),
    ],
)
def test_canonical_principal(raw: object, canonical: str | None) -> None:
    assert canonical_principal(raw) == canonical


def test_check_principal_names_the_value_and_the_form() -> None:
    assert check_principal("User:Anna") == "User:Anna"  # validated, kept as written
    with pytest.raises(ValueError, match=r"'anna@kanzlei-demo\.de' is not a principal: expected kind:name"):
        check_principal("anna@kanzlei-demo.de")
