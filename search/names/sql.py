"""The identity preflight's SQL: which documents the caller may see carry a name the query contains, and
their versions.

The decisions are pure (`search.names.keys`); this module only reads. The look-up is the one ACL statement
(`ki.acl.visible_carriers`) narrowed to the documents carrying the keys, so its rows are only documents the
caller may see: a name that hidden documents carry returns what a name nobody carries does, and the per-name
cap counts visible documents. What the caller may see of their versions is decided by the SQL re-verify
(`search.access.reverify`), as for every hit.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text

from ki.acl import Unresolved, Walk, visible_carriers
from ki.settings import SecuritySettings
from search.names.keys import NamedDocument, NameKey, VersionRow, carried

_VERSIONS_SQL = text(
    """
    SELECT v.id, v.document_id, v.status, v.doc_date, v.version_no, d.latest_final_version_id
    FROM document_versions v JOIN documents d ON d.id = v.document_id
    WHERE v.document_id = ANY(CAST(:document_ids AS bigint[]))
    """
)


def look_up_names(
    conn: Connection,
    principals: Sequence[str],
    security: SecuritySettings,
    title_keys: Sequence[str],
    identifier_keys: Sequence[str],
    per_name: int,
    walk: Walk = "from_caller",
) -> dict[NameKey, tuple[NamedDocument, ...]]:
    """Per key asked for (as a title, as an identifier): the documents (not soft-deleted) carrying it that the
    caller may see, at most `per_name + 1` (so that "more than `per_name`" is known); an empty tuple when none
    does."""
    found: dict[NameKey, list[NamedDocument]] = {("title", k): [] for k in title_keys}
    found.update({("identifier", k): [] for k in identifier_keys})
    carriers = visible_carriers(conn, Unresolved.of(principals), security, title_keys, identifier_keys, walk=walk)
    for c in sorted(carriers, key=lambda c: c.document_id):
        named = found[(c.why, c.key)]  # type: ignore[index]
        if len(named) <= per_name:
            named.append(NamedDocument(c.document_id, c.project_id, c.title, c.why, c.key))  # type: ignore[arg-type]
    return {key: tuple(documents) for key, documents in found.items()}


def named_documents(
    conn: Connection,
    principals: Sequence[str],
    security: SecuritySettings,
    title_keys: Sequence[str],
    identifier_keys: Sequence[str],
    per_name: int,
) -> tuple[list[NamedDocument], set[str]]:
    """Documents the caller may see (not soft-deleted) whose title key or one of whose identifier keys is among
    the keys given, and the keys carried by more than `per_name` such documents (whose carriers are left out)."""
    return carried(look_up_names(conn, principals, security, title_keys, identifier_keys, per_name), per_name)


def subject_versions(conn: Connection, document_ids: Sequence[int]) -> tuple[list[VersionRow], dict[int, int | None]]:
    """Every version of the given documents, and each document's latest final version pointer."""
    if not document_ids:
        return [], {}
    rows = conn.execute(_VERSIONS_SQL, {"document_ids": sorted(set(document_ids))}).all()
    versions = [VersionRow(int(r.id), int(r.document_id), str(r.status), r.doc_date, int(r.version_no)) for r in rows]
    return versions, {int(r.document_id): r.latest_final_version_id for r in rows}
