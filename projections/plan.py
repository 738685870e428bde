"""The sync's decisions: what a change means for the index, given what the index already holds.

This is the live sync model; `streams/sync.py` does the I/O around these functions and decides nothing
itself:

1. A CDC event is only a trigger (`projections.dirty`): it names *content* keys (versions, documents,
   matters, ontology nodes) or *access* keys (projects, grants, observations, source objects, sources,
   memberships, aliases). The sync never applies an event's payload; it re-reads PostgreSQL.
2. The worker resolves the keys to document versions in SQL. A version on both paths goes on the
   content path only (`access_only_versions`): content work recomputes the principal projection too.
3. **Content path**, per version: read its rows from the index (with their sequence numbers), then its
   state and granted principals from PostgreSQL; give the rows the `access_version` of
   `next_access_version` and build them (`projections.rows.build_rows`); `plan_content_writes` then says
   which stored rows to delete and, per new row, one `RowWrite`: create, re-embed, partial update,
   replace (keeping the stored vector) or nothing. A version gone from PostgreSQL, or of a deleted
   document, has no rows: every stored row is deleted.
   **Text first**: the access lane never embeds, so it writes the rows that need a vector without one,
   marked `vector_pending` (`text_write`): a new or changed version is found by its words, identifiers
   and name, filtered and access-checked, as soon as that lane has read it. The content lane then
   overwrites each such row with the same row and its vector (`RowWrite.ADD_VECTOR`); the semantic leg
   simply does not match a row without a vector meanwhile.
4. **Access-only path**, per version: read only the principal fields of its rows and the granted
   principals; `access_only_update` gives each row's partial update, or None when the row already
   holds that projection. Nothing is split or embedded.
5. Every write is conditional on the sequence number read in step 3 or 4; a version that loses a race
   is projected again from fresh reads (see `streams.sync`).

The **access_version rule**: a row's `access_version` counts changes of its version's principal
projection. A write that leaves the projection as it is keeps the number; a changed projection raises
it by one; a version's first rows get 1.

Pure: typed rows and stored `_source` fields in, decisions out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from projections.rows import AccessProjection, IndexRow, access_fields

#: The row fields that hold a version's principal projection (all the access-only path reads).
PRINCIPAL_FIELDS: tuple[str, ...] = ("allowed_principals", "denied_principals")


class Granted(Protocol):
    """A version's principal projection as the ACL computes it (e.g. `ki.acl.GrantedPrincipals`)."""

    @property
    def allowed_principals(self) -> tuple[str, ...]: ...

    @property
    def denied_principals(self) -> tuple[str, ...]: ...


class StoredRow(Protocol):
    """A row as the index holds it (e.g. `streams.writer.ExistingRow`); `source` excludes the vector."""

    @property
    def doc_id(self) -> str: ...

    @property
    def content_hash(self) -> str: ...

    @property
    def access_version(self) -> int: ...

    @property
    def source(self) -> Mapping[str, Any]: ...


# --- which path ---------------------------------------------------------------------------------


def access_only_versions(content: Collection[int], access: Iterable[int]) -> set[int]:
    """The versions that need only their principal projection rewritten: content work rebuilds the
    projection too, so a version dirtied both ways goes on the content path alone."""
    return set(access) - set(content)


# --- principal projection -----------------------------------------------------------------------


def holds_principals(source: Mapping[str, Any], granted: Granted) -> bool:
    """Whether a stored row already holds this projection (order and repeats ignored on both sides)."""
    return all(sorted(set(source.get(name) or ())) == sorted(set(getattr(granted, name))) for name in PRINCIPAL_FIELDS)


def next_access_version(stored: Iterable[StoredRow], granted: Granted) -> int:
    """The `access_version` for a version's rebuilt rows (content path).

    The highest number among its stored rows if one of them already holds this projection, else one
    more (1 for a version not yet in the index): re-syncing content never bumps it, a grant change does.
    """
    rows = list(stored)
    highest = max((row.access_version for row in rows), default=0)
    if highest and any(holds_principals(row.source, granted) for row in rows):
        return highest
    return highest + 1


def access_only_update(stored: StoredRow, granted: Granted) -> dict[str, Any] | None:
    """The partial update that gives one stored row this projection (access-only path), with its
    `access_version` raised by one; None when the row already holds it."""
    if holds_principals(stored.source, granted):
        return None
    return access_fields(
        AccessProjection(
            allowed_principals=granted.allowed_principals,
            denied_principals=granted.denied_principals,
            access_version=stored.access_version + 1,
        )
    )


# --- content path -------------------------------------------------------------------------------


#: On a row written without its vector (text first): since when it waits, in epoch milliseconds; the
#: content lane's write with the vector has no such field.
VECTOR_PENDING = "vector_pending"


class RowWrite(StrEnum):
    """What the content path writes for one rebuilt row."""

    #: The index has no such row: get a vector, create the row.
    CREATE = "create"
    #: The embedded string changed (text, header, profile): get a vector, overwrite the whole row.
    REEMBED = "reembed"
    #: The stored row is this row's text without a vector: get the vector, overwrite the whole row.
    ADD_VECTOR = "add_vector"
    #: A lane that does not embed: write the whole row without a vector, marked `vector_pending`.
    TEXT = "text"
    #: Only fields beside the vector changed and none was removed: partial update, vector untouched.
    UPDATE = "update"
    #: Fields beside the vector changed and one was removed (e.g. `meta.source_object_id` once the
    #: version's last observation is gone). A partial update merges objects and cannot remove a field,
    #: so the whole row is overwritten with its stored vector.
    REPLACE = "replace"
    #: The stored row already equals the rebuilt one: no write.
    KEEP = "keep"

    @property
    def needs_vector(self) -> bool:
        """Whether the write needs a vector for the row's (new) embedded string."""
        return self in (RowWrite.CREATE, RowWrite.REEMBED, RowWrite.ADD_VECTOR)


