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

Candidates are read in score order in batches and checked batch by batch until the requested window
(plus one row, for `has_more`) is filled, so paging never needs more than the window plus a batch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Text

from ki.acl import Caller, resolve_caller, visible_versions
from ki.settings import SecuritySettings
from search.request import DecisionSearchRequest

_TOKENS = """regexp_split_to_array(lower(({expr}) COLLATE "und-x-icu"), '[^[:alnum:]]+')"""

_CANDIDATES_SQL = text(
    f"""
    WITH q AS (
        SELECT DISTINCT t FROM unnest({_TOKENS.format(expr="CAST(:query AS text)")}) AS t WHERE t <> ''
    ),
    scored AS (
        SELECT dr.id, dr.project_id, dr.document_id, dr.locus, dr.change_summary, dr.rationale,
               dr.evidence_source_object_ids, dr.created_at,
               ARRAY(SELECT q.t FROM q WHERE q.t = ANY(rt.tokens) ORDER BY q.t) AS matched
        FROM decision_records dr
        CROSS JOIN LATERAL (
            SELECT {_TOKENS.format(expr="dr.locus || ' ' || dr.change_summary || ' ' || dr.rationale")} AS tokens
        ) rt
        WHERE (CAST(:project_ids AS bigint[]) IS NULL OR dr.project_id = ANY(CAST(:project_ids AS bigint[])))
          AND (CAST(:document_ids AS bigint[]) IS NULL OR dr.document_id = ANY(CAST(:document_ids AS bigint[])))
    )
    SELECT s.*, cardinality(s.matched) AS overlap, (SELECT count(*) FROM q) AS query_tokens
    FROM scored s
    WHERE cardinality(s.matched) > 0
    ORDER BY overlap DESC, s.created_at DESC, s.id DESC
    LIMIT :batch OFFSET :skip
    """
).bindparams(
    bindparam("query", type_=Text),
    bindparam("project_ids", type_=ARRAY(BigInteger)),
    bindparam("document_ids", type_=ARRAY(BigInteger)),
)

# The versions that can vouch for a batch's anchors: every version of its documents, and every version
# actively observed at one of its evidence objects, with the number of objects it is actively observed at.
_ANCHOR_VERSIONS_SQL = text(
    """
    SELECT dv.id AS version_id, NULL::bigint AS object_id, 0::bigint AS active_objects
    FROM document_versions dv
    WHERE dv.document_id = ANY(CAST(:document_ids AS bigint[]))
    UNION ALL
    SELECT o.document_version_id, o.source_object_id,
           (SELECT count(DISTINCT o2.source_object_id) FROM source_observations o2
            WHERE o2.document_version_id = o.document_version_id AND o2.deleted_at IS NULL)
    FROM source_observations o
    WHERE o.source_object_id = ANY(CAST(:object_ids AS bigint[])) AND o.deleted_at IS NULL
    """
).bindparams(bindparam("document_ids", type_=ARRAY(BigInteger)), bindparam("object_ids", type_=ARRAY(BigInteger)))


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


@dataclass(frozen=True)
class Anchors:
    """What the caller may see among a batch's anchors (all decided by `ki.acl.visible_versions`)."""

    document_projects: dict[int, set[int]]  # visible document -> projects of its visible versions
    object_projects: dict[int, set[int]]  # confirmed evidence object -> projects of the vouching versions

    def admits(self, project_id: int, document_id: int | None, evidence: Sequence[int]) -> bool:
        if document_id is None and not evidence:
            return False
        projects: set[int] = set()
        if document_id is not None:
            if document_id not in self.document_projects:
                return False
            projects |= self.document_projects[document_id]
        for obj in evidence:
            if obj not in self.object_projects:
                return False
            projects |= self.object_projects[obj]
        return project_id in projects


def visible_anchors(
    conn: Connection,
    caller: Caller,
    security: SecuritySettings,
    document_ids: Sequence[int],
    object_ids: Sequence[int],
) -> Anchors:
    rows = conn.execute(
        _ANCHOR_VERSIONS_SQL, {"document_ids": sorted(set(document_ids)), "object_ids": sorted(set(object_ids))}
    ).all()
    version_ids = sorted({r.version_id for r in rows})
    visible = {v.version_id: v for v in visible_versions(conn, caller, security, version_ids=version_ids)}
    documents: dict[int, set[int]] = {}
    for v in visible.values():
        documents.setdefault(v.document_id, set()).add(v.project_id)
    objects: dict[int, set[int]] = {}
    for r in rows:
        vouching = visible.get(r.version_id)
        if vouching is not None and r.object_id is not None and r.active_objects == 1:
            objects.setdefault(r.object_id, set()).add(vouching.project_id)
    wanted = set(document_ids)
    return Anchors({d: p for d, p in documents.items() if d in wanted}, objects)


def search_decisions(
    conn: Connection,
    raw_principals: Sequence[str],
    security: SecuritySettings,
    request: DecisionSearchRequest,
    *,
    batch: int = 200,
) -> DecisionPage:
    """The requested window of decision records the caller may see, best token overlap first."""
    caller = resolve_caller(conn, raw_principals, security)
    if caller.is_anonymous:
        return DecisionPage([], request.offset, request.limit, False)
    params = {
        "query": request.query,
        "project_ids": request.filters.project_id,
        "document_ids": request.filters.document_id,
        "batch": batch,
    }
    wanted = request.window + 1  # one more than the window tells whether another page exists
    admitted: list[DecisionHit] = []
    skip = 0
    while len(admitted) < wanted:
        rows = conn.execute(_CANDIDATES_SQL, {**params, "skip": skip}).all()
        skip += len(rows)
        # Asked even for no rows: a word found only in decisions the caller may not see runs the same
        # statements as a word found nowhere (constant shape: neither timing nor a trace tells them apart).
        anchors = visible_anchors(
            conn,
            caller,
            security,
            [r.document_id for r in rows if r.document_id is not None],
            [int(o) for r in rows for o in r.evidence_source_object_ids],
        )
        for r in rows:
            evidence = tuple(int(o) for o in r.evidence_source_object_ids)
            if anchors.admits(r.project_id, r.document_id, evidence):
                admitted.append(
                    DecisionHit(
                        r.id,
                        r.project_id,
                        r.document_id,
                        r.locus,
                        r.change_summary,
                        r.rationale,
                        evidence,
                        r.created_at,
                        r.overlap / r.query_tokens,
                        tuple(r.matched),
                    )
                )
        if len(rows) < batch:
            break
    page = admitted[request.offset : request.window]
    return DecisionPage(page, request.offset, request.limit, len(admitted) > request.window)
