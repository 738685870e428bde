"""A document's versions as one caller sees them: numbered and "latest final" over the visible ones only.

Access is decided per version, so everything an answer says about a document's versions is computed
from the versions the caller may see, never from the document's full list: a caller who sees versions 1
and 3 of a document reads them as its versions 1 and 2, and the latest final version they are shown is
one they may see. Nothing shown then depends on a version the caller may not see.

* **Numbering**: the visible versions in upstream order (`version_no`), numbered 1, 2, ...
* **Latest final**: the upstream pointer (`documents.latest_final_version_id`) when the caller may see
  the version it names, else the highest-numbered visible version whose status is final or executed,
  else none. A pointer to a hidden version and no pointer at all read the same.
* **In force on a day** (`as_of`): the visible final or executed version dated on or before it, latest
  date first, then highest number.
* **Compared with** (a query that asks for a comparison): the version in force on the earlier side's day, or
  for "previous" the last visible final or executed version before the one shown.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FINAL_STATUSES = frozenset({"final", "executed"})


@dataclass(frozen=True)
class VersionFacts:
    """What the view needs of one visible version."""

    version_id: int
    document_id: int
    version_no: int  # upstream's number
    status: str
    doc_date: dt.date | None = None


def by_document(versions: Iterable[VersionFacts]) -> dict[int, list[VersionFacts]]:
    """Visible versions per document, in upstream order."""
    out: dict[int, list[VersionFacts]] = {}
    for v in sorted(versions, key=lambda v: (v.document_id, v.version_no, v.version_id)):
        out.setdefault(v.document_id, []).append(v)
    return out


def shown_numbers(visible: Iterable[VersionFacts]) -> dict[int, int]:
    """Version id -> the number the caller is shown: its position among the document's visible versions."""
    return {
        v.version_id: position
        for versions in by_document(visible).values()
        for position, v in enumerate(versions, start=1)
    }


def latest_final(visible: Iterable[VersionFacts], pointers: Mapping[int, int | None]) -> dict[int, int | None]:
    """Document id -> its latest final version as the caller sees it (the module docstring's rule)."""
    out: dict[int, int | None] = {}
    for document_id, versions in by_document(visible).items():
        pointer = pointers.get(document_id)
        if any(v.version_id == pointer for v in versions):
            out[document_id] = pointer
            continue
        finals = [v for v in versions if v.status in FINAL_STATUSES]
        out[document_id] = finals[-1].version_id if finals else None
    return out


def in_force(visible: Iterable[VersionFacts], as_of: dt.date) -> dict[int, int]:
    """Document id -> its visible version in force on `as_of` (documents without one are absent)."""
    out: dict[int, int] = {}
    for document_id, versions in by_document(visible).items():
        dated = [v for v in versions if v.status in FINAL_STATUSES and v.doc_date is not None and v.doc_date <= as_of]
        if dated:
            out[document_id] = max(dated, key=lambda v: (v.doc_date, v.version_no)).version_id
    return out


def compared_with(versions: Sequence[VersionFacts], shown: int, side: dt.date | str) -> int | None:
    """The version `shown` is compared with, of its document's visible `versions` in upstream order
    (`by_document`): the one in force on `side` (a day), the last final one before `shown` ("previous"), or the
    latest final one ("current"). None: the caller sees no such version."""
    if isinstance(side, dt.date):
        return next(iter(in_force(versions, side).values()), None)
    finals = [v for v in versions if v.status in FINAL_STATUSES]
    if side == "previous":
        at = next(v for v in versions if v.version_id == shown)
        finals = [v for v in finals if (v.version_no, v.version_id) < (at.version_no, at.version_id)]
    return finals[-1].version_id if finals else None