def without_vector(source: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in source.items() if name not in ("embedding", VECTOR_PENDING)}


def vector_pending(source: Mapping[str, Any]) -> bool:
    return bool(source.get(VECTOR_PENDING))


def drops_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether `old` has a field (at any depth of nested objects) that `new` no longer has."""
    for name, value in old.items():
        if name not in new:
            return True
        if isinstance(value, Mapping) and isinstance(new[name], Mapping) and drops_fields(value, new[name]):
            return True
    return False


def row_write(new: IndexRow, stored: StoredRow | None) -> RowWrite:
    """The write that turns the stored row (None: absent) into the rebuilt row `new`."""
    if stored is None:
        return RowWrite.CREATE
    if stored.content_hash != new.content_hash:
        return RowWrite.REEMBED
    if vector_pending(stored.source):
        return RowWrite.ADD_VECTOR
    old = without_vector(stored.source)
    if old == new.source:
        return RowWrite.KEEP
    return RowWrite.REPLACE if drops_fields(old, new.source) else RowWrite.UPDATE


def text_write(new: IndexRow, stored: StoredRow | None) -> RowWrite:
    """The write of a lane that does not embed: a row that needs a vector is written as text (TEXT),
    unless the stored row already is exactly that text; every other write is `row_write`'s."""
    write = row_write(new, stored)
    if not write.needs_vector:
        return write
    if write is RowWrite.ADD_VECTOR and stored is not None and without_vector(stored.source) == new.source:
        return RowWrite.KEEP  # the same text row, still waiting for its vector
    return RowWrite.TEXT


@dataclass(frozen=True, slots=True)
class ContentPlan:
    """The content path's writes for one version: `writes` pairs each rebuilt row that needs a write
    with its `RowWrite` (never KEEP); `deletes` are the stored rows the version no longer has."""

    writes: tuple[tuple[IndexRow, RowWrite], ...]
    deletes: tuple[str, ...]


def smallest_first(sizes: Mapping[int, int]) -> list[int]:
    """Versions by size (e.g. text length), smallest first, ties by id: shortest work first keeps the
    average wait low, and a short document committed beside a bulk import is not written after all of it."""
    return sorted(sizes, key=lambda version: (sizes[version], version))


def expected_rows(text_chars: int, chunk_chars: int, overlap_chars: int) -> int:
    """About how many rows a version of this much text is cut into (its chunks, and one more for the rest:
    profile and clause rows are few). Used to cut the access lane's slices before a large version is
    tokenised, so it never holds up the small versions ahead of it."""
    return 1 + text_chars // max(1, chunk_chars - overlap_chars)


def micro_batches(vector_needs: Sequence[tuple[int, int]], max_rows: int) -> list[list[int]]:
    """Group versions, given in order as (version id, rows that need a vector), for the content lane:
    each group is embedded and written before the next one starts, so rows become searchable step by
    step instead of after the whole batch.

    Versions that need no vector form the first group (written at once, before any embedding); the
    others are packed in order while their rows fit `max_rows`. A version's rows stay together (a version
    is never half old, half new), so a version needing more than `max_rows` is a group of its own.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    free = [version for version, rows in vector_needs if rows <= 0]
    groups: list[list[int]] = [free] if free else []
    current: list[int] = []
    size = 0
    for version, rows in vector_needs:
        if rows <= 0:
            continue
        if current and size + rows > max_rows:
            groups.append(current)
            current, size = [], 0
        current.append(version)
        size += rows
    if current:
        groups.append(current)
    return groups


def plan_content_writes(
    new_rows: Sequence[IndexRow], stored: Mapping[str, StoredRow], *, embeds: bool = True
) -> ContentPlan:
    """Compare a version's rebuilt rows with its stored rows (by row id), for a lane that embeds (content
    lane, rebuild) or not (access lane: text first).

    Editing one paragraph changes the embedded string of the chunks around it only, so only those are
    re-embedded; a grant change alone re-embeds nothing (the vectors do not embed principals).
    """
    ids = [row.id for row in new_rows]
    if len(set(ids)) != len(ids):
        raise ValueError("new_rows contains duplicate row ids")
    decide = row_write if embeds else text_write
    writes = tuple((row, write) for row in new_rows if (write := decide(row, stored.get(row.id))) != RowWrite.KEEP)
    deletes = tuple(sorted(set(stored) - set(ids)))
    return ContentPlan(writes=writes, deletes=deletes)


# --- expiry sweep -------------------------------------------------------------------------------


def expiry_sweep_since(last_clock: datetime | None, overlap_s: float) -> datetime | None:
    """Where the access lane's next expiry sweep looks back from: the database's clock at the last sweep, less
    one sweep interval, so an expiry is swept twice (a content write read before it passed and landing after the
    first sweep is caught by the second); None before the first sweep (every expired document, once per start)."""
    return None if last_clock is None else last_clock - timedelta(seconds=overlap_s)
