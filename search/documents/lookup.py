"""Exact coordinates: one document and version by an identifier or an exact title, never a ranking
(`POST /v1/lookup`, the MCP tool `lookup_document`; issue 49, item 1).

The answer is one of three, typed by `outcome`:

- `found`: exactly one document the caller may see carries the name; with the version in force at `as_of` (the
  latest final or executed version dated on or before it), else the version it is cited by (its latest final
  one, else its newest), both among the caller's versions (`search.documents.read.visible_versions_of`); and,
  where a statute provision was asked for and the document is that statute, the provision's heading with its
  character span in the version's text (and the id of the body chunk that holds the heading, from the index).
- `ambiguous`: several do; they are listed in document-id order (never ranked), with the version each would show.
- `not_found`: none does.

Names are compared as the identity preflight compares them (`search.names.keys.identity_key`, in SQL
`ki_identity_key`): NFC, casefolded, every separator run one space, a space between digits and letters. The
name asked is keyed in its NFC form and in its NFKC form (full-width digits, ligatures). A statute provision
(`search.query_words` reads it: `§ 535 Abs. 1 BGB`, `Artikel 3 GG`) is also keyed in its canonical form
(`§ 535 BGB`, `Art. 3 GG`), so `Abs.`, `Satz`, `Artikel`/`Art.` and spacing do not matter.

Which documents carry a name, in tiers (the first tier with a candidate decides):

- an identifier (file number, ECLI, anything else): documents carrying it among their identifiers, then those
  whose title it is;
- a statute provision: the document whose title it is (the provision as a document of its own), then documents
  carrying it among their identifiers (documents citing it), then the statute itself (a document whose title or
  identifier is the law's abbreviation, `BGB`), whose text holds the provision's heading;
- a title: documents whose title key is the key asked.

Access: every carrier is found by the one ACL statement (`ki.acl.visible_carriers`), whose rows are only the
documents the caller may see; then the versions of those candidates by the one ACL statement over documents. A
name that only hidden documents carry therefore runs the same statements, with the same rows, as a name nobody
carries, and is answered `not_found` alike; a hidden second carrier never makes a visible one `ambiguous` and
is never named or counted (`tests/integration/test_constant_shape.py`, `test_trace_equivalence.py`).
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.types import BigInteger, Text

from ki.acl import TITLE_KEY_PREFIX, NamedCarrier, Unresolved, visible_carriers
from ki.errors import RequestInvalid
from ki.settings import SecuritySettings
from projections.text import normalise_text
from search.documents.read import VisibleDocument, VisibleVersionRow, visible_versions_of
from search.evidence.citations import text_permalink as permalink
from search.names.keys import MAX_KEY_CHARS, identity_key
from search.query_words import ParsedQuery, Provision, parse_query
from search.request import LookupRequest

Outcome = Literal["found", "ambiguous", "not_found"]
AskKind = Literal["file_number", "ecli", "provision", "identifier", "title"]
Why = Literal["identifier", "title", "statute"]  # how a candidate carries the name: `statute`, the law's name

#: Candidates listed in an `ambiguous` answer at most (the rest: `truncated`).
MAX_CANDIDATES = 20
#: Carriers whose versions are read at most (the first tiers' first, in document-id order); more: `truncated`.
MAX_DOCUMENTS = 200
POINT_IN_TIME_STATUSES = frozenset({"final", "executed"})


@dataclass(frozen=True)
class Tier:
    """Carriers of `keys` as `why` (`title`, `identifier`, or `statute`: the law's name as title or identifier)."""

    why: Why
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Ask:
    """What a lookup asks for: the name as given, how it was read, and the keys it is looked up by."""

    by: Literal["identifier", "title"]
    text: str
    kind: AskKind
    tiers: tuple[Tier, ...]
    provision: Provision | None = None

    @property
    def title_keys(self) -> list[str]:
        return _distinct(k for t in self.tiers if t.why in ("title", "statute") for k in t.keys)

    @property
    def identifier_keys(self) -> list[str]:
        return _distinct(k for t in self.tiers if t.why in ("identifier", "statute") for k in t.keys)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"by": self.by, "text": self.text, "kind": self.kind}
        if self.provision is not None:
            out["provision"] = provision_name(self.provision, with_parts=True)
        return out


def _distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def key_variants(name: str) -> tuple[str, ...]:
    """The identity keys of `name` in its NFC and NFKC forms (the text normalisation of every indexed text
    first), without empty ones."""
    forms = (normalise_text(name), unicodedata.normalize("NFKC", name))
    return tuple(k for k in _distinct(identity_key(f) for f in forms) if k)


