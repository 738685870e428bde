"""A version's text as a caller may read it: `GET /v1/documents/{id}/versions/{version_id}/text` and the MCP
`read_document` tool. From PostgreSQL, the source of truth, never from the index.

Access is the document view of `search.documents.read` (the one ACL statement over the document's versions):
a version the caller may not see, of a document they may or may not see, is answered like one that does not
exist (None here, 404 over HTTP), by the same statements -- the text is read only once the version is known
visible. The text is read in Unicode NFC, and offsets and lengths count its characters (code points), so a
slice read twice is the same string, and its SHA-256 (over the slice's UTF-8) lets a citation be checked
against the text that was read; the whole version's hash comes with every slice. Passages that read as
instructions to a model are flagged (`injection`, spans into `text`) or, with `api.evidence.injection`
"redact", replaced in `text` -- the hashes and offsets stay those of the stored text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.types import BigInteger, Integer

from ki.settings import SecuritySettings
from search.documents.read import visible_versions_of
from search.documents.sources import source_refs, sources_json
from search.evidence.citations import sha256_hex, text_permalink
from search.evidence.injection import Mode, marked

_SLICE_SQL = text(
    """
    SELECT substr(t.body, :start, :length) AS slice, char_length(t.body) AS total,
           encode(sha256(convert_to(t.body, 'UTF8')), 'hex') AS version_sha256
    FROM (SELECT normalize(text, NFC) AS body FROM document_versions
          WHERE id = :version_id AND document_id = :document_id) t
    """
).bindparams(
    bindparam("version_id", type_=BigInteger),
    bindparam("document_id", type_=BigInteger),
    bindparam("start", type_=Integer),
    bindparam("length", type_=Integer),
)


def stored_slice(conn: Connection, document_id: int, version_id: int, offset: int, length: int) -> tuple[str, int, str]:
    """`length` characters of the stored version text (NFC) from `offset`, the text's length in characters and
    the SHA-256 of the whole text. Only for a version the caller was found to see."""
    row = conn.execute(
        _SLICE_SQL, {"version_id": version_id, "document_id": document_id, "start": offset + 1, "length": length}
    ).one()
    return str(row.slice), int(row.total), str(row.version_sha256)


def read_text(
    conn: Connection,
    principals: Sequence[str],
    security: SecuritySettings,
    document_id: int,
    version_id: int | None,
    offset: int,
    length: int,
    injection: Mode = "flag",
    source_urls: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """`length` characters of the version's text from `offset` (None: no such version the caller may see).
    `version_id` None: the version the document is cited by (its latest final visible, else newest visible)."""
    seen = visible_versions_of(conn, principals, security, [document_id]).get(document_id)
    if seen is None:
        return None
    shown = {v.version_id: v for v in seen.versions}
    version = seen.cited if version_id is None else shown.get(version_id)
    if version is None:
        return None
    slice_, total, version_sha256 = stored_slice(conn, document_id, version.version_id, offset, length)
    refs = source_refs(conn, version.source_object_ids)
    end = offset + len(slice_)
    handed_out, checked = marked(slice_, injection)  # the hash and the offsets stay the stored text's
    return {
        "document_id": document_id,
        "version_id": version.version_id,
        "version_no": version.version_no,
        "status": version.status,
        "latest_final": version.version_id == seen.latest_final_version_id,
        "offset": offset,
        "length": len(slice_),
        "total_chars": total,
        "next_offset": end if end < total else None,
        "text": handed_out,
        "injection": checked,
        "evidence": {
            "sha256": sha256_hex(slice_),
            "version_sha256": version_sha256,
            "permalink": text_permalink(document_id, version.version_id, offset, len(slice_)),
            "source_object_ids": list(version.source_object_ids),
            "sources": sources_json(version.source_object_ids, refs, source_urls or {}),
        },
    }
