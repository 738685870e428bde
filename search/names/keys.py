"""Identity preflight: the documents a query *names* -- by an identifier (Aktenzeichen, contract number,
statute reference) or by its exact title -- found before anything is ranked.

Names are compared as *identity keys* (`identity_key`): NFC, casefolded, every separator run (spaces,
punctuation, `§`, dashes, quotes) one space, and a space between a digit and a letter. So `§573 BGB`,
`§ 573 BGB` and `§ 573  bgb` are one key, as are `5 U 123/22`, `5U 123-22` and `5 u 123 22`. A name is
*in* a query when its key is a whole-token run of the query's key (`query_grams`); keys of fewer than
`MIN_KEY_CHARS` characters name nothing. The same function exists in SQL (`ki_identity_key`, migration
0005, indexed on titles and identifiers); `tests/integration/test_identity_sql.py` proves them equal.

What a query names is decided by `resolve` (pure): a named key contained in another named key is
*shadowed* (`Atlas Migration` inside `Atlas Migration Weekly Plan`, `§ 573 BGB` inside `Gutachten zu
§ 573 BGB – X`): it leaves the identity group and keeps its rank on merit. A key that names more than
`max_candidates` visible documents is *common* (a citation many documents carry, a generic title) and
names no subject. What is left names the subjects: one document -> `unique`, several -> `ambiguous`,
none -> `none`. Only documents the caller may see ever take part (the caller's scope is applied before
anything is counted), so no outcome reveals that an invisible document carries a name.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

MIN_KEY_CHARS = 3  # characters of a key without its spaces; shorter names ("§ 1", "AG") name nothing
MAX_KEY_CHARS = 256  # identifier keys are indexed up to this length; longer names are not looked up

# Separators besides ASCII punctuation and controls (everything in ASCII but [0-9a-z] after casefolding):
# Python's str.isspace() characters beyond ASCII, and the punctuation of German legal text.
UNICODE_SEPARATORS = (
    "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f"
    "\u205f\u3000"  # whitespace
    "\u00a7\u00b6\u00ab\u00bb\u00b7\u00ad\u00b4"  # § ¶ « » · soft hyphen ´
    "\u200b\u2060\ufeff"  # zero-width space, word joiner, BOM
    "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"  # hyphens, dashes, minus
    "\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\u2026\u2032\u2033"  # quotes, … ′ ″
)
_SEPARATOR = re.compile("[^0-9a-z\u0080-\U0010ffff]|[" + UNICODE_SEPARATORS + "]")
_DIGIT_THEN_OTHER = re.compile("([0-9])([^0-9 ])")
_OTHER_THEN_DIGIT = re.compile("([^0-9 ])([0-9])")
_SPACES = re.compile(" +")

Why = Literal["identifier", "title"]
Outcome = Literal["unique", "ambiguous", "none", "off"]
NameKey = tuple[Why, str]  # a key looked up as a title or as an identifier


def identity_key(text: str) -> str:
    """The form in which names are compared (the SQL function `ki_identity_key` computes the same)."""
    folded = unicodedata.normalize("NFC", text).casefold()
    spaced = _SEPARATOR.sub(" ", folded)
    spaced = _OTHER_THEN_DIGIT.sub(r"\1 \2", _DIGIT_THEN_OTHER.sub(r"\1 \2", spaced))
    return _SPACES.sub(" ", spaced).strip(" ")


def names_something(key: str) -> bool:
    return len(key.replace(" ", "")) >= MIN_KEY_CHARS and len(key) <= MAX_KEY_CHARS


def query_grams(query: str, max_tokens: int) -> list[str]:
    """Every whole-token run of the query's key, up to `max_tokens` tokens, that could be a name."""
    tokens = identity_key(query).split(" ")
    grams: dict[str, None] = {}
    for start in range(len(tokens)):
        for end in range(start + 1, min(start + max_tokens, len(tokens)) + 1):
            gram = " ".join(tokens[start:end])
            if names_something(gram):
                grams[gram] = None
    return list(grams)


def name_grams(
    query: str, *, max_title_tokens: int, min_title_tokens: int, max_identifier_tokens: int
) -> tuple[list[str], list[str]]:
    """The keys to look up as titles and as identifiers. A title of fewer than `min_title_tokens` tokens
    ("Anxiety", "Kündigung") names its document only when it is the whole query: inside a longer query
    such a word is a topic, not a name."""
    grams = query_grams(query, max(max_title_tokens, max_identifier_tokens))
    whole = identity_key(query)
    titles = [g for g in grams if min_title_tokens - 1 <= g.count(" ") < max_title_tokens or g == whole]
    identifiers = [g for g in grams if g.count(" ") < max_identifier_tokens]
    return titles, identifiers


def contains(outer: str, inner: str) -> bool:
    """`inner` is a whole-token run of `outer` (keys)."""
    return f" {inner} " in f" {outer} "


@dataclass(frozen=True)
class NamedDocument:
    """A document carrying a name that occurs in the query: `key` is its title's or one identifier's key."""

    document_id: int
    project_id: int
    title: str
    why: Why
    key: str


