"""The chunk index's fields as the reference spec names them: the oracle the row and mapping tests check the
code against (written out here, sorted, rather than imported from the code under test)."""

SPEC_KEYWORD_FIELDS = frozenset(
    {"allowed_principals", "chunk_kind", "clause_type", "denied_principals", "doc_type", "doc_type_ancestors"}
    | {"document_id", "document_version_id", "identifiers", "language", "matter_id", "project_id", "version_status"}
)
SPEC_FIELDS = SPEC_KEYWORD_FIELDS | {"access_version", "doc_date", "identifiers_text", "meta", "text"}
# Beyond the spec: the key of the embedded string, by which a stored vector is found again.
ADDED_FIELDS = frozenset({"embedding_key"})
