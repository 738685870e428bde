"""The reference schema of the structured layer, as SQLAlchemy 2 typed declarative models.

PostgreSQL is the authority: the sidecar never writes these tables, it reads them (scope compilation,
re-verification) and follows their changes through Debezium. The DDL that actually builds a database is
the hand-written Alembic migration in `ki/migrations/versions/`; these models must agree with it
(`tests/integration/test_schema.py` compares the two). Server-side objects that have no model form — the
`updated_at` triggers, the ontology tree guard, the `ontology_ancestors` / `ontology_descendants`
functions, the publication and the replica identities — exist only in the migration. Build databases with
`ki migrate` (`ki.db.migrate.upgrade`), never with `metadata.create_all`.

Conventions: every primary key is a bigint identity (search filters by integer ids); every timestamp is
`timestamptz`; enumerations are text columns with CHECK constraints, so adding a value is a plain
constraint swap in a migration instead of an `ALTER TYPE`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy import (
    text as sql_text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Re-exported: the schema's users have always read these here.
from ki.table_roles import CAPTURED_TABLES as CAPTURED_TABLES
from ki.table_roles import HEARTBEAT_TABLE as HEARTBEAT_TABLE
from ki.table_roles import PUBLISHED_TABLES as PUBLISHED_TABLES
from ki.table_roles import REPLICA_IDENTITY_FULL as REPLICA_IDENTITY_FULL

# --------------------------------------------------------------------------------------------------
# Constants other components import
# --------------------------------------------------------------------------------------------------

#: Tables streamed by Debezium (all in the publication), parents before children, the heartbeat table, the
#: publication and the FULL replica identities: declared once, with every other role of a captured table, in
#: `ki.table_roles`. `decision_records` and `relations` are not captured: nothing in the index is derived from
#: them (decision search and graph traversal read SQL). The connector adds the heartbeat table to
#: `table.include.list` and uses HEARTBEAT_ACTION_QUERY.
HEARTBEAT_ACTION_QUERY = (
    f"INSERT INTO {HEARTBEAT_TABLE} (id, ts) VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET ts = EXCLUDED.ts"
)

DOC_TYPE = "doc_type"
CLAUSE_TYPE = "clause_type"
ONTOLOGY_KINDS: tuple[str, ...] = (DOC_TYPE, CLAUSE_TYPE)
VERSION_STATUSES: tuple[str, ...] = ("draft", "final", "executed", "unknown")
GRANT_SCOPES: tuple[str, ...] = ("project", "document", "source_object")
GRANT_EFFECTS: tuple[str, ...] = ("allow", "deny")
RELATION_KINDS: tuple[str, ...] = ("supersedes", "annex_of", "responds_to", "references", "thread")

#: Which grants column each scope targets; the other two must be NULL (ck_grants_scope_target).
GRANT_SCOPE_COLUMNS: dict[str, str] = {
    "project": "project_id",
    "document": "document_id",
    "source_object": "source_object_id",
}


def _in_list(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def grants_scope_check_sql() -> str:
    """The CHECK expression that ties `grants.scope` to exactly one target column."""
    branches = []
    for scope, target in GRANT_SCOPE_COLUMNS.items():
        nulls = " AND ".join(f"{c} IS NULL" for c in GRANT_SCOPE_COLUMNS.values() if c != target)
        branches.append(f"(scope = '{scope}' AND {target} IS NOT NULL AND {nulls})")
    return " OR ".join(branches)


# --------------------------------------------------------------------------------------------------
# Base
# --------------------------------------------------------------------------------------------------

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _pk() -> Mapped[int]:
    return mapped_column(BigInteger, Identity(always=False), primary_key=True)


def _created_at() -> Mapped[dt.datetime]:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


def _nonblank(column: str) -> CheckConstraint:
    return CheckConstraint(f"btrim({column}) <> ''", name=f"{column}_nonblank")


def _principal_form(column: str) -> CheckConstraint:
    """A principal column takes well-formed principals only (`kind:name`; migration 0004)."""
    return CheckConstraint(f"ki_principal({column}) IS NOT NULL", name=f"{column}_form")


def _normalized_index(table: str, column: str) -> Index:
    """Principals are compared in their canonical form `ki_principal(x)` (SQL twin of
    `ki.principals.canonical_principal`, migration 0004); index that form."""
    return Index(f"ix_{table}_{column}_folded", func.ki_principal(sql_text(column)))


# --------------------------------------------------------------------------------------------------
# Projects, matters, ontology
# --------------------------------------------------------------------------------------------------


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = _pk()
    name: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[dt.datetime] = _created_at()

    matters: Mapped[list[Matter]] = relationship(back_populates="project")


class Matter(Base):
    __tablename__ = "matters"

    id: Mapped[int] = _pk()
    project_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("projects.id", ondelete="CASCADE"), nullable=False, index=True
    )
    title: Mapped[str] = mapped_column(Text, nullable=False)
    reference: Mapped[str | None] = mapped_column(Text)

    project: Mapped[Project] = relationship(back_populates="matters")


class OntologyNode(Base):
    """A node of the doc-type or clause-type taxonomy. `parent_id` is the only stored tree structure;
    ancestor closures are computed in SQL (`ontology_ancestors()`, `ontology_descendants()`)."""

    __tablename__ = "ontology_nodes"
    __table_args__ = (
        CheckConstraint(_in_list("kind", ONTOLOGY_KINDS), name="kind"),
        CheckConstraint("parent_id <> id", name="not_own_parent"),
        _nonblank("key"),
    )

    id: Mapped[int] = _pk()
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    label: Mapped[str] = mapped_column(Text, nullable=False)
    parent_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("ontology_nodes.id", ondelete="RESTRICT"), index=True
    )

    parent: Mapped[OntologyNode | None] = relationship(remote_side=[id], back_populates="children")
    children: Mapped[list[OntologyNode]] = relationship(back_populates="parent")


# --------------------------------------------------------------------------------------------------
# Documents and versions
# --------------------------------------------------------------------------------------------------


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (
        CheckConstraint("array_position(identifiers, NULL) IS NULL", name="identifiers_no_nulls"),
        # (latest_final_version_id, id) -> document_versions (id, document_id): the pointer can only
        # name a version of this very document. Deferred, so a version and the pointer to it can be
        # written in either order inside one transaction; use_alter breaks the table cycle.
        ForeignKeyConstraint(
            ["latest_final_version_id", "id"],
            ["document_versions.id", "document_versions.document_id"],
            name="fk_documents_latest_final_version",
            use_alter=True,
            deferrable=True,
            initially="DEFERRED",
        ),
        # The identity preflight's look-ups (search.names.keys, migrations 0005 and 0010): titles (by the key's
        # first 255 characters, in a B-tree: never recomputed for a row found) and identifiers by key.
        Index(
            "ix_documents_title_identity",
            func.left(func.ki_identity_key(sql_text("title")), 255),
            postgresql_using="btree",
            postgresql_where=sql_text("deleted_at IS NULL"),
        ),
        Index(
            "ix_documents_identifiers_identity",
            func.ki_identity_keys(sql_text("identifiers")),
            postgresql_using="gin",
            postgresql_where=sql_text("deleted_at IS NULL"),
        ),
        # The expiry sweep's look-up (streams.sync, migration 0013).
        Index("ix_documents_expires_at", "expires_at", postgresql_where=sql_text("expires_at IS NOT NULL")),
    )

    id: Mapped[int] = _pk()
    project_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("projects.id", ondelete="CASCADE"), nullable=False, index=True
    )
    matter_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("matters.id", ondelete="SET NULL"), index=True)
    title: Mapped[str] = mapped_column(Text, nullable=False)
    doc_type_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("ontology_nodes.id", ondelete="RESTRICT"), index=True
    )
    identifiers: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default=sql_text("'{}'::text[]"))
    latest_final_version_id: Mapped[int | None] = mapped_column(BigInteger)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: A small bonus on its rows' fused score (`retrieval.promoted_bonus`).
    promoted: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=sql_text("false"))
    #: From then on its versions are visible to nobody (`ki.acl`) and its rows leave the index.
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    versions: Mapped[list[DocumentVersion]] = relationship(
        back_populates="document",
        foreign_keys="DocumentVersion.document_id",
        order_by="DocumentVersion.version_no",
    )
    latest_final_version: Mapped[DocumentVersion | None] = relationship(
        primaryjoin="Document.latest_final_version_id == DocumentVersion.id",
        foreign_keys=[latest_final_version_id],
        viewonly=True,
    )


class DocumentVersion(Base):
    __tablename__ = "document_versions"
    __table_args__ = (
        UniqueConstraint("document_id", "version_no"),
        # Target of fk_documents_latest_final_version.
        UniqueConstraint("id", "document_id"),
        CheckConstraint(_in_list("status", VERSION_STATUSES), name="status"),
        CheckConstraint("version_no >= 1", name="version_no_positive"),
        CheckConstraint("jsonb_typeof(notable_clauses) = 'array'", name="notable_clauses_array"),
    )

    id: Mapped[int] = _pk()
    document_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("documents.id", ondelete="CASCADE"), nullable=False)
    version_no: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False)
    language: Mapped[str] = mapped_column(Text, nullable=False, server_default=sql_text("'de'"))
    doc_date: Mapped[dt.date | None] = mapped_column(Date)
    text: Mapped[str] = mapped_column(Text, nullable=False, server_default=sql_text("''"))
    #: [{"clause_type_id": int, "locus": str, "text": str}, ...]
    notable_clauses: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, nullable=False, server_default=sql_text("'[]'::jsonb")
    )
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    document: Mapped[Document] = relationship(back_populates="versions", foreign_keys=[document_id])
    observations: Mapped[list[SourceObservation]] = relationship(back_populates="document_version")


# --------------------------------------------------------------------------------------------------
# Sources and observations
# --------------------------------------------------------------------------------------------------


class Source(Base):
    """A system documents come from. `kind` is free text ('local_fs', 'sharepoint', 'dms', 'email', ...);
    the ACL rules give 'local_fs' a special meaning (delegates to the project boundary)."""

    __tablename__ = "sources"
    __table_args__ = (_nonblank("kind"),)

    id: Mapped[int] = _pk()
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    #: From then on an observation at one of its objects makes no version visible nor citable (`ki.acl`).
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    objects: Mapped[list[SourceObject]] = relationship(back_populates="source")


class SourceObject(Base):
    __tablename__ = "source_objects"
    __table_args__ = (UniqueConstraint("source_id", "external_ref"),)

    id: Mapped[int] = _pk()
    source_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("sources.id", ondelete="CASCADE"), nullable=False)
    external_ref: Mapped[str] = mapped_column(Text, nullable=False)
    acl_known: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=sql_text("false"))

    source: Mapped[Source] = relationship(back_populates="objects")


class SourceObservation(Base):
    """A version was seen at a source object. Active iff `deleted_at IS NULL`."""

    __tablename__ = "source_observations"

    id: Mapped[int] = _pk()
    document_version_id: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("document_versions.id", ondelete="CASCADE", name="fk_source_observations_document_version_id"),
        nullable=False,
        index=True,
    )
    source_object_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("source_objects.id", ondelete="CASCADE"), nullable=False, index=True
    )
    observed_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    document_version: Mapped[DocumentVersion] = relationship(back_populates="observations")
    source_object: Mapped[SourceObject] = relationship()


# --------------------------------------------------------------------------------------------------
# Access: grants, group memberships, aliases
# --------------------------------------------------------------------------------------------------


class Grant(Base):
    __tablename__ = "grants"
    __table_args__ = (
        CheckConstraint(_in_list("scope", GRANT_SCOPES), name="scope"),
        CheckConstraint(_in_list("effect", GRANT_EFFECTS), name="effect"),
        CheckConstraint(grants_scope_check_sql(), name="scope_target"),
        _principal_form("principal"),
        # Target -> principals (projection, re-verify) ...
        Index(
            "ix_grants_project_id_principal",
            "project_id",
            "principal",
            postgresql_where=sql_text("project_id IS NOT NULL"),
        ),
        Index(
            "ix_grants_document_id_principal",
            "document_id",
            "principal",
            postgresql_where=sql_text("document_id IS NOT NULL"),
        ),
        Index(
            "ix_grants_source_object_id_principal",
            "source_object_id",
            "principal",
            postgresql_where=sql_text("source_object_id IS NOT NULL"),
        ),
        # ... and normalised principal -> targets (scope compilation).
        _normalized_index("grants", "principal"),
    )

    id: Mapped[int] = _pk()
    scope: Mapped[str] = mapped_column(Text, nullable=False)
    project_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("projects.id", ondelete="CASCADE"))
    document_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("documents.id", ondelete="CASCADE"))
    source_object_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("source_objects.id", ondelete="CASCADE")
    )
    principal: Mapped[str] = mapped_column(Text, nullable=False)
    effect: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[dt.datetime] = _created_at()


class GroupMembership(Base):
    """`member_principal` belongs to `group_principal`, as mirrored from `source_id` (NULL: local)."""

    __tablename__ = "group_memberships"
    __table_args__ = (
        # NULLS NOT DISTINCT: two identical local (source_id NULL) memberships are duplicates too.
        UniqueConstraint(
            "source_id",
            "group_principal",
            "member_principal",
            name="uq_group_memberships_source_group_member",
            postgresql_nulls_not_distinct=True,
        ),
        _principal_form("group_principal"),
        _principal_form("member_principal"),
        # Both directions are walked: members -> groups (caller expansion), groups -> members (projection).
        _normalized_index("group_memberships", "member_principal"),
        _normalized_index("group_memberships", "group_principal"),
    )

    id: Mapped[int] = _pk()
    source_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("sources.id", ondelete="CASCADE"))
    group_principal: Mapped[str] = mapped_column(Text, nullable=False)
    member_principal: Mapped[str] = mapped_column(Text, nullable=False)


class PrincipalAlias(Base):
    __tablename__ = "principal_aliases"
    __table_args__ = (
        _principal_form("alias"),
        _principal_form("principal"),
        _normalized_index("principal_aliases", "alias"),
        _normalized_index("principal_aliases", "principal"),
    )

    id: Mapped[int] = _pk()
    alias: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    principal: Mapped[str] = mapped_column(Text, nullable=False)


# --------------------------------------------------------------------------------------------------
# Not captured: decision records and relations (served from SQL only)
# --------------------------------------------------------------------------------------------------


class DecisionRecord(Base):
    __tablename__ = "decision_records"

    id: Mapped[int] = _pk()
    project_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("projects.id", ondelete="CASCADE"), nullable=False, index=True
    )
    document_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("documents.id", ondelete="SET NULL"), index=True
    )
    locus: Mapped[str] = mapped_column(Text, nullable=False, server_default=sql_text("''"))
    change_summary: Mapped[str] = mapped_column(Text, nullable=False, server_default=sql_text("''"))
    rationale: Mapped[str] = mapped_column(Text, nullable=False, server_default=sql_text("''"))
    #: source_objects ids (no FK: arrays cannot carry one); the caller's access is checked against them.
    evidence_source_object_ids: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), nullable=False, server_default=sql_text("'{}'::bigint[]")
    )
    created_at: Mapped[dt.datetime] = _created_at()


class Relation(Base):
    __tablename__ = "relations"
    __table_args__ = (
        CheckConstraint(_in_list("kind", RELATION_KINDS), name="kind"),
        CheckConstraint("from_document_id <> to_document_id", name="not_self"),
        UniqueConstraint("kind", "from_document_id", "to_document_id"),
        Index("ix_relations_to_document_id", "to_document_id"),
        Index("ix_relations_from_document_id", "from_document_id"),
    )

    id: Mapped[int] = _pk()
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    from_document_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("documents.id", ondelete="CASCADE"), nullable=False
    )
    to_document_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("documents.id", ondelete="CASCADE"), nullable=False
    )
    created_at: Mapped[dt.datetime] = _created_at()


class DebeziumHeartbeat(Base):
    """Heartbeat row written by Debezium (see HEARTBEAT_TABLE). One row, id 1."""

    __tablename__ = HEARTBEAT_TABLE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class AccessAudit(Base):
    """One API request: who asked, where, with what status, the documents the answer named and the versions it
    showed the text of (search.telemetry.audit; written by the API, not captured by CDC, read by administrators)."""

    __tablename__ = "ki_access_audit"

    id: Mapped[int] = _pk()
    at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), index=True
    )
    principals: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    endpoint: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[int] = mapped_column(Integer, nullable=False)
    document_ids: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), nullable=False, server_default=sql_text("'{}'::bigint[]")
    )
    # The versions whose text the answer showed (reading; migration 0011).
    version_ids: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), nullable=False, server_default=sql_text("'{}'::bigint[]")
    )


class SearchStat(Base):
    """One ranked query's retrieval statistics (search.telemetry.stats; written by the API, not captured by CDC)."""

    __tablename__ = "ki_search_stats"

    id: Mapped[int] = _pk()
    at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), index=True
    )
    mode: Mapped[str] = mapped_column(Text, nullable=False)
    hit_count: Mapped[int] = mapped_column(Integer, nullable=False)
    lexical_only: Mapped[int] = mapped_column(Integer, nullable=False)
    semantic_only: Mapped[int] = mapped_column(Integer, nullable=False)
    both_legs: Mapped[int] = mapped_column(Integer, nullable=False)
    top_lexical: Mapped[float | None] = mapped_column(Double)
    top_semantic: Mapped[float | None] = mapped_column(Double)
    top_fused: Mapped[float | None] = mapped_column(Double)
    identity: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    fallbacks: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default=sql_text("'{}'::text[]"))
    took_ms: Mapped[float] = mapped_column(Double, nullable=False)
    query: Mapped[str | None] = mapped_column(Text)