def provision_name(provision: Provision, *, with_parts: bool = False) -> str:
    """The canonical form of a provision: `§ 535 BGB`, `Art. 3 GG`, `Section 5`; with its parts (`Abs. 1 S. 2`)
    when `with_parts`."""
    head = {"paragraph": "§", "article": "Art.", "section": "Section"}[provision.kind]
    parts = [head, provision.number]
    if with_parts:
        labels = (("subsection", "Abs."), ("sentence", "S."), ("item", "Nr."), ("letter", "lit."))
        parts += [f"{label} {value}" for name, label in labels if (value := getattr(provision, name)) is not None]
    if provision.law:
        parts.append(provision.law)
    return " ".join(parts)


def _whole(name: str, start: int, end: int) -> bool:
    """`name[start:end]` is all of `name` but spaces and trailing punctuation."""
    return not name[:start].strip() and not name[end:].strip(" \t\n.,;:")


def ask_for(request: LookupRequest) -> Ask:
    """How the request's name is looked up (pure); a name without letters or digits, or one too long to be a key
    of the index, is a 400 naming the field."""
    if request.title is not None:
        keys = _checked(key_variants(request.title), "title", TITLE_KEY_PREFIX - 1)
        return Ask("title", request.title, "title", (Tier("title", keys),))
    name = request.identifier or ""
    keys = _checked(key_variants(name), "identifier", MAX_KEY_CHARS)
    parsed, whole = _read_whole(name)
    if whole and parsed.provisions:
        provision = parsed.provisions[0]
        named = tuple(_distinct([*keys, *key_variants(provision_name(provision))]))
        tiers = [Tier("title", named), Tier("identifier", named)]
        if provision.law:
            tiers.append(Tier("statute", key_variants(provision.law)))
        return Ask("identifier", name, "provision", tuple(tiers), provision)
    kind: AskKind = parsed.identifiers[0].kind if whole and len(parsed.identifiers) == 1 else "identifier"
    return Ask("identifier", name, kind, (Tier("identifier", keys), Tier("title", keys)))


def _read_whole(name: str) -> tuple[ParsedQuery, bool]:
    """The name as `search.query_words` reads it, and whether all of it is one provision or one identifier. Read
    as given, else in capitals (`viii zr 123/20`), else with its last word in capitals (`§ 535 Satz 1 bgb`): the
    parser knows laws and registers by their capitals; keys are casefolded anyway."""
    head, _, last = name.rstrip().rpartition(" ")
    for text_read in (name, name.upper(), f"{head} {last.upper()}"):
        parsed = parse_query(text_read)
        spans = [s for s in parsed.spans if s.kind in ("provision", "identifier")]
        one = len(parsed.provisions) + len(parsed.identifiers) == 1
        if one and len(spans) == 1 and _whole(text_read, spans[0].start, spans[0].end):
            return parsed, True
    return parsed, False


def _checked(keys: tuple[str, ...], field_name: str, most: int) -> tuple[str, ...]:
    if not keys:
        raise RequestInvalid(field_name, "names nothing: it has no letters or digits")
    if any(len(k) > most for k in keys):
        raise RequestInvalid(field_name, f"too long to be looked up (its key is over {most} characters)")
    return keys


# --- The decision (pure) -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A document the caller may see that carries the name, with the version a lookup would show."""

    document_id: int
    project_id: int
    title: str
    why: Why
    key: str
    version: VisibleVersionRow
    latest_final: bool
    cited_by: bool  # the version is the one the document is cited by (no `as_of`, or it is in force then too)

    def to_json(self) -> dict[str, Any]:
        v = self.version
        return {
            "document_id": self.document_id,
            "project_id": self.project_id,
            "title": self.title,
            "matched": {"why": self.why, "key": self.key},
            "version": {
                "version_id": v.version_id,
                "version_no": v.version_no,
                "status": v.status,
                "doc_date": v.doc_date.isoformat() if v.doc_date else None,
                "language": v.language,
                "latest_final": self.latest_final,
            },
            "citation": {
                "project_id": self.project_id,
                "document_id": self.document_id,
                "version_id": v.version_id,
                "source_object_ids": list(v.source_object_ids),
            },
        }


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    candidates: tuple[Candidate, ...] = ()
    truncated: bool = False  # more candidates than listed

    @property
    def found(self) -> Candidate | None:
        return self.candidates[0] if self.outcome == "found" else None


def version_in_force(seen: VisibleDocument, as_of: dt.date | None) -> VisibleVersionRow | None:
    """The caller's version a lookup shows: with `as_of`, the latest final or executed one dated on or before it
    (by date, then number); else the one the document is cited by."""
    if as_of is None:
        return seen.cited
    dated = [v for v in seen.versions if v.status in POINT_IN_TIME_STATUSES and v.doc_date and v.doc_date <= as_of]
    return max(dated, key=lambda v: (v.doc_date or dt.date.min, v.version_no), default=None)


