"""The ranking's SQL reads; the logic they feed is in the pure modules beside them.

Graph augmentation and the authoritative boost (search.ranking.augment): the forward `references` edges of the
seed documents, and a document type's ontology node, on a connection `search.ports.SqlReader` lends (it maps
PostgreSQL's errors). The mode gate (search.ranking.mode_gate): the newest self-eval report, read by
`search.ports.ModeGateReader` in the background.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import BigInteger

from ki.clients import database_errors
from search.ranking.fusion import Candidate
from search.ranking.mode_gate import SelfEvidence, Trust, parse_self_report

_REFERENCES_SQL = text(
    """
    SELECT r.from_document_id, r.to_document_id, d.project_id
    FROM relations r JOIN documents d ON d.id = r.to_document_id
    WHERE r.kind = 'references' AND r.from_document_id = ANY(:seeds) AND d.deleted_at IS NULL
    ORDER BY r.from_document_id, r.to_document_id
    """
).bindparams(bindparam("seeds", type_=ARRAY(BigInteger)))


def cited_documents(conn: Connection, seeds: Sequence[Candidate]) -> list[tuple[int, int, int]]:
    """(citing document, cited document, cited document's project) of every forward `references` edge."""
    ids = sorted({c.document_id for c in seeds})
    if not ids:
        return []
    return [(r.from_document_id, r.to_document_id, r.project_id) for r in conn.execute(_REFERENCES_SQL, {"seeds": ids})]


_DOC_TYPE_SQL = text("SELECT id FROM ontology_nodes WHERE key = :key AND kind = 'doc_type'")


def doc_type_id(conn: Connection, key: str) -> int | None:
    found = conn.execute(_DOC_TYPE_SQL, {"key": key}).scalar()
    return None if found is None else int(found)


_SELF_EVAL_SQL = text("SELECT id, at, decision, report FROM ki_self_eval ORDER BY id DESC LIMIT 1")


async def load_self_evidence(engine: AsyncEngine, trust: Trust) -> SelfEvidence | None:
    """The newest `ki_self_eval` row as evidence (None: no row, or a schema without the table)."""
    with database_errors():  # any other failure comes out as ki.errors
        try:
            async with engine.connect() as conn:
                row = (await conn.execute(_SELF_EVAL_SQL)).first()
        except ProgrammingError:  # not migrated to 0009 yet
            return None
    if row is None:
        return None
    return parse_self_report(int(row.id), row.at.isoformat(timespec="seconds"), str(row.decision), row.report, trust)
