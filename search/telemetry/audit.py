"""The access audit: one row per API request (HTTP `/v1/...` and MCP tool calls) in `ki_access_audit`
(migration 0008) -- the caller's principals (as the token names them), the endpoint (route template or
`mcp:<tool>`), the status, and the ids of the documents the answer named. What compliance asks after an
incident: who saw which document when, and who kept asking about things they may not see.

Rows are written in batches off the request path (`search.telemetry.batches`), kept `api.audit.retention_days`, and
read back by administrators only (`GET /v1/audit`). A row is lost only when PostgreSQL refuses the write
or the buffer overflows; both are logged and counted (`ki_audit_rows_dropped_total`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import Text

from ki.settings import ApiSettings
from search.telemetry.batches import BatchWriter, batch_limits


@dataclass(frozen=True)
class AccessRecord:
    principals: tuple[str, ...]
    endpoint: str
    status: int
    document_ids: tuple[int, ...]
    version_ids: tuple[int, ...] = ()


def read_versions(answer: Any) -> tuple[int, ...]:
    """The version whose text an answer of ours showed (reading: `search.documents.text`)."""
    if isinstance(answer, dict) and "text" in answer and isinstance(answer.get("version_id"), int):
        return (answer["version_id"],)
    return ()


def named_documents(answer: Any) -> tuple[int, ...]:
    """The ids of the documents an answer of ours names: search and decision hits, a document, its related
    documents, a traversal's nodes, a lookup's document or candidates (sorted, distinct)."""
    found: set[int] = set()
    if not isinstance(answer, dict):
        return ()
    if isinstance(answer.get("document_id"), int) and ("versions" in answer or "related" in answer or "text" in answer):
        found.add(answer["document_id"])
    for hit in answer.get("hits") or []:
        if isinstance(hit, dict) and isinstance(hit.get("document_id"), int):
            found.add(hit["document_id"])
    for item in answer.get("related") or []:
        document = item.get("document") if isinstance(item, dict) else None
        if isinstance(document, dict) and isinstance(document.get("document_id"), int):
            found.add(document["document_id"])
    for candidate in answer.get("candidates") or []:  # a lookup's `ambiguous` answer
        if isinstance(candidate, dict) and isinstance(candidate.get("document_id"), int):
            found.add(candidate["document_id"])
    if answer.get("outcome") == "found" and isinstance(answer.get("document_id"), int):  # a lookup's one document
        found.add(answer["document_id"])
    for node in answer.get("nodes") or []:
        if isinstance(node, dict) and isinstance(node.get("document_id"), int):
            found.add(node["document_id"])
    return tuple(sorted(found))


_INSERT = text(
    """
    INSERT INTO ki_access_audit (principals, endpoint, status, document_ids, version_ids)
    VALUES (CAST(:principals AS text[]), :endpoint, :status, CAST(:document_ids AS bigint[]),
            CAST(:version_ids AS bigint[]))
    """
)
_EXPIRE = text("DELETE FROM ki_access_audit WHERE at < now() - make_interval(days => :days)")


class AuditLog(BatchWriter[AccessRecord]):
    def __init__(self, engine: AsyncEngine, api: ApiSettings, on_dropped: Any = None) -> None:
        async def write(conn: AsyncConnection, rows: list[AccessRecord]) -> None:
            params = [
                {
                    "principals": list(r.principals),
                    "endpoint": r.endpoint,
                    "status": r.status,
                    "document_ids": list(r.document_ids),
                    "version_ids": list(r.version_ids),
                }  # fmt: skip
                for r in rows
            ]
            await conn.execute(_INSERT, params)
            await conn.execute(_EXPIRE, {"days": api.audit.retention_days})

        super().__init__(engine, "access audit", write, **batch_limits(api), on_dropped=on_dropped)


_READ = text(
    """
    SELECT at, principals, endpoint, status, document_ids, version_ids FROM ki_access_audit
    WHERE at >= now() - make_interval(hours => :hours)
      AND (CAST(:principal AS text) IS NULL OR CAST(:principal AS text) = ANY(principals))
    ORDER BY at DESC, id DESC
    LIMIT :limit
    """
).bindparams(bindparam("principal", type_=Text))


def read_audit(conn: Connection, hours: int, principal: str | None, limit: int) -> list[dict[str, Any]]:
    """The newest rows of the last `hours` (of one principal as the token named it, if given)."""
    rows = conn.execute(_READ, {"hours": hours, "principal": principal, "limit": limit}).all()
    return [
        {
            "at": r.at.astimezone(dt.UTC).isoformat(),
            "principals": list(r.principals),
            "endpoint": r.endpoint,
            "status": r.status,
            "document_ids": list(r.document_ids),
            "version_ids": list(r.version_ids),
        }
        for r in rows
    ]


def record_of(principals: Sequence[str], endpoint: str, status: int, answer: Any) -> AccessRecord:
    if status != 200:
        return AccessRecord(tuple(principals), endpoint, status, ())
    return AccessRecord(tuple(principals), endpoint, status, named_documents(answer), read_versions(answer))
