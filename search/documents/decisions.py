"""Decision search: decision records scored in SQL by token overlap, returned only when the caller may
see what they rest on.

Scoring: the query and each record's `locus`, `change_summary` and `rationale` are lower-cased and split
into alphanumeric tokens in SQL (ICU collation, so umlauts and ß are letters); a record's score is the
share of the query's distinct tokens it contains. Records sharing no token are not candidates. Order:
overlap descending, then newest first, then id descending.

Access, decided only through `ki.acl` (the one ACL semantics). A record's *anchors* are its document and
its evidence source objects. It is returned only if

* it has at least one anchor (a record resting on nothing fails closed);
* its document, if set, has a version the caller may see;
* every evidence source object is *confirmed*: some version the caller may see is actively observed at
  that object and at no other object. `ki.acl` decides per version, not per observation, so a version
  that is also observed elsewhere could be visible through the other object only; it cannot vouch for
  this one. Evidence that only such versions carry fails closed;
* one of its confirmed anchors lies in the record's own project (a deny on that project wins).

Everything is decided in one statement (the one ACL statement, `ki.acl.visible_statement`, narrowed to the
versions that can vouch for a scoring record's anchors): the records the caller may not see never leave
PostgreSQL, so the rows the service reads are a function of what the caller may see (hidden decisions
neither add rows nor statements: `tests/integration/test_trace_equivalence.py`). It answers the requested
window plus one row (for `has_more`). Candidates are bounded first by the caller's compiled scope (the scope
stage's, cached per caller): a record outside the caller's visible projects, or resting on a document the caller
may not see, would be refused anyway, so it is no candidate -- a query word that only a hidden record carries is
then matched against no record at all, and PostgreSQL judges no hidden anchor for it (`ki bench authz-timing`,
case `decisions`: that judging made a hidden word slower, P 0.59 under load).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Text

from ki.acl import caller_params, resolve_caller, visible_statement
from ki.settings import SecuritySettings
from search.request import DecisionSearchRequest

_TOKENS = """regexp_split_to_array(lower(({expr}) COLLATE "und-x-icu"), '[^[:alnum:]]+')"""

_SCORING_CTES = f"""
    query_tokens AS (
        SELECT DISTINCT t FROM unnest({_TOKENS.format(expr="CAST(:query AS text)")}) AS t WHERE t <> ''
    ),
    scoring AS (
        SELECT dr.id, dr.project_id, dr.document_id, dr.locus, dr.change_summary, dr.rationale,
               dr.evidence_source_object_ids, dr.created_at,
               ARRAY(SELECT q.t FROM query_tokens q WHERE q.t = ANY(rt.tokens) ORDER BY q.t) AS matched
        FROM decision_records dr
        CROSS JOIN LATERAL (
            SELECT {_TOKENS.format(expr="dr.locus || ' ' || dr.change_summary || ' ' || dr.rationale")} AS tokens
        ) rt
        WHERE (CAST(:project_ids AS bigint[]) IS NULL OR dr.project_id = ANY(CAST(:project_ids AS bigint[])))
          AND (CAST(:document_ids AS bigint[]) IS NULL OR dr.document_id = ANY(CAST(:document_ids AS bigint[])))
          -- The caller's compiled scope (the projects and documents of the versions they may see): a record of a
          -- project, or resting on a document, outside it is refused below anyway, so it is no candidate -- and
          -- what a hidden record matches is never judged, whatever the query.
          AND (CAST(:scope_projects AS bigint[]) IS NULL
               OR dr.project_id IN (SELECT unnest(CAST(:scope_projects AS bigint[]))))
          AND (CAST(:scope_documents AS bigint[]) IS NULL OR dr.document_id IS NULL
               OR dr.document_id IN (SELECT unnest(CAST(:scope_documents AS bigint[]))))
    ),
    scored AS MATERIALIZED (SELECT * FROM scoring WHERE cardinality(matched) > 0),
    anchor_documents AS MATERIALIZED (SELECT DISTINCT document_id FROM scored WHERE document_id IS NOT NULL),
    anchor_objects AS MATERIALIZED (SELECT DISTINCT unnest(evidence_source_object_ids) AS object_id FROM scored),