Matched = dict[int, tuple[NamedCarrier, str]]  # per tier: document id -> its carrier row and the key it matched


def by_tier(ask: Ask, carriers: Iterable[NamedCarrier], project_ids: Collection[int] | None = None) -> list[Matched]:
    """Per tier of `ask`, the carriers it matches (of `project_ids` only, if given), in document-id order."""
    by_key: dict[tuple[str, str], dict[int, NamedCarrier]] = {}
    for c in carriers:
        if project_ids is None or c.project_id in project_ids:
            by_key.setdefault((c.why, c.key), {}).setdefault(c.document_id, c)
    tiers: list[Matched] = []
    for tier in ask.tiers:
        whys = ("title", "identifier") if tier.why == "statute" else (tier.why,)
        matched: Matched = {}
        for key in tier.keys:
            for why in whys:
                for document_id, carrier in by_key.get((why, key), {}).items():
                    matched.setdefault(document_id, (carrier, key))
        tiers.append(dict(sorted(matched.items())))
    return tiers


def to_read(tiers: Sequence[Matched], most: int = MAX_DOCUMENTS) -> tuple[list[int], set[int]]:
    """The documents whose versions are read (at most `most`, the first tiers' first) and those left unread."""
    ordered = list(dict.fromkeys(d for matched in tiers for d in matched))
    return ordered[:most], set(ordered[most:])


def decide(
    ask: Ask,
    carriers: Iterable[NamedCarrier],
    seen: Mapping[int, VisibleDocument],
    as_of: dt.date | None,
    project_ids: Collection[int] | None = None,
    *,
    max_candidates: int = MAX_CANDIDATES,
    unread: Collection[int] = (),
) -> Decision:
    """The outcome, from the carriers the caller may see (`carriers`, as `ki.acl.visible_carriers` answers them)
    and their versions the caller may see (`seen`). The first tier with a candidate decides; within it, one
    candidate is `found`, several `ambiguous` (document-id order, at most `max_candidates`; `truncated` if there
    are more, or carriers whose versions were not read, `unread`: then never `found`)."""
    for tier, matched in zip(ask.tiers, by_tier(ask, carriers, project_ids), strict=True):
        found: list[Candidate] = []
        more = False
        for document_id, (carrier, key) in matched.items():
            view = seen.get(document_id)
            version = version_in_force(view, as_of) if view is not None else None
            more = more or document_id in unread
            if view is None or version is None:
                continue
            latest = version.version_id == view.latest_final_version_id
            cited = version.version_id == view.cited.version_id
            found.append(Candidate(document_id, carrier.project_id, carrier.title, tier.why, key, version, latest,
                                   cited))  # fmt: skip
        if found or more:
            outcome: Outcome = "found" if len(found) == 1 and not more else "ambiguous"
            return Decision(outcome, tuple(found[:max_candidates]), more or len(found) > max_candidates)
    return Decision("not_found")


# --- The provision in a statute's text ---------------------------------------------------------------------------

_HEADS = {
    "paragraph": r"§",
    "article": r"(?:art\.|artikel|art)",
    "section": r"(?:section|sec\.|sect\.)",
}


def heading_patterns(provision: Provision) -> tuple[str, str]:
    """PostgreSQL regular expressions (ARE, newline-sensitive, case-insensitive) for the provision's heading line
    (`§ 535 Inhalt und ...` at the start of a line) and for any heading of its kind (where the provision ends)."""
    head = _HEADS[provision.kind]
    number = re.escape(provision.number)
    return rf"^[[:blank:]]*{head}[[:blank:]]*{number}(?![0-9a-z]).*", rf"^[[:blank:]]*{head}[[:blank:]]*[0-9]"


_HEADING_SQL = text(
    """
    SELECT h.head_pos, char_length(t.body) AS total,
           CASE WHEN h.head_pos > 0
                THEN regexp_instr(t.body, :any_heading, h.head_pos + 1, 1, 0, 'in') ELSE 0 END AS next_pos,
           CASE WHEN h.head_pos > 0 THEN regexp_substr(t.body, :heading, 1, 1, 'in') END AS line
    FROM (SELECT normalize(text, NFC) AS body FROM document_versions
          WHERE id = :version_id AND document_id = :document_id) t
    CROSS JOIN LATERAL (SELECT regexp_instr(t.body, :heading, 1, 1, 0, 'in') AS head_pos) h
    """
).bindparams(
    bindparam("version_id", type_=BigInteger),
    bindparam("document_id", type_=BigInteger),
    bindparam("heading", type_=Text),
    bindparam("any_heading", type_=Text),
)