class SelfEvalReport(Base):
    """One `ki eval --self` run: the deployment's own evidence for its default mode (apps.dev.eval.self_check;
    written by the operator's command, read by every API process, not captured by CDC)."""

    __tablename__ = "ki_self_eval"
    __table_args__ = (CheckConstraint("decision IN ('hybrid', 'lexical')", name="decision"),)

    id: Mapped[int] = _pk()
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    binding_hash: Mapped[str] = mapped_column(Text, nullable=False)
    decision: Mapped[str] = mapped_column(Text, nullable=False)
    report: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)


DLQ_ACTIONS: tuple[str, ...] = ("replay", "drop")
DLQ_OUTCOMES: tuple[str, ...] = ("replayed", "dropped", "failed")


class DlqOperation(Base):
    """One dead letter handled (or not) by `ki dlq replay` / `ki dlq drop` (streams.dlq; written by the operator's
    command, read by the lanes' DLQ gauges, not captured by CDC): who, when, which dead letter (its place on the DLQ
    topic and the key `ki dlq list` shows), why, and what came of it. A dead letter with a `replayed` or `dropped`
    row is handled (at most one such row: `ix_ki_dlq_operations_handled`); a `failed` replay leaves it waiting."""

    __tablename__ = "ki_dlq_operations"
    __table_args__ = (
        CheckConstraint(_in_list("action", DLQ_ACTIONS), name="action"),
        CheckConstraint(_in_list("outcome", DLQ_OUTCOMES), name="outcome"),
        CheckConstraint("action <> 'drop' OR btrim(coalesce(reason, '')) <> ''", name="drop_has_reason"),
        Index(
            "ix_ki_dlq_operations_handled",
            "dlq_topic",
            "dlq_partition",
            "dlq_offset",
            unique=True,
            postgresql_where=sql_text("outcome IN ('replayed', 'dropped')"),
        ),
    )

    id: Mapped[int] = _pk()
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    operator: Mapped[str] = mapped_column(Text, nullable=False)
    action: Mapped[str] = mapped_column(Text, nullable=False)
    dlq_topic: Mapped[str] = mapped_column(Text, nullable=False)
    dlq_partition: Mapped[int] = mapped_column(Integer, nullable=False)
    dlq_offset: Mapped[int] = mapped_column(BigInteger, nullable=False)
    record_key: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(Text, nullable=False)
    detail: Mapped[str | None] = mapped_column(Text)
