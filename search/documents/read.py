"""Documents and their relations as a caller may see them: `GET /v1/documents/{id}`, its related documents
and `POST /v1/traverse`. SQL only; every document shown is checked through `ki.acl` (the one ACL), and
each carries the version it is cited by and the source objects the caller may cite it at.

A document is visible when at least one of its versions is (`ki.acl.visible_observations`); only those
versions are listed, numbered among themselves, and its latest final version is one of them
(`search.access.version_view`), so nothing shown depends on a version the caller may not see. A document the
caller may not see is answered exactly like one that does not exist (`None` here, 404 over HTTP), and by
the same SQL statements: the one ACL statement reads the documents' versions itself, so whether any
version row exists decides nothing before it (`tests/integration/test_constant_shape.py`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Boolean, Text

from ki.acl import Unresolved, VisibleObservation, neighbour_relations, visible_observations
from ki.settings import SecuritySettings
from search.access.version_view import VersionFacts, by_document, latest_final, shown_numbers
from search.documents.graph import Direction, Edge, Neighbours, Traversal, steps, traverse

_IDS = bindparam("ids", type_=ARRAY(BigInteger))

_DOCUMENTS_SQL = text(
    """
    SELECT d.id, d.project_id, d.title, d.identifiers, d.latest_final_version_id,
           d.matter_id, m.title AS matter_title, m.reference AS matter_reference,
           d.doc_type_id, n.key AS doc_type_key, n.label AS doc_type_label
    FROM documents d
    LEFT JOIN matters m ON m.id = d.matter_id
    LEFT JOIN ontology_nodes n ON n.id = d.doc_type_id
    WHERE d.id = ANY(:ids) AND d.deleted_at IS NULL
    """
).bindparams(_IDS)

# Characters of each version's text as `search.documents.text` reads it (NFC): what a reader pages through.
_LENGTHS_SQL = text(
    "SELECT id, char_length(normalize(text, NFC)) AS chars FROM document_versions WHERE id = ANY(:ids)"
).bindparams(_IDS)

# The frontier's edges (of the wanted kinds and directions) whose other end is among `ends`: documents the
# caller may see.
_EDGES_SQL = text(
    """
    SELECT kind, from_document_id, to_document_id FROM relations
    WHERE (CAST(:kinds AS text[]) IS NULL OR kind = ANY(CAST(:kinds AS text[])))
      AND ((CAST(:outgoing AS boolean) AND from_document_id = ANY(:ids) AND to_document_id = ANY(:ends))
           OR (CAST(:incoming AS boolean) AND to_document_id = ANY(:ids) AND from_document_id = ANY(:ends)))
    """
).bindparams(
    _IDS,
    bindparam("ends", type_=ARRAY(BigInteger)),
    bindparam("kinds", type_=ARRAY(Text)),
    bindparam("outgoing", type_=Boolean),
    bindparam("incoming", type_=Boolean),
)


@dataclass(frozen=True)
class VisibleVersionRow:
    version_id: int
    version_no: int  # as the caller is shown it: the position among their versions of the document
    status: str
    doc_date: dt.date | None
    language: str
    source_object_ids: tuple[int, ...]


@dataclass(frozen=True)
class VisibleDocument:
    """A document as one caller sees it: their versions in upstream order, and the latest final of them."""

    versions: list[VisibleVersionRow]
    latest_final_version_id: int | None

    @property
    def cited(self) -> VisibleVersionRow:
        """The version the document is cited by: the latest final one, else the newest one."""
        return next((v for v in self.versions if v.version_id == self.latest_final_version_id), self.versions[-1])


def visible_versions_of(
    conn: Connection, principals: Sequence[str], security: SecuritySettings, document_ids: Collection[int]
) -> dict[int, VisibleDocument]:
    """Per document, the versions the caller may see, with the source objects the caller may cite them at;
    documents without such a version are absent. One statement, whatever exists."""
    ids = sorted({int(d) for d in document_ids})
    if not ids:
        return {}
    observations = visible_observations(conn, Unresolved.of(principals), security, ids, of="documents")
    cited: dict[int, set[int]] = {}
    first: dict[int, VisibleObservation] = {}
    for o in observations:
        cited.setdefault(o.version_id, set()).add(o.source_object_id)
        first.setdefault(o.version_id, o)
    facts = [VersionFacts(o.version_id, o.document_id, o.version_no, o.status, o.doc_date) for o in first.values()]
    numbers = shown_numbers(facts)
    latest = latest_final(facts, {o.document_id: o.latest_final_version_id for o in first.values()})
    out: dict[int, VisibleDocument] = {}
    for v in by_document(facts).values():
        rows = [
            VisibleVersionRow(
                f.version_id,
                numbers[f.version_id],
                f.status,
                f.doc_date,
                first[f.version_id].language,
                tuple(sorted(cited[f.version_id])),
            )
            for f in v
        ]
        out[v[0].document_id] = VisibleDocument(rows, latest[v[0].document_id])
    return out


def _summary(doc: Any, seen: VisibleDocument) -> dict[str, Any]:
    cited = seen.cited
    return {
        "document_id": doc.id,
        "project_id": doc.project_id,
        "title": doc.title,
        "citation": {
            "project_id": doc.project_id,
            "document_id": doc.id,
            "version_id": cited.version_id,
            "source_object_ids": list(cited.source_object_ids),
        },
    }


def summaries(
    conn: Connection, principals: Sequence[str], security: SecuritySettings, document_ids: Collection[int]
) -> dict[int, dict[str, Any]]:
    """A short, citable view of each document the caller may see among `document_ids`."""
    versions = visible_versions_of(conn, principals, security, document_ids)
    if not versions:
        return {}
    docs = conn.execute(_DOCUMENTS_SQL, {"ids": sorted(versions)}).all()
    return {d.id: _summary(d, versions[d.id]) for d in docs if d.id in versions}


def get_document(
    conn: Connection, principals: Sequence[str], security: SecuritySettings, document_id: int
) -> dict[str, Any] | None:
    """The document with every version the caller may see, or None (not visible, or no such document)."""
    seen = visible_versions_of(conn, principals, security, [document_id]).get(document_id)
    if seen is None:
        return None
    doc = conn.execute(_DOCUMENTS_SQL, {"ids": [document_id]}).one()
    lengths = conn.execute(_LENGTHS_SQL, {"ids": [v.version_id for v in seen.versions]})
    chars = {int(r.id): int(r.chars) for r in lengths}
    return {
        **_summary(doc, seen),
        "identifiers": list(doc.identifiers or []),
        "matter": None
        if doc.matter_id is None
        else {"matter_id": doc.matter_id, "title": doc.matter_title, "reference": doc.matter_reference},
        "doc_type": None
        if doc.doc_type_id is None
        else {"doc_type_id": doc.doc_type_id, "key": doc.doc_type_key, "label": doc.doc_type_label},
        "latest_final_version_id": seen.latest_final_version_id,  # among the caller's versions (version_view)
        "versions": [
            {
                "version_id": v.version_id,
                "version_no": v.version_no,
                "status": v.status,
                "doc_date": v.doc_date.isoformat() if v.doc_date else None,
                "language": v.language,
                "latest_final": v.version_id == seen.latest_final_version_id,
                "source_object_ids": list(v.source_object_ids),
                "chars": chars[v.version_id],  # read on: GET .../versions/{version_id}/text
            }
            for v in seen.versions
        ],
    }


def _visible_ids(
    conn: Connection, principals: Sequence[str], security: SecuritySettings
) -> Callable[[Collection[int]], set[int]]:
    """Which of some documents the caller may see (through `ki.acl`, like everything here)."""
    return lambda ids: set(visible_versions_of(conn, principals, security, ids))


def _visible_neighbours(
    conn: Connection,
    principals: Sequence[str],
    security: SecuritySettings,
    kinds: Collection[str] | None,
    direction: Direction,
) -> Neighbours:
    """One level of a traversal in two statements, whatever exists: the visible documents the frontier's
    relations lead to (the one ACL statement, narrowed by the relations in SQL), then the edges between the
    frontier and the documents the caller may see. No edge to a hidden document reaches the service."""
    relations = neighbour_relations(kinds, direction)

    def neighbours(frontier: Collection[int], known: Collection[int]) -> tuple[list[Edge], set[int]]:
        ids = sorted({int(d) for d in frontier})
        seen = visible_observations(conn, Unresolved.of(principals), security, ids, of="neighbours",
                                    relations=relations)  # fmt: skip
        allowed = {o.document_id for o in seen}
        ends = sorted(allowed | {int(d) for d in known} | set(ids))
        rows = conn.execute(_EDGES_SQL, {"ids": ids, "ends": ends, **relations})
        return [Edge(r.kind, r.from_document_id, r.to_document_id) for r in rows], allowed

    return neighbours


def related(
    conn: Connection,
    principals: Sequence[str],
    security: SecuritySettings,
    document_id: int,
    *,
    kinds: Collection[str] | None,
    direction: Direction,
    limit: int,
) -> dict[str, Any] | None:
    """The typed, directed edges of a visible document whose other end the caller may also see (None: the
    document itself is not visible)."""
    found = traverse(
        [document_id],
        visible=_visible_ids(conn, principals, security),
        neighbours=_visible_neighbours(conn, principals, security, kinds, direction),
        depth=1,
        fanout=limit,
        kinds=kinds,
        direction=direction,
    )
    if found.not_found:
        return None
    shown = summaries(conn, principals, security, found.nodes)
    items = [
        {"kind": s.edge.kind, "direction": s.direction, "document": shown[s.other]}
        for s in steps(found.edges, document_id, kinds, direction)
        if s.other in shown and s.other != document_id
    ]
    return {"document_id": document_id, "related": items, "truncated": found.truncated}


def traversal_json(
    conn: Connection, principals: Sequence[str], security: SecuritySettings, found: Traversal
) -> dict[str, Any]:
    shown = summaries(conn, principals, security, found.nodes)
    nodes = [
        {**shown[d], "depth": depth}
        for d, depth in sorted(found.nodes.items(), key=lambda x: (x[1], x[0]))
        if d in shown
    ]
    kept = {n["document_id"] for n in nodes}
    edges = [
        {"kind": e.kind, "from_document_id": e.from_id, "to_document_id": e.to_id}
        for e in found.edges
        if e.from_id in kept and e.to_id in kept
    ]
    return {"nodes": nodes, "edges": edges, "not_found": found.not_found, "truncated": found.truncated}


def run_traversal(
    conn: Connection,
    principals: Sequence[str],
    security: SecuritySettings,
    starts: Sequence[int],
    *,
    kinds: Collection[str] | None,
    direction: Direction,
    depth: int,
    fanout: int,
) -> dict[str, Any]:
    found = traverse(
        starts,
        visible=_visible_ids(conn, principals, security),
        neighbours=_visible_neighbours(conn, principals, security, kinds, direction),
        depth=depth,
        fanout=fanout,
        kinds=kinds,
        direction=direction,
    )
    return traversal_json(conn, principals, security, found)
