"""The canonical form of a principal, Python's side: `kind:name`, trimmed and casefolded.

A principal names whom a grant, a group membership or an alias is about: `user:anna.schmidt`,
`group:partner`, `role:admin`, `sid:s-1-5-21-…`. Its canonical form is `raw.strip().casefold()` (every
`str.isspace()` character trimmed, full Unicode case folding: "Straße" and "STRASSE" are one name, so are
"ΟΔΟΣ" and "οδοσ"), and it is well-formed when that form is a *kind* of ASCII letters, digits, `_`, `.` or
`-`, a colon, and a non-empty *name* (any characters, colons included). Anything else is not a principal.

The ACL compares principals only in SQL, with `ki_principal(x)` (migration 0004), which is this definition
(proved on every code point where casefolding differs from lower-casing, and on random text, by
`tests/integration/test_acl_properties.py`). Python uses it where principals enter without passing
PostgreSQL: settings (`security.admin_principals`, `security.aliases`) and bearer tokens.
"""

from __future__ import annotations

import re

#: A well-formed canonical principal (fullmatch). `.` spans newlines, as in PostgreSQL's regular expressions.
KIND_NAME = re.compile(r"[a-z0-9_.-]+:.+", re.DOTALL)


def canonical_principal(raw: object) -> str | None:
    """The canonical form of `raw`, or None when it is not a well-formed principal (not a string, blank,
    no kind, or a kind outside `[a-z0-9_.-]`)."""
    if not isinstance(raw, str):
        return None
    value = raw.strip().casefold()
    return value if KIND_NAME.fullmatch(value) else None


def check_principal(raw: str) -> str:
    """`raw` unchanged when it is a well-formed principal; ValueError with the reason otherwise."""
    if canonical_principal(raw) is None:
        raise ValueError(
            f"{raw!r} is not a principal: expected kind:name (kind of ASCII letters, digits, '_', '.', '-'; "
            "e.g. user:anna.schmidt, group:partner)"
        )
    return raw