@dataclass(frozen=True)
class ProvisionSpan:
    """The provision's heading in the version's text (NFC code points, `read_text`'s offsets): from its heading
    line to the next heading of its kind, or the end of the text."""

    heading: str
    start: int
    end: int
    chunk_id: str | None = None

    def to_json(self, document_id: int, version_id: int) -> dict[str, Any]:
        return {
            "heading": self.heading,
            "start": self.start,
            "end": self.end,
            "chunk_id": self.chunk_id,
            "permalink": permalink(document_id, version_id, self.start, self.end - self.start),
        }


def provision_span(start: int, total: int, following: int, line: str | None) -> ProvisionSpan | None:
    """From `_HEADING_SQL`'s 1-based positions (0: not there)."""
    if start <= 0 or line is None:
        return None
    begin = start - 1
    line = line.rstrip("\r")
    heading_at = begin + (len(line) - len(line.lstrip()))
    end = following - 1 if following > 0 else total
    return ProvisionSpan(line.strip(), heading_at, end)


def chunk_body(version_id: int, heading: str, size: int = 50) -> dict[str, Any]:
    """The OpenSearch query for the version's body chunks holding the heading (a version the caller may see)."""
    return {
        "size": size,
        "track_total_hits": False,
        "_source": {"includes": ["text", "meta.ordinal"]},
        "query": {
            "bool": {
                "filter": [
                    {"term": {"document_version_id": str(version_id)}},
                    {"term": {"chunk_kind": "chunk"}},
                ],
                "must": [{"match_phrase": {"text": heading}}],
            }
        },
    }


def chunk_holding(hits: Sequence[Mapping[str, Any]], heading: str) -> str | None:
    """The id of the first body chunk (by ordinal) whose text holds the whole heading line."""
    wanted = normalise_text(heading)
    holding = [
        (int((h.get("_source") or {}).get("meta", {}).get("ordinal", 0)), str(h["_id"]))
        for h in hits
        if wanted in str((h.get("_source") or {}).get("text", ""))
    ]
    return min(holding)[1] if holding else None


# --- The look-up (SQL) ------------------------------------------------------------------------------------------


@dataclass
class Lookup:
    """A lookup's answer before the chunk id is added (`to_json` is the HTTP answer)."""

    ask: Ask
    as_of: dt.date | None
    decision: Decision
    provision: ProvisionSpan | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.decision.outcome, "asked": self.ask.to_json()}
        out["asked"]["as_of"] = self.as_of.isoformat() if self.as_of else None
        found = self.decision.found
        if found is not None:
            out.update(found.to_json())
            if self.ask.provision is not None:
                version_id = found.version.version_id
                span = self.provision
                out["provision"] = None if span is None else span.to_json(found.document_id, version_id)
        elif self.decision.outcome == "ambiguous":
            out["candidates"] = [c.to_json() for c in self.decision.candidates]
            out["truncated"] = self.decision.truncated
        return out

    def with_chunk_of(self, hits: Sequence[Mapping[str, Any]]) -> Lookup:
        """The answer with the id of the body chunk holding the provision's heading, among `hits` (`chunk_query`'s)."""
        if self.provision is None:
            return self
        chunk_id = chunk_holding(hits, self.provision.heading)
        return Lookup(self.ask, self.as_of, self.decision, replace(self.provision, chunk_id=chunk_id))

    def chunk_query(self) -> dict[str, Any] | None:
        """The index query that finds the chunk holding the provision's heading (None: nothing to find)."""
        found = self.decision.found
        if found is None or self.provision is None:
            return None
        return chunk_body(found.version.version_id, self.provision.heading)


def look_up(conn: Connection, principals: Sequence[str], security: SecuritySettings, request: LookupRequest) -> Lookup:
    """The lookup in SQL: the carriers the caller may see (one statement), their versions the caller may see (one
    statement, only if there is a carrier), and for a provision found in a statute, its heading in the version's
    text (one statement). Every statement after the first depends only on what the caller may see."""
    ask = ask_for(request)
    carriers = visible_carriers(conn, Unresolved.of(principals), security, ask.title_keys, ask.identifier_keys)
    projects = set(request.project_id) if request.project_id is not None else None
    read, unread = to_read(by_tier(ask, carriers, projects))
    seen = visible_versions_of(conn, principals, security, read)
    decision = decide(ask, carriers, seen, request.as_of, projects, unread=unread)
    lookup = Lookup(ask, request.as_of, decision)
    found = decision.found
    if found is not None and ask.provision is not None and found.why in ("title", "statute"):
        heading, any_heading = heading_patterns(ask.provision)
        params = {"version_id": found.version.version_id, "document_id": found.document_id, "heading": heading,
                  "any_heading": any_heading}  # fmt: skip
        row = conn.execute(_HEADING_SQL, params).one_or_none()
        if row is not None:
            lookup.provision = provision_span(int(row.head_pos), int(row.total), int(row.next_pos or 0), row.line)
    return lookup
