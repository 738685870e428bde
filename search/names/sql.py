"""The identity preflight's SQL: which documents carry a name the query contains, and their versions.

The decisions are pure (`search.names.keys`); this module only reads. Both statements run on the
re-verify's connections; what the caller may see is decided by the compiled scope and by the SQL
re-verify (`search.service.reverify`, through `ki.acl`), never here.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text

from search.names.keys import NamedDocument, NameKey, VersionRow, carried

# Per name, at most `per_name` documents (+1 to know it has more): a name carried by more documents than
# that is common for every caller, and the look-up stays bounded. Keys equal the indexed expressions of
# migration 0005, so each probe is an index look-up.
_NAMED_SQL = text(
    """
    SELECT g.key, 'title' AS why, d.id AS document_id, d.project_id, d.title
    FROM unnest(CAST(:title_keys AS text[])) AS g(key)
    CROSS JOIN LATERAL (
        SELECT id, project_id, title FROM documents
        WHERE deleted_at IS NULL AND ki_identity_key(title) = g.key
        LIMIT :per_name_plus_one
    ) AS d
    UNION ALL
    SELECT g.key, 'identifier', d.id, d.project_id, d.title
    FROM unnest(CAST(:identifier_keys AS text[])) AS g(key)
    CROSS JOIN LATERAL (
        SELECT id, project_id, title FROM documents
        WHERE deleted_at IS NULL AND ki_identity_keys(identifiers) @> ARRAY[g.key]
        LIMIT :per_name_plus_one
    ) AS d
    """
)

_VERSIONS_SQL = text(
    """
    SELECT v.id, v.document_id, v.status, v.doc_date, v.version_no, d.latest_final_version_id
    FROM document_versions v JOIN documents d ON d.id = v.document_id
    WHERE v.document_id = ANY(CAST(:document_ids AS bigint[]))
    """
)


def look_up_names(
    conn: Connection, title_keys: Sequence[str], identifier_keys: Sequence[str], per_name: int
) -> dict[NameKey, tuple[NamedDocument, ...]]:
    """Per key asked for (as a title, as an identifier): the documents (not soft-deleted) carrying it, at
    most `per_name + 1` (so that "more than `per_name`" is known); an empty tuple when none does."""
    found: dict[NameKey, list[NamedDocument]] = {("title", k): [] for k in title_keys}
    found.update({("identifier", k): [] for k in identifier_keys})
    if found:
        params = {"title_keys": list(title_keys), "identifier_keys": list(identifier_keys),
                  "per_name_plus_one": per_name + 1}  # fmt: skip
        for r in conn.execute(_NAMED_SQL, params):
            found[(r.why, r.key)].append(
                NamedDocument(int(r.document_id), int(r.project_id), str(r.title), r.why, str(r.key))
            )
    return {key: tuple(documents) for key, documents in found.items()}


def named_documents(
    conn: Connection, title_keys: Sequence[str], identifier_keys: Sequence[str], per_name: int
) -> tuple[list[NamedDocument], set[str]]:
    """Documents (not soft-deleted) whose title key or one of whose identifier keys is among the keys
    given, and the keys carried by more than `per_name` documents (whose carriers are left out)."""
    return carried(look_up_names(conn, title_keys, identifier_keys, per_name), per_name)


def subject_versions(conn: Connection, document_ids: Sequence[int]) -> tuple[list[VersionRow], dict[int, int | None]]:
    """Every version of the given documents, and each document's latest final version pointer."""
    if not document_ids:
        return [], {}
    rows = conn.execute(_VERSIONS_SQL, {"document_ids": sorted(set(document_ids))}).all()
    versions = [VersionRow(int(r.id), int(r.document_id), str(r.status), r.doc_date, int(r.version_no)) for r in rows]
    return versions, {int(r.document_id): r.latest_final_version_id for r in rows}