"""

# The versions judged: every version of an anchor document, and every version actively observed at an
# anchor object.
_ANCHOR_NARROWING = """AND (d.id IN (SELECT document_id FROM anchor_documents)
               OR dv.id IN (SELECT o.document_version_id FROM source_observations o
                            WHERE o.deleted_at IS NULL
                              AND o.source_object_id IN (SELECT object_id FROM anchor_objects)))"""

# The rules of the module docstring over the verdicts: a visible document's projects, an evidence object
# confirmed by a visible version observed there and nowhere else (with that version's project).
_ADMITTED_SELECT = """,
    document_projects AS (SELECT DISTINCT document_id, project_id FROM verdicts),
    vouching AS (
        SELECT DISTINCT o.source_object_id AS object_id, v.project_id
        FROM verdicts v
        JOIN source_observations o ON o.document_version_id = v.version_id AND o.deleted_at IS NULL
        WHERE o.source_object_id IN (SELECT object_id FROM anchor_objects)
          AND (SELECT count(DISTINCT o2.source_object_id) FROM source_observations o2
               WHERE o2.document_version_id = v.version_id AND o2.deleted_at IS NULL) = 1
    )
    SELECT s.*, cardinality(s.matched) AS overlap, (SELECT count(*) FROM query_tokens) AS query_tokens
    FROM scored s
    WHERE (s.document_id IS NOT NULL OR cardinality(s.evidence_source_object_ids) > 0)
      AND (s.document_id IS NULL OR s.document_id IN (SELECT document_id FROM document_projects))
      AND NOT EXISTS (SELECT 1 FROM unnest(s.evidence_source_object_ids) AS e(object_id)
                      WHERE e.object_id NOT IN (SELECT object_id FROM vouching))
      AND (EXISTS (SELECT 1 FROM document_projects p
                   WHERE p.document_id = s.document_id AND p.project_id = s.project_id)
           OR EXISTS (SELECT 1 FROM vouching w
                      WHERE w.object_id = ANY(s.evidence_source_object_ids) AND w.project_id = s.project_id))
    ORDER BY overlap DESC, s.created_at DESC, s.id DESC
    LIMIT :wanted
"""

_ADMITTED_SQL = visible_statement(_SCORING_CTES, _ANCHOR_NARROWING, _ADMITTED_SELECT).bindparams(
    bindparam("query", type_=Text),
    bindparam("project_ids", type_=ARRAY(BigInteger)),
    bindparam("document_ids", type_=ARRAY(BigInteger)),
    bindparam("scope_projects", type_=ARRAY(BigInteger)),
    bindparam("scope_documents", type_=ARRAY(BigInteger)),
)

#: Up to this many visible documents a decision search sends the caller's document ids as candidates' bound;
#: a larger scope is bounded by its projects only (its records on hidden documents of those projects are then
#: judged when the query matches them: the residual for callers of very many documents).
SCOPE_DOCUMENTS_MAX = 50_000


@dataclass(frozen=True)
class ScopeBound:
    """Which records may be candidates at all: those of the caller's visible projects, resting on a visible
    document or on none (None: no bound, as for a caller without a compiled scope)."""

    project_ids: Sequence[int] | None = None
    document_ids: Sequence[int] | None = None

    @classmethod
    def of(cls, project_ids: Sequence[int], document_ids: Sequence[int]) -> ScopeBound:
        documents = list(document_ids) if len(document_ids) <= SCOPE_DOCUMENTS_MAX else None
        return cls(list(project_ids), documents)


UNBOUNDED = ScopeBound()


@dataclass(frozen=True)
class DecisionHit:
    decision_id: int
    project_id: int
    document_id: int | None
    locus: str
    change_summary: str
    rationale: str
    evidence_source_object_ids: tuple[int, ...]
    created_at: dt.datetime
    score: float
    matched_tokens: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "project_id": self.project_id,
            "document_id": self.document_id,
            "locus": self.locus,
            "change_summary": self.change_summary,
            "rationale": self.rationale,
            "evidence_source_object_ids": list(self.evidence_source_object_ids),
            "created_at": self.created_at.isoformat(),
            "score": self.score,
            "matched_tokens": list(self.matched_tokens),
        }


@dataclass(frozen=True)
class DecisionPage:
    hits: list[DecisionHit]
    offset: int
    limit: int
    has_more: bool

    def to_json(self, timings: bool = False) -> dict[str, Any]:
        """As `SearchResult.to_json` (a decision page carries no timings to show)."""
        return {
            "hits": [h.to_json() for h in self.hits],
            "offset": self.offset,
            "limit": self.limit,
            "has_more": self.has_more,
        }


def search_decisions(
    conn: Connection,
    raw_principals: Sequence[str],
    security: SecuritySettings,
    request: DecisionSearchRequest,
    bound: ScopeBound = UNBOUNDED,
) -> DecisionPage:
    """The requested window of decision records the caller may see, best token overlap first; candidates only
    within `bound` (the caller's compiled scope)."""
    caller = resolve_caller(conn, raw_principals, security)
    params = {
        **caller_params(caller, security),
        "query": request.query,
        "project_ids": request.filters.project_id,
        "document_ids": request.filters.document_id,
        "scope_projects": bound.project_ids,
        "scope_documents": bound.document_ids,
        "wanted": request.window + 1,  # one more than the window tells whether another page exists
    }
    # Asked for an anonymous caller too (who sees nothing): the same statements whoever asks.
    rows = conn.execute(_ADMITTED_SQL, params).all()
    admitted = [
        DecisionHit(
            r.id,
            r.project_id,
            r.document_id,
            r.locus,
            r.change_summary,
            r.rationale,
            tuple(int(o) for o in r.evidence_source_object_ids),
            r.created_at,
            r.overlap / r.query_tokens,
            tuple(r.matched),
        )
        for r in rows
    ]
    page = admitted[request.offset : request.window]
    return DecisionPage(page, request.offset, request.limit, len(admitted) > request.window)
