"""Index rows of one document version: body chunks, the profile row and clause rows.

Pure: typed states in, OpenSearch `_source` bodies out. The content path of the sync
(`projections.plan`, run by `streams.sync`) reads a version's state from PostgreSQL, rebuilds all of
its rows here on every change, and then compares them with the stored rows to decide what to write;
the writer adds `embedding`. Everything else a row carries is decided here.

A body chunk's `meta` has `start` and `end`: where it sits in the version's text as a reader pages through it
(`GET /v1/documents/{id}/versions/{version_id}/text`, PostgreSQL's NFC text), so a hit says where to read on.

Row ids are `f"{version_id}:{chunk_kind}:{ordinal}"` (e.g. `42:chunk:0`, `42:profile:-1`,
`42:clause:1000`). They depend only on the version and the row's position, so replays and
re-syncs overwrite the same OpenSearch documents. The kind is part of the id because the spec's
ordinal ranges (body 0..n, clauses 1000+) would collide for a body of more than 1000 chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any, Literal

from ki.settings import RetrievalSettings
from projections.chunking import TokenBudget, split_text
from projections.text import normalise_text, reading_offsets

VersionStatus = Literal["draft", "final", "executed", "unknown"]
ChunkKind = Literal["chunk", "profile", "clause"]

CLAUSE_STATUSES: frozenset[str] = frozenset({"final", "executed"})
PROFILE_ORDINAL = -1
CLAUSE_ORDINAL_BASE = 1000
PROFILE_TEXT_PREFIX_CHARS = 400


# --- typed inputs (a version's state as the sync reads it from PostgreSQL) -----------------------------


@dataclass(frozen=True, slots=True)
class NotableClause:
    """One entry of `document_versions.notable_clauses`."""

    clause_type_id: int | None
    locus: str
    text: str


@dataclass(frozen=True, slots=True)
class DocumentState:
    id: int
    project_id: int
    title: str
    matter_id: int | None = None
    doc_type_id: int | None = None
    identifiers: tuple[str, ...] = ()
    latest_final_version_id: int | None = None
    deleted_at: datetime | None = None
    promoted: bool = False
    expires_at: datetime | None = None


def expired(document: DocumentState, now: datetime | None) -> bool:
    """Whether `document` has expired at `now` (None: expiry is not judged, e.g. a test's rows)."""
    return now is not None and document.expires_at is not None and document.expires_at <= now


@dataclass(frozen=True, slots=True)
class VersionState:
    id: int
    document_id: int
    version_no: int
    status: VersionStatus
    language: str
    doc_date: date | None
    text: str
    notable_clauses: tuple[NotableClause, ...] = ()


@dataclass(frozen=True, slots=True)
class AccessProjection:
    """The SQL access decision for one version, as it is denormalised onto its rows."""

    allowed_principals: tuple[str, ...]
    denied_principals: tuple[str, ...]
    access_version: int


# --- output ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One OpenSearch document without its vector.

    `source` is the `_source` body minus `embedding`; `embed_input` is the string to embed;
    `content_hash` is sha256(embed_input), also stored in `source["meta"]["content_hash"]` so a
    later sync can tell whether the stored vector is still valid, and as the indexed `embedding_key`
    so that any row whose vector is wanted again -- in another document, another version, or the next
    physical index of a rebuild -- is found by it (one index holds one embedding signature).
    """

    id: str
    source: dict[str, Any]
    embed_input: str
    content_hash: str

    @property
    def chunk_kind(self) -> str:
        return self.source["chunk_kind"]


def row_id(version_id: int, chunk_kind: ChunkKind, ordinal: int) -> str:
    return f"{version_id}:{chunk_kind}:{ordinal}"


def content_hash(embed_input: str) -> str:
    return hashlib.sha256(embed_input.encode("utf-8")).hexdigest()


def access_fields(access: AccessProjection) -> dict[str, Any]:
    """The principal projection fields; sorted and de-duplicated so equal decisions give equal docs."""
    return {
        "allowed_principals": sorted(set(access.allowed_principals)),
        "denied_principals": sorted(set(access.denied_principals)),
        "access_version": access.access_version,
    }


def _optional_id(value: int | None) -> str | None:
    return None if value is None else str(value)


def _clean_identifiers(identifiers: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for identifier in identifiers:
        stripped = " ".join(identifier.split())
        if stripped:
            seen.setdefault(stripped, None)
    return list(seen)


def _normalised(document: DocumentState) -> DocumentState:
    return replace(
        document,
        title=normalise_text(document.title),
        identifiers=tuple(normalise_text(i) for i in document.identifiers),
    )


def _normalised_version(version: VersionState) -> VersionState:
    clauses = tuple(
        replace(c, locus=normalise_text(c.locus), text=normalise_text(c.text)) for c in version.notable_clauses
    )
    return replace(version, text=normalise_text(version.text), notable_clauses=clauses)


def context_header(title: str, doc_type_label: str | None, matter_title: str | None) -> str:
    """One line joining the title, the document type label and the matter title."""
    parts = (" ".join(p.split()) for p in (title, doc_type_label or "", matter_title or ""))
    return " | ".join(p for p in parts if p)


def profile_text(
    document: DocumentState,
    version: VersionState,
    *,
    doc_type_label: str | None,
    matter_title: str | None,
    matter_reference: str | None = None,
) -> str:
    """Labeled lines (skipping empty ones) then the first 400 characters of the text.

    Built from fields only — no model, no pattern matching — so the same states give the same
    profile byte for byte.
    """
    identifiers = _clean_identifiers(document.identifiers)
    lines = [
        ("Title", document.title.strip()),
        ("Document type", (doc_type_label or "").strip()),
        ("Matter", (matter_title or "").strip()),
        ("Reference", (matter_reference or "").strip()),
        ("Identifiers", "; ".join(identifiers)),
        ("Date", version.doc_date.isoformat() if version.doc_date else ""),
    ]
    head = "\n".join(f"{label}: {value}" for label, value in lines if value)
    excerpt = version.text[:PROFILE_TEXT_PREFIX_CHARS].strip()
    return f"{head}\n\n{excerpt}" if head and excerpt else head or excerpt


def build_rows(
    document: DocumentState,
    version: VersionState,
    *,
    doc_type_ancestors: Sequence[int],
    doc_type_label: str | None,
    matter_title: str | None,
    access: AccessProjection,
    settings: RetrievalSettings,
    matter_reference: str | None = None,
    source_object_id: str | None = None,
    token_budget: TokenBudget | None = None,
    now: datetime | None = None,
) -> list[IndexRow]:
    """All index rows of `version`, in order: profile (if any), body chunks, clauses.

    A deleted document has no rows, nor has a document expired at `now` (`expires_at` passed: the search
    excludes it in SQL anyway; its rows leave the index as soon as the sync sees it). A promoted document's
    rows carry `promoted: true` (a bonus on the fused score); the others carry no such field. The profile
    row exists only for the document's latest final version; clause rows only for final/executed
    versions; each behind its settings switch.
    Every text is normalised first (`projections.text`); with a `token_budget`, body chunks are cut so
    that their embedding input (header included) fits the embedder's window.
    """
    if version.document_id != document.id:
        raise ValueError(f"version {version.id} belongs to document {version.document_id}, not {document.id}")
    if document.deleted_at is not None or expired(document, now):
        return []
    offsets = reading_offsets(version.text)  # where each body chunk sits in the text a reader pages through
    document, version = _normalised(document), _normalised_version(version)
    doc_type_label = normalise_text(doc_type_label) if doc_type_label else doc_type_label
    matter_title = normalise_text(matter_title) if matter_title else matter_title
    matter_reference = normalise_text(matter_reference) if matter_reference else matter_reference

    identifiers = _clean_identifiers(document.identifiers)
    ancestors = list(dict.fromkeys(str(a) for a in doc_type_ancestors))
    if document.doc_type_id is not None and str(document.doc_type_id) not in ancestors:
        ancestors.insert(0, str(document.doc_type_id))
    shared: dict[str, Any] = {
        "project_id": str(document.project_id),
        "document_id": str(document.id),
        "document_version_id": str(version.id),
        "matter_id": _optional_id(document.matter_id),
        "doc_type": _optional_id(document.doc_type_id),
        "doc_type_ancestors": ancestors,
        "version_status": version.status,
        "language": version.language,
        "doc_date": version.doc_date.isoformat() if version.doc_date else None,
        "identifiers": identifiers,
        "identifiers_text": " ".join(identifiers),
        **access_fields(access),
    }
    if document.promoted:  # only when set: rows of documents never promoted stay as they were
        shared["promoted"] = True
    header = context_header(document.title, doc_type_label, matter_title) if settings.chunk_contextualize else ""

    def make_row(
        kind: ChunkKind,
        ordinal: int,
        text: str,
        embed_input: str,
        *,
        clause_type: str | None = None,
        locus: str | None = None,
        span: tuple[int, int] | None = None,
    ) -> IndexRow:
        digest = content_hash(embed_input)
        meta: dict[str, Any] = {"kind": kind, "ordinal": ordinal, "content_hash": digest}
        if span is not None:
            meta["start"], meta["end"] = span
        if source_object_id is not None:
            meta["source_object_id"] = source_object_id
        if locus is not None:
            meta["locus"] = locus
        if clause_type is not None:
            meta["clause_type"] = clause_type
        source = {"text": text, **shared, "chunk_kind": kind, "clause_type": clause_type, "embedding_key": digest,
                  "meta": meta}  # fmt: skip
        return IndexRow(
            id=row_id(version.id, kind, ordinal), source=source, embed_input=embed_input, content_hash=digest
        )

    def contextualized(text: str) -> str:
        return f"{header}\n{text}" if header else text

    rows: list[IndexRow] = []
    if settings.profile_embeddings and document.latest_final_version_id == version.id:
        profile = profile_text(
            document,
            version,
            doc_type_label=doc_type_label,
            matter_title=matter_title,
            matter_reference=matter_reference,
        )
        # The profile already names title, type and matter; a header would only repeat them.
        rows.append(make_row("profile", PROFILE_ORDINAL, profile, profile))

    fits = (lambda window: token_budget.fits(contextualized(window))) if token_budget is not None else None
    for chunk in split_text(version.text, settings.chunk_chars, settings.chunk_overlap_chars, fits):
        span = (offsets[chunk.start], offsets[chunk.end - 1] + 1) if offsets is not None and chunk.text else None
        rows.append(make_row("chunk", chunk.ordinal, chunk.text, contextualized(chunk.text), span=span))

    if settings.clause_embeddings and version.status in CLAUSE_STATUSES:
        # Ordinal follows the clause's position in the artifact, so skipping an empty entry does
        # not shift (and re-embed) the clauses after it.
        for position, clause in enumerate(version.notable_clauses):
            if not clause.text.strip():
                continue
            clause_type = _optional_id(clause.clause_type_id)
            rows.append(
                make_row(
                    "clause",
                    CLAUSE_ORDINAL_BASE + position,
                    clause.text,
                    contextualized(clause.text),
                    clause_type=clause_type,
                    locus=clause.locus,
                )
            )
    return rows
