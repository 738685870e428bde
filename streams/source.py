"""What the sync reads from PostgreSQL, the authority: dirty keys resolved to versions, each version's
state and principal projection, and what a version's rows were built from beside their content.

Blocking (SQLAlchemy): `streams.sync.Projector` calls it in a thread, through its `VersionSource`
interface, so that the projector's decisions can be tested without a database.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Text

from ki import table_roles
from ki.acl import GrantedPrincipals, expand_principals, version_projections
from ki.settings import SecuritySettings
from projections.dirty import DirtyKeys, WrittenWith
from projections.rows import DocumentState, NotableClause, VersionState

_IDS = ARRAY(BigInteger)


def _sql(statement: str, **types: Any) -> Any:
    return text(statement).bindparams(*(bindparam(name, type_=t) for name, t in types.items()))


_EXISTING = _sql("SELECT id FROM document_versions WHERE id = ANY(:ids)", ids=_IDS)

# Which (table, row, transaction) triples name a row that transaction was the last to write: its xmin, a 32-bit
# xid, equals the transaction id Debezium reports (compared modulo 2^32 should a connector report the epoch too).
# The tables are the registry's, never input.
_POINTED_AT = sorted({table for t in table_roles.CAPTURED for _, table in t.points_at})
_WRITTEN_BY = _sql(
    "SELECT a.tbl, a.id, a.tx FROM unnest(CAST(:tables AS text[]), :ids, :txs) AS a(tbl, id, tx) WHERE CASE a.tbl "
    + " ".join(
        f"WHEN '{table}' THEN EXISTS (SELECT 1 FROM {table} t WHERE t.id = a.id"
        " AND t.xmin::text::bigint = a.tx % 4294967296)"
        for table in _POINTED_AT
    )
    + " ELSE false END",
    tables=ARRAY(Text),
    ids=_IDS,
    txs=_IDS,
)

# Dirty keys -> version ids. Each statement returns one column `id`.
_RESOLVE_CONTENT = _sql(
    """
    SELECT id FROM document_versions WHERE id = ANY(:versions)
    UNION SELECT dv.id FROM document_versions dv WHERE dv.document_id = ANY(:documents)
    UNION SELECT dv.id FROM document_versions dv JOIN documents d ON d.id = dv.document_id
          WHERE d.matter_id = ANY(:matters)
    UNION SELECT dv.id FROM document_versions dv JOIN documents d ON d.id = dv.document_id
          WHERE d.doc_type_id IN (SELECT sub.id FROM unnest(CAST(:nodes AS bigint[])) AS n(node_id),
                                  LATERAL ontology_descendants(n.node_id) AS sub)
    """,
    versions=_IDS,
    documents=_IDS,
    matters=_IDS,
    nodes=_IDS,
)

_RESOLVE_ACCESS = _sql(
    """
    WITH touched_grants AS (
        SELECT project_id, document_id, source_object_id FROM grants
        WHERE ki_principal(principal) = ANY(CAST(:principals AS text[]))
    ),
    touched_projects AS (
        SELECT unnest(CAST(:projects AS bigint[])) AS id
        UNION SELECT project_id FROM touched_grants WHERE project_id IS NOT NULL
    ),
    touched_documents AS (
        SELECT unnest(CAST(:documents AS bigint[])) AS id
        UNION SELECT document_id FROM touched_grants WHERE document_id IS NOT NULL
    ),
    touched_objects AS (
        SELECT unnest(CAST(:objects AS bigint[])) AS id
        UNION SELECT source_object_id FROM touched_grants WHERE source_object_id IS NOT NULL
        UNION SELECT so.id FROM source_objects so WHERE so.source_id = ANY(:sources)
    )
    SELECT id FROM document_versions WHERE id = ANY(:versions)
    UNION SELECT dv.id FROM document_versions dv WHERE dv.document_id IN (SELECT id FROM touched_documents)
    UNION SELECT dv.id FROM document_versions dv JOIN documents d ON d.id = dv.document_id
          WHERE d.project_id IN (SELECT id FROM touched_projects)
    UNION SELECT o.document_version_id FROM source_observations o
          WHERE o.source_object_id IN (SELECT id FROM touched_objects)
    """,
    principals=ARRAY(Text),
    projects=_IDS,
    documents=_IDS,
    objects=_IDS,
    sources=_IDS,
    versions=_IDS,
)

_VERSION_STATE = _sql(
    """
    SELECT dv.id, dv.document_id, dv.version_no, dv.status, dv.language, dv.doc_date, dv.text,
           dv.notable_clauses,
           d.project_id, d.title, d.matter_id, d.doc_type_id, d.identifiers, d.latest_final_version_id,
           d.deleted_at, d.promoted, d.expires_at, now() AS read_at,
           m.title AS matter_title, m.reference AS matter_reference,
           t.label AS doc_type_label,
           COALESCE((SELECT array_agg(a.id ORDER BY a.depth) FROM ontology_ancestors(d.doc_type_id) a),
                    '{}') AS doc_type_ancestors,
           (SELECT min(o.source_object_id) FROM source_observations o
             WHERE o.document_version_id = dv.id AND o.deleted_at IS NULL) AS source_object_id
    FROM document_versions dv
    JOIN documents d ON d.id = dv.document_id
    LEFT JOIN matters m ON m.id = d.matter_id
    LEFT JOIN ontology_nodes t ON t.id = d.doc_type_id
    WHERE dv.id = ANY(:ids)
    """,
    ids=_IDS,
)


# Documents whose expiry passed in (since, now] by PostgreSQL's clock (all expired ones without `since`), and
# that clock: what the access lane's sweep re-projects (migration 0013's partial index serves it).
_EXPIRED_SINCE = _sql(
    """
    SELECT now() AS now,
           coalesce((SELECT array_agg(id ORDER BY id) FROM documents
                     WHERE expires_at IS NOT NULL AND expires_at <= now()
                       AND (CAST(:since AS timestamptz) IS NULL OR expires_at > CAST(:since AS timestamptz))),
                    '{}') AS ids
    """,
)


_FIRST_OBSERVATION = _sql(
    """
    SELECT dv.id, (SELECT min(o.source_object_id) FROM source_observations o
                    WHERE o.document_version_id = dv.id AND o.deleted_at IS NULL) AS source_object_id
    FROM document_versions dv WHERE dv.id = ANY(:ids)
    """,
    ids=_IDS,
)


@dataclass(frozen=True)
class VersionSnapshot:
    """One version as PostgreSQL holds it, with what its rows repeat from the document, matter and type."""

    document: DocumentState
    version: VersionState
    doc_type_ancestors: tuple[int, ...]
    doc_type_label: str | None
    matter_title: str | None
    matter_reference: str | None
    source_object_id: int | None
    #: PostgreSQL's clock when it was read: what the document's expiry is judged against (as `ki.acl` does).
    read_at: datetime | None = None


def _snapshot(row: Any) -> VersionSnapshot:
    clauses = tuple(
        NotableClause(
            clause_type_id=c.get("clause_type_id"), locus=str(c.get("locus") or ""), text=str(c.get("text") or "")
        )
        for c in (row.notable_clauses or [])
        if isinstance(c, dict)
    )
    return VersionSnapshot(
        document=DocumentState(
            id=row.document_id,
            project_id=row.project_id,
            title=row.title,
            matter_id=row.matter_id,
            doc_type_id=row.doc_type_id,
            identifiers=tuple(row.identifiers or ()),
            latest_final_version_id=row.latest_final_version_id,
            deleted_at=row.deleted_at,
            promoted=bool(row.promoted),
            expires_at=row.expires_at,
        ),
        version=VersionState(
            id=row.id,
            document_id=row.document_id,
            version_no=row.version_no,
            status=row.status,
            language=row.language,
            doc_date=row.doc_date,
            text=row.text,
            notable_clauses=clauses,
        ),
        doc_type_ancestors=tuple(row.doc_type_ancestors or ()),
        doc_type_label=row.doc_type_label,
        matter_title=row.matter_title,
        matter_reference=row.matter_reference,
        source_object_id=row.source_object_id,
        read_at=row.read_at,
    )


@dataclass(frozen=True)
class AccessBasis:
    """What a version's rows were built from beside their content: its principal projection and its first
    active observation (`meta.source_object_id`). A content write that took minutes compares this with
    PostgreSQL afterwards: a grant or observation committed meanwhile means projecting the version again."""

    granted: GrantedPrincipals
    source_object_id: int | None

    @classmethod
    def of(cls, granted: GrantedPrincipals | None, source_object_id: int | None) -> AccessBasis:
        return cls(granted or GrantedPrincipals((), ()), source_object_id)


class PostgresSource:
    """The sync's reads, one short connection each."""

    def __init__(self, engine: Engine, security: SecuritySettings) -> None:
        self.engine = engine
        self.security = security

    def existing(self, version_ids: Sequence[int]) -> set[int]:
        """Those of these versions that still exist in PostgreSQL."""
        with self.engine.connect() as conn:
            return {row.id for row in conn.execute(_EXISTING, {"ids": list(version_ids)})}

    def resolve(self, keys: DirtyKeys) -> tuple[set[int], set[int]]:
        """The versions that exist in PostgreSQL and whose content, resp. whose access, `keys` dirtied."""
        with self.engine.connect() as conn:
            content = {
                row.id
                for row in conn.execute(
                    _RESOLVE_CONTENT,
                    {
                        # An observation change (access_versions) can also change a row's
                        # meta.source_object_id, which only the content path writes; that path re-embeds
                        # nothing unless the text changed.
                        "versions": sorted(keys.content_versions | keys.access_versions),
                        "documents": sorted(keys.content_documents),
                        "matters": sorted(keys.content_matters),
                        "nodes": sorted(keys.content_ontology_nodes),
                    },
                )
            }
            access: set[int] = set()
            if keys.names_access:
                access = {
                    row.id
                    for row in conn.execute(
                        _RESOLVE_ACCESS,
                        {
                            # A changed alias or membership of P changes the projection of every
                            # grant to a principal P resolves to (ki.acl.version_projections).
                            "principals": sorted(expand_principals(conn, keys.access_principals, self.security)),
                            "projects": sorted(keys.access_projects),
                            "documents": sorted(keys.access_documents),
                            "objects": sorted(keys.access_source_objects),
                            "sources": sorted(keys.access_sources),
                            "versions": sorted(keys.access_versions),
                        },
                    )
                    if row.id is not None
                }
        return content, access

    def written_by(self, anchors: Collection[WrittenWith]) -> set[WrittenWith]:
        """Those of `anchors` whose row their transaction was the last to write."""
        if not anchors:
            return set()
        listed = list(anchors)
        columns = {"tables": [a.table for a in listed], "ids": [a.row_id for a in listed]}
        with self.engine.connect() as conn:
            found = conn.execute(_WRITTEN_BY, {**columns, "txs": [a.tx_id for a in listed]})
            return {WrittenWith(row.tbl, row.id, row.tx) for row in found}

    def versions(self, version_ids: Sequence[int]) -> tuple[dict[int, VersionSnapshot], dict[int, GrantedPrincipals]]:
        """The state and the principal projection of each version that still exists."""
        with self.engine.connect() as conn:
            states = {row.id: _snapshot(row) for row in conn.execute(_VERSION_STATE, {"ids": list(version_ids)})}
            grants = version_projections(conn, states.keys(), self.security)
        return states, grants

    def expired_since(self, since: datetime | None) -> tuple[list[int], datetime]:
        """The documents whose `expires_at` passed after `since` (None: every expired one) and PostgreSQL's
        clock now, the next sweep's `since`."""
        with self.engine.connect() as conn:
            row = conn.execute(_EXPIRED_SINCE, {"since": since}).one()
        return [int(i) for i in row.ids], row.now

    def grants(self, version_ids: Sequence[int]) -> dict[int, GrantedPrincipals]:
        with self.engine.connect() as conn:
            return version_projections(conn, version_ids, self.security)

    def access_bases(self, version_ids: Sequence[int]) -> dict[int, AccessBasis]:
        if not version_ids:
            return {}
        with self.engine.connect() as conn:
            grants = version_projections(conn, version_ids, self.security)
            objects = {
                row.id: row.source_object_id for row in conn.execute(_FIRST_OBSERVATION, {"ids": list(version_ids)})
            }
        return {v: AccessBasis.of(grants.get(v), objects.get(v)) for v in version_ids}
