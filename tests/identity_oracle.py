"""What a query should name, decided from the identity rules as `docs/search-api.md` states them — the
test oracle of the identity preflight. It shares no code with `search/names/keys.py` or the SQL look-up:
plain loops over (document, name) pairs, one small function per rule.

The rules:

1. A name and a query are compared as keys: casefolded, every character that is not a letter or digit
   a space, a space between a digit and a letter, spaces collapsed.
2. A name is *in* a query when its key is a whole-token run of the query's key and has at least 3
   characters besides spaces. Titles of more than `max_title_tokens` tokens and identifiers of more than
   `max_identifier_tokens` are never looked up; a title of fewer than `min_title_tokens` tokens counts
   only when it is the whole query.
3. Only documents the caller may see take part.
4. Shadowing: a named key that is a whole-token run of another named key drops out.
5. Common: a key that more than `max_candidates` visible documents carry, or more than
   `max_documents_per_name` documents at all, names nothing.
6. The documents the remaining keys name are the subjects: none -> "none", one -> "unique", several ->
   "ambiguous" — unless they are more than `max_candidates`, then nothing is named ("none").
7. A unique subject's reason is the kind of its longest remaining key (an identifier before a title when
   one key is both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def name_key(text: str) -> str:
    out: list[str] = []
    previous = " "
    for ch in text.casefold():
        ch = ch if ch.isalnum() else " "
        if ch != " " and previous != " " and ch.isdigit() != previous.isdigit():
            out.append(" ")  # a digit next to a letter: two tokens
        out.append(ch)
        previous = ch
    return " ".join("".join(out).split())


def inside(outer: str, inner: str) -> bool:
    return f" {inner} " in f" {outer} "


@dataclass(frozen=True)
class Name:
    document_id: int
    text: str
    why: str  # "identifier" | "title"


@dataclass(frozen=True)
class Limits:
    max_candidates: int
    max_documents_per_name: int
    max_title_tokens: int
    min_title_tokens: int
    max_identifier_tokens: int


@dataclass(frozen=True)
class Expected:
    outcome: str  # "unique" | "ambiguous" | "none"
    documents: frozenset[int] = frozenset()
    reasons: frozenset[str] = frozenset()  # for "unique": the acceptable match_reason values


def _in_query(name: Name, key: str, query_key: str, limits: Limits) -> bool:
    tokens = len(key.split())
    if len(key.replace(" ", "")) < 3:
        return False
    if name.why == "title":
        if tokens > limits.max_title_tokens:
            return False
        if tokens < limits.min_title_tokens and key != query_key:
            return False
    elif tokens > limits.max_identifier_tokens:
        return False
    return inside(query_key, key)


def expected(
    query: str, names: Iterable[Name], visible: frozenset[int], carriers: Mapping[str, int], limits: Limits
) -> Expected:
    """The outcome for a caller who sees `visible`; `names`: every name of every document; `carriers`:
    per key, how many documents (visible or not) carry it."""
    query_key = name_key(query)
    named: dict[str, dict[int, set[str]]] = {}  # key -> visible document -> whys
    for name in names:
        if name.document_id not in visible:
            continue
        key = name_key(name.text)
        if _in_query(name, key, query_key, limits):
            named.setdefault(key, {}).setdefault(name.document_id, set()).add(name.why)
    live = [k for k in named if not any(other != k and inside(other, k) for other in named)]
    naming = [
        k for k in live
        if len(named[k]) <= limits.max_candidates and carriers.get(k, 0) <= limits.max_documents_per_name
    ]  # fmt: skip
    subjects = {d for k in naming for d in named[k]}
    if not subjects or len(subjects) > limits.max_candidates:
        return Expected("none")
    if len(subjects) > 1:
        return Expected("ambiguous", frozenset(subjects))
    (document,) = subjects
    longest = max(len(k) for k in naming)
    whys = set().union(*(named[k][document] for k in naming if len(k) == longest))
    reasons = {"identifier"} if "identifier" in whys else whys
    return Expected("unique", frozenset(subjects), frozenset(reasons))
