"""The canonical form of a principal, Python's side: `kind:name`, trimmed and casefolded.

A principal names whom a grant, a group membership or an alias is about: `user:anna.schmidt`,
`group:partner`, `role:admin`, `sid:s-1-5-21-…`. Its canonical form is `raw.strip().casefold()` (every
`str.isspace()` character trimmed, full Unicode case folding: "Straße" and "STRASSE" are one name, so are
"ΟΔΟΣ" and "οδοσ"), and it is well-formed when that form is a *kind* of ASCII letters, digits, `_`, `.` or
`-`, a colon, and a non-empty *name* (any characters, colons included). Anything else is not a principal.

Folding must never merge two names that differ in more than case (migration 0007): "anna.ſchmidt" (long s)
folds to "anna.schmidt", the Kelvin sign "K" (U+212A) to "k". So a principal is refused unless its trimmed
form is in Unicode normal form NFC (the Kelvin, Ångström and Ohm signs, and decomposed accents, are not) and
its full case folding equals its lower-casing (no "ß", "ſ", "ﬁ" ...). What remains is plain case --
"Anna.Schmidt" and "anna.schmidt" are one name -- and the Greek final sigma: "ς" is the letter "σ" at the
end of a word (lower-casing writes it for a final "Σ", by context), so "οδος" and "οδοσ" stay one name.

The ACL compares principals only in SQL, with `ki_principal(x)` (migration 0004), which is this definition
(proved on every code point where casefolding differs from lower-casing, and on random text, by
`tests/integration/test_acl_properties.py`). Python uses it where principals enter without passing
PostgreSQL: settings (`security.admin_principals`, `security.aliases`) and bearer tokens.
"""

from __future__ import annotations

import re
import unicodedata

#: A well-formed canonical principal (fullmatch). `.` spans newlines, as in PostgreSQL's regular expressions.
KIND_NAME = re.compile(r"[a-z0-9_.-]+:.+", re.DOTALL)


def canonical_principal(raw: object) -> str | None:
    """The canonical form of `raw`, or None when it is not a well-formed principal (not a string, blank,
    no kind, a kind outside `[a-z0-9_.-]`, not NFC, or folding would change more than case or sigma)."""
    if not isinstance(raw, str):
        return None
    trimmed = raw.strip()
    if not unicodedata.is_normalized("NFC", trimmed):
        return None
    value = trimmed.casefold()
    return value if value == trimmed.lower().replace("ς", "σ") and KIND_NAME.fullmatch(value) else None


def check_principal(raw: str) -> str:
    """`raw` unchanged when it is a well-formed principal; ValueError with the reason otherwise."""
    if canonical_principal(raw) is None:
        raise ValueError(
            f"{raw!r} is not a principal: expected kind:name (kind of ASCII letters, digits, '_', '.', '-'; "
            "e.g. user:anna.schmidt, group:partner), in NFC, without letters that case folding rewrites (ß, ſ, ﬁ)"
        )
    return raw