@dataclass(frozen=True)
class Subject:
    """A document the query names, with the most specific name that names it."""

    document_id: int
    title: str
    why: Why
    key: str
    version_id: int | None = None  # the version its hit shows (set once the caller's access is verified)

    def to_json(self) -> dict[str, object]:
        return {
            "document_id": self.document_id,
            "version_id": self.version_id,
            "title": self.title,
            "why": self.why,
            "matched": self.key,
        }


@dataclass(frozen=True)
class Identity:
    outcome: Outcome
    subjects: tuple[Subject, ...] = ()
    shadowed: tuple[str, ...] = ()  # named keys inside a more specific named key
    common: tuple[str, ...] = ()  # named keys carried by too many documents to name one
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def unique(self) -> Subject | None:
        return self.subjects[0] if self.outcome == "unique" else None

    def to_json(self) -> dict[str, object]:
        return {
            "outcome": self.outcome,
            "subjects": [s.to_json() for s in self.subjects],
            "shadowed": list(self.shadowed),
            "common": list(self.common),
            **self.extra,
        }


OFF = Identity("off")
NONE = Identity("none")


def carried(entries: Mapping[NameKey, Sequence[NamedDocument]], per_name: int) -> tuple[list[NamedDocument], set[str]]:
    """The named documents of a look-up (per key, its carriers: at most `per_name + 1`), and the keys
    carried by more than `per_name` documents (`saturated`: common for every caller, their carriers left
    out)."""
    saturated = {key for (_, key), documents in entries.items() if len(documents) > per_name}
    named = [d for (_, key), documents in entries.items() if key not in saturated for d in documents]
    return named, saturated


def resolve(named: Iterable[NamedDocument], max_candidates: int, saturated: Collection[str] = ()) -> Identity:
    """What the query names, given the named documents the caller may see (see the module doc).
    `saturated`: keys the database holds on so many documents that the lookup stopped counting (common
    for every caller). Subjects come most specific name first (longest key), then by document id."""
    by_key: dict[str, dict[int, NamedDocument]] = {}
    for n in named:
        by_key.setdefault(n.key, {}).setdefault(n.document_id, n)
    keys = sorted(by_key, key=lambda k: (-len(k), k))
    shadowed = [k for k in keys if any(other != k and contains(other, k) for other in keys)]
    live = [k for k in keys if k not in shadowed]
    common = [k for k in live if len(by_key[k]) > max_candidates or k in saturated]
    subjects: dict[int, Subject] = {}
    for key in live:
        if key in common:
            continue
        for doc in sorted(by_key[key].values(), key=lambda d: (d.why != "identifier", d.document_id)):
            subjects.setdefault(doc.document_id, Subject(doc.document_id, doc.title, doc.why, key))
    found = tuple(subjects.values())
    outcome: Outcome = "none" if not found else "unique" if len(found) == 1 else "ambiguous"
    if len(found) > max_candidates:  # several names, together too many documents: nothing is named
        return Identity("none", (), tuple(shadowed), tuple(common) + tuple(k for k in live if k not in common))
    return Identity(outcome, found, tuple(shadowed), tuple(common))


@dataclass(frozen=True)
class VersionRow:
    """A version of a subject document, as the point-in-time choice needs it."""

    version_id: int
    document_id: int
    status: str
    doc_date: dt.date | None
    version_no: int


POINT_IN_TIME_STATUSES = frozenset({"final", "executed"})


def choose_versions(
    versions: Iterable[VersionRow],
    visible: Collection[int],
    latest_final: Mapping[int, int | None],
    as_of: dt.date | None,
) -> dict[int, int]:
    """Per subject document, the version its identity hit shows, chosen among the versions the caller may
    see (`visible`) only, so that no choice depends on a version the caller may not see: with `as_of`, the
    latest final or executed version dated on or before it; else the latest final version (`latest_final`,
    as the caller sees it: `search.access.version_view`), or the highest-numbered one. Documents without such a
    version are left out."""
    by_document: dict[int, list[VersionRow]] = {}
    for v in versions:
        if v.version_id in visible:
            by_document.setdefault(v.document_id, []).append(v)
    chosen: dict[int, int] = {}
    for document_id, rows in by_document.items():
        if as_of is not None:
            dated = [
                v for v in rows if v.status in POINT_IN_TIME_STATUSES and v.doc_date is not None and v.doc_date <= as_of
            ]
            pick = max(dated, key=lambda v: (v.doc_date, v.version_no), default=None)
            version_id = pick.version_id if pick else None
        else:
            final = latest_final.get(document_id)
            best = max(rows, key=lambda v: v.version_no, default=None)
            version_id = final if final in visible else best.version_id if best else None
        if version_id is not None:
            chosen[document_id] = version_id
    return chosen


def keep_subjects(identity: Identity, chosen: Mapping[int, int]) -> Identity:
    """The identity with only the subjects that have a version to show (their outcome recounted)."""
    subjects = tuple(replace(s, version_id=chosen[s.document_id]) for s in identity.subjects if s.document_id in chosen)
    outcome: Outcome = "none" if not subjects else "unique" if len(subjects) == 1 else "ambiguous"
    return Identity(outcome, subjects, identity.shadowed, identity.common, identity.extra)
