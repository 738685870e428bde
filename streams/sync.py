"""Apply dirty keys to the index: the sync shared by the Faust worker, rebuild and backfill.

What to write is decided in `projections.plan` (the sync model is described there); this module
sequences the work: it resolves dirty keys to versions, reads the index and PostgreSQL, plans, embeds,
and writes. PostgreSQL and the index are reached through two small interfaces (`VersionSource`,
`RowIndex`), so the sequencing is unit-tested without services; `streams.source` and
`streams.writer` implement them.

Order of operations per batch (this order is what makes concurrent or repeated work safe):
1. read the affected rows from the index, with their sequence numbers;
2. read the current state from PostgreSQL (the authority);
3. write conditionally on the sequence numbers from step 1.
A write that lost a race (HTTP 409) means somebody wrote after our step 1; that version is simply
projected again from fresh reads. The final index therefore always reflects a PostgreSQL read taken
after the last change, whatever order, duplication or replay the events arrived in.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from ki.acl import GrantedPrincipals
from ki.embedding import Embedder
from ki.errors import WriteContention
from ki.settings import Settings
from projections.chunking import TokenBudget
from projections.dirty import DirtyKeys, WrittenWith
from projections.plan import (
    PRINCIPAL_FIELDS,
    VECTOR_PENDING,
    ContentPlan,
    RowWrite,
    access_only_update,
    access_only_versions,
    expected_rows,
    micro_batches,
    next_access_version,
    plan_content_writes,
    smallest_first,
)
from projections.rows import AccessProjection, IndexRow, build_rows
from streams.source import AccessBasis, PostgresSource, VersionSnapshot
from streams.topics import Lane
from streams.writer import BulkOp, BulkResult, ExistingRow

if TYPE_CHECKING:  # the production wiring only names the engine type
    from sqlalchemy import Engine

log = logging.getLogger(__name__)

MAX_CONFLICT_ROUNDS = 8
#: After a lost write race a writer waits a random part of this (doubling each round, at most a second) before
#: reading again: two lanes rewriting the same rows then stop colliding round after round.
CONTENTION_PAUSE_S = 0.05
#: Access-only work is read and written this many versions at a time (a batch's is far fewer; a truncate's is
#: every indexed version).
ACCESS_SLICE_VERSIONS = 2000
# The access lane's first slice of text rows is an eighth of a `_bulk`, each next one twice as big: the smallest
# versions of a batch are written (and searchable) before most of the batch is even cut.
FIRST_SLICE_DIVISOR = 8


@dataclass
class SyncStats:
    versions_projected: int = 0
    access_versions: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    rows_embedded: int = 0
    rows_reused: int = 0  # rows given a stored vector of the same embedded string instead of embedding
    rows_text_first: int = 0  # rows sent without their vector (text first), by a lane that does not embed
    access_rows_updated: int = 0
    conflict_rounds: int = 0
    inserts_skipped: int = 0  # the principals lane's: inserts made with the row they point at (DirtyKeys.settled)
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, started: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def add(self, other: SyncStats) -> None:
        """Count `other`'s work in these stats too (counters and seconds by stage)."""
        for f in fields(self):
            if f.name != "seconds":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        for stage, seconds in other.seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


class VersionSource(Protocol):
    """PostgreSQL as the sync reads it; blocking, so called in a thread (`streams.source.PostgresSource`)."""

    def resolve(self, keys: DirtyKeys) -> tuple[set[int], set[int]]:
        """The existing versions whose content, resp. whose access, `keys` dirtied."""
        ...

    def written_by(self, anchors: Collection[WrittenWith]) -> set[WrittenWith]:
        """Those of `anchors` whose row their transaction was the last to write."""
        ...

    def versions(
        self, version_ids: Sequence[int]
    ) -> tuple[dict[int, VersionSnapshot], dict[int, GrantedPrincipals]]: ...

    def grants(self, version_ids: Sequence[int]) -> dict[int, GrantedPrincipals]: ...

    def expired_since(self, since: datetime | None) -> tuple[list[int], datetime]:
        """Documents whose expiry passed after `since` (None: all expired), and the database's clock now."""
        ...

    def access_bases(self, version_ids: Sequence[int]) -> dict[int, AccessBasis]: ...

    def existing(self, version_ids: Sequence[int]) -> set[int]:
        """Those of these versions that still exist."""
        ...


class RowIndex(Protocol):
    """The index as the sync reads and writes it (`streams.writer.IndexWriter`, the one writer)."""

    async def existing_rows(
        self, version_ids: Iterable[int], *, with_source: Sequence[str] = (), with_doc_values: Sequence[str] = ()
    ) -> dict[int, dict[str, ExistingRow]]: ...

    async def vectors(self, doc_ids: Sequence[str]) -> dict[str, list[float]]: ...

    async def reusable_vectors(self, embedding_keys: Iterable[str]) -> dict[str, list[float]]: ...

    async def indexed_versions(self, field_name: str, values: Iterable[int]) -> set[int]: ...

    async def all_indexed_versions(self) -> set[int]: ...

    async def bulk(self, ops: Sequence[BulkOp], *, refresh: bool = False) -> BulkResult: ...

    async def refresh(self) -> None: ...


class Projector:
    """Turns dirty keys into conditional index writes."""

    def __init__(self, settings: Settings, source: VersionSource, index: RowIndex, embedder: Embedder) -> None:
        self.settings = settings
        self.source = source
        self.index = index
        self.embedder = embedder
        # Body chunks are cut to the embedder's window (its own tokenizer counts; projections stay pure).
        self.token_budget = TokenBudget(embedder.count_tokens, embedder.max_tokens)

    @classmethod
    def on_postgres(cls, settings: Settings, engine: Engine, index: RowIndex, embedder: Embedder) -> Projector:
        """The production wiring: PostgreSQL through this engine, the index through `index`."""
        return cls(settings, PostgresSource(engine, settings.security), index, embedder)

    # -- resolution ----------------------------------------------------------------------------

    async def resolve(self, keys: DirtyKeys) -> tuple[set[int], set[int]]:
        """The versions to project on the content path, and those that need only their access rewritten."""
        content, access = await asyncio.to_thread(self.source.resolve, keys)
        # Versions deleted from PostgreSQL are found through what the event named directly.
        content |= keys.content_versions
        return content, access_only_versions(content, access)

    async def apply(self, keys: DirtyKeys, lane: Lane | None = None) -> SyncStats:
        """Project what `keys` dirtied. `lane` (`streams.topics.Lane`) limits the work to one lane:
        "access" writes everything without embedding (rows that need a vector as text first) and leaves
        the vectors to the content lane; "content" embeds and writes content; "principals" only rewrites the
        principal projection of rows already searchable (`apply_principals`); None (rebuild, tests) does both
        of the first two."""
        stats = SyncStats()
        if not keys:
            return stats
        if lane == "principals":
            return await self.apply_principals(keys, stats)
        started = time.perf_counter()
        content, access = await self.resolve(keys)
        # Documents deleted outright no longer have versions in PostgreSQL: find their rows in the index.
        if keys.content_documents:
            content |= await self.index.indexed_versions("document_id", keys.content_documents)
        if keys.truncated:
            content, access = await self._after_truncate(content, access, keys.truncated)
        stats.timed("resolve", started)
        # Access-only work first: a grant or revocation is a few partial updates and should not wait
        # behind the text rows of a bulk import in the same batch (the versions are disjoint).
        if lane != "content":
            # In slices: after a TRUNCATE this is every indexed version, whose rows are read per slice.
            ordered = sorted(access)
            for start in range(0, len(ordered), ACCESS_SLICE_VERSIONS):
                await self.project_access(ordered[start : start + ACCESS_SLICE_VERSIONS], stats)
        await self.project_versions(content, stats, embed=lane != "access")
        return stats

    async def apply_principals(self, keys: DirtyKeys, stats: SyncStats) -> SyncStats:
        """The principals lane's work: every version `keys` dirtied gets the principal projection PostgreSQL
        gives it now, on the rows search can see now; nothing else. A version without visible rows is left
        alone, without the refresh the access lane forces: the access lane applies the same change anyway
        (it reads these topics too), and it is the one that must never miss a row. Whatever more a change
        needs (rows rebuilt, a truncate's sweep) is the access lane's work too, and so is a version that keeps losing
        write races (`WriteContention`): this lane moves on rather than retry the batch."""
        started = time.perf_counter()
        if keys.unless_written_with:
            # A bulk import's grants and observations point at the versions and objects inserted with them:
            # their rows do not exist yet, or were written from PostgreSQL after that transaction.
            written = await asyncio.to_thread(self.source.written_by, keys.unless_written_with.keys())
            keys, stats.inserts_skipped = keys.settled(written)
        content, access = await self.resolve(keys) if keys else (set(), set())
        stats.timed("resolve", started)
        ordered = sorted(content | access)
        for start in range(0, len(ordered), ACCESS_SLICE_VERSIONS):
            part = ordered[start : start + ACCESS_SLICE_VERSIONS]
            try:
                await self.project_access(part, stats, refresh_if_missing=False)
            except WriteContention as exc:  # the access lane writes them too; waiting here only delays the rest
                log.warning("principals lane leaves to the access lane what kept losing write races: %s", exc)
        return stats

    async def _after_truncate(self, content: set[int], access: set[int], tables: set[str]) -> tuple[set[int], set[int]]:
        """A TRUNCATE names no row: every indexed version is checked, as `ki reconcile` does, but only as much
        as a truncate can change it. Versions gone from PostgreSQL (a content table truncated, or cascaded
        into) go on the content path, which deletes their rows; every other indexed version has its principal
        projection rewritten (an access table truncated: grants, memberships, aliases gone), a partial update
        only where it changed. A truncate cannot change a surviving version's text: a table it references
        cannot be truncated without it (CASCADE)."""
        indexed = await self.index.all_indexed_versions()
        existing = await asyncio.to_thread(self.source.existing, sorted(indexed))
        log.warning(
            "TRUNCATE of %s: %d indexed version(s) checked, %d gone from PostgreSQL",
            ", ".join(sorted(tables)), len(indexed), len(indexed - existing),
        )  # fmt: skip
        content = content | (indexed - existing)
        return content, access | (existing - content)

    async def sweep_expired(self, since: datetime | None, lane: Lane | None = None) -> tuple[SyncStats, datetime]:
        """Re-project the documents whose expiry passed after `since` (None: every expired one) -- an expiry no
        change announces -- so their rows leave the index; returns the stats and the database's clock, from
        which the next sweep looks back (`expiry_sweep_since`)."""
        ids, now = await asyncio.to_thread(self.source.expired_since, since)
        stats = await self.apply(DirtyKeys(content_documents=set(ids)), lane) if ids else SyncStats()
        return stats, now

    # -- content path --------------------------------------------------------------------------

    async def project_versions(
        self, version_ids: Iterable[int], stats: SyncStats | None = None, *, embed: bool = True
    ) -> SyncStats:
        """Rebuild these versions' rows. Without `embed` (the access lane) rows that need a vector are
        written without one, marked pending (text first); the content lane adds the vectors."""
        stats = stats or SyncStats()
        # Vectors survive a lost write race: the retry re-reads and re-plans, but never re-embeds a string;
        # each row counts once as embedded or reused, however many rounds it takes.
        known: dict[str, list[float]] = {}
        counted: set[str] = set()

        async def once(ids: list[int], round_stats: SyncStats) -> set[int]:
            return await self._project_versions_once(ids, round_stats, known, counted, embed=embed)

        await self._until_settled("content" if embed else "access", once, version_ids, stats)
        return stats

    async def _until_settled(
        self,
        path: str,
        project_once: Callable[[list[int], SyncStats], Awaitable[set[int]]],
        version_ids: Iterable[int],
        stats: SyncStats,
    ) -> None:
        """Project until no version loses a write race. Rows are read through search, which only sees
        what the last refresh published; a conflict usually means our read was older than a write we (or
        another worker or lane) just made, so the index is refreshed before the losers are read again."""
        pending = set(version_ids)
        for round_no in range(MAX_CONFLICT_ROUNDS):
            if not pending:
                return
            if round_no:  # a lost race: pause a random moment, so that two writers do not meet again, then re-read
                await asyncio.sleep(random.random() * min(CONTENTION_PAUSE_S * 2 ** (round_no - 1), 1.0))
                await self.index.refresh()
            pending = await project_once(sorted(pending), stats)
            if pending:
                stats.conflict_rounds += 1
                log.info("%s: %d version(s) lost a write race; refreshing and projecting again", path, len(pending))
        if pending:  # the last round lost too: no pause or refresh after it, the batch's retry backs off anyway
            rounds = MAX_CONFLICT_ROUNDS
            raise WriteContention(f"versions {sorted(pending)[:10]} kept conflicting after {rounds} rounds")

    async def _project_versions_once(
        self,
        version_ids: list[int],
        stats: SyncStats,
        known: dict[str, list[float]],
        counted: set[str],
        *,
        embed: bool,
    ) -> set[int]:
        started = time.perf_counter()
        # step 1: the index (no refresh needed: a `create` of a row that exists conflicts, and the version is
        # projected again from fresh reads)
        existing = await self._read_rows(version_ids, refresh_if_missing=False, with_source=("*",))
        states, grants = await asyncio.to_thread(self.source.versions, version_ids)  # step 2: PostgreSQL
        stats.timed("read", started)

        # Short versions first: in a batch with a bulk import, a short new document is not behind it.
        order = smallest_first({v: len(states[v].version.text or "") if v in states else 0 for v in version_ids})
        if not embed:
            return await self._write_text_first(order, existing, states, grants, stats)

        plans = {v: self._plan(v, existing, states, grants, stats, embeds=True) for v in order}
        lost: set[int] = set()
        # Vectors the index already holds (any row with the same embedded string) are taken first, so
        # only rows that really need the embedder count against a micro-batch.
        await self._reuse_stored([row for plan in plans.values() for row, write in plan.writes if write.needs_vector],
                                 stats, known)  # fmt: skip
        needs = [
            (v, sum(write.needs_vector and row.content_hash not in known for row, write in plan.writes))
            for v, plan in plans.items()  # in `order`
        ]
        groups = micro_batches(needs, self.settings.streams.embed_micro_batch_rows)

        def embedding(group: list[int]) -> asyncio.Task[dict[str, list[float]]]:
            rows = [row for v in group for row, write in plans[v].writes if write.needs_vector]
            return asyncio.create_task(self._vectors_for(rows, stats, known, counted))

        # A pipeline: the next micro-batch is embedded while this one is written and checked, so the
        # embedder does not wait for OpenSearch and PostgreSQL between micro-batches.
        next_vectors = embedding(groups[0]) if groups else None
        for i, group in enumerate(groups):
            assert next_vectors is not None
            vectors = await next_vectors
            next_vectors = embedding(groups[i + 1]) if i + 1 < len(groups) else None
            try:
                group_lost = await self._write_versions(group, plans, existing, stats, vectors)
                if embed:
                    # The access lane may have missed these rows (written after its read); re-check here.
                    basis = {v: _access_basis(states.get(v), grants.get(v)) for v in group if v not in group_lost}
                    group_lost |= await self._access_changed(basis)
            except BaseException:
                if next_vectors is not None:
                    next_vectors.cancel()
                raise
            lost |= group_lost
        return lost

    def _plan(
        self,
        version_id: int,
        existing: Mapping[int, Mapping[str, ExistingRow]],
        states: Mapping[int, VersionSnapshot],
        grants: Mapping[int, GrantedPrincipals],
        stats: SyncStats,
        *,
        embeds: bool,
    ) -> ContentPlan:
        """What to write and delete for one version: its rows cut from PostgreSQL's state against the stored ones."""
        started = time.perf_counter()
        stored = existing.get(version_id, {})
        state = states.get(version_id)
        new_rows = self._rows_for(state, grants.get(version_id), stored) if state else []
        plan = plan_content_writes(new_rows, stored, embeds=embeds)
        stats.versions_projected += 1
        stats.timed("plan", started)
        return plan

    async def _write_text_first(
        self,
        order: list[int],
        existing: Mapping[int, Mapping[str, ExistingRow]],
        states: Mapping[int, VersionSnapshot],
        grants: Mapping[int, GrantedPrincipals],
        stats: SyncStats,
    ) -> set[int]:
        """The access lane's content work: rows without vectors, in slices of about one `_bulk` each, each
        slice cut (tokenised) just before it is written, so the first versions are searchable after one
        slice rather than after the whole batch. The first slice is small and each next one twice as big (up
        to one `_bulk`): the smallest versions go out at once. A slice is written before a version that would
        overflow it is even tokenised: a short document is not held up by cutting a bulk import behind it.
        Returns the versions to project again."""
        full = self.settings.streams.bulk_max_rows
        limit = max(1, full // FIRST_SLICE_DIVISOR)
        retrieval = self.settings.retrieval
        lost: set[int] = set()
        plans: dict[int, ContentPlan] = {}
        rows = 0
        for version_id in order:
            state = states.get(version_id)
            text_chars = len(state.version.text or "") if state else 0
            expected = expected_rows(text_chars, retrieval.chunk_chars, retrieval.chunk_overlap_chars)
            if plans and rows + expected > limit:
                lost |= await self._write_text_slice(plans, existing, states, grants, stats)
                plans, rows, limit = {}, 0, min(full, 2 * limit)
            plan = plans[version_id] = self._plan(version_id, existing, states, grants, stats, embeds=False)
            rows += len(plan.writes) + len(plan.deletes)
            if rows >= limit:
                lost |= await self._write_text_slice(plans, existing, states, grants, stats)
                plans, rows, limit = {}, 0, min(full, 2 * limit)
        if plans:
            lost |= await self._write_text_slice(plans, existing, states, grants, stats)
        return lost

    async def _write_text_slice(
        self,
        plans: Mapping[int, ContentPlan],
        existing: Mapping[int, Mapping[str, ExistingRow]],
        states: Mapping[int, VersionSnapshot],
        grants: Mapping[int, GrantedPrincipals],
        stats: SyncStats,
    ) -> set[int]:
        """Write one slice of text-first rows, then check their access against PostgreSQL, as the content lane
        does after embedding: with several access workers a grant's partition and its version's may be
        another worker's, whose access work may have read the index before these rows existed. A version whose
        projection changed since its read is projected again. Returns the versions to redo."""
        lost = await self._write_versions(list(plans), plans, existing, stats, {})
        started = time.perf_counter()
        basis = {v: _access_basis(states[v], grants.get(v)) for v in plans if v not in lost and v in states}
        lost |= await self._access_changed(basis)
        stats.timed("recheck", started)
        return lost

    async def _read_rows(
        self, version_ids: list[int], *, refresh_if_missing: bool = True, **fields: Sequence[str]
    ) -> dict[int, dict[str, ExistingRow]]:
        """The stored rows of these versions. Search only sees refreshed rows, and rows the other lane (or
        worker) wrote a moment ago may not be: a version found without rows is read again after a refresh,
        so that access work never skips rows just because they are new."""
        existing = await self.index.existing_rows(version_ids, **fields)
        missing = [version_id for version_id in version_ids if not existing.get(version_id)]
        if missing and refresh_if_missing:
            await self.index.refresh()
            existing.update(await self.index.existing_rows(missing, **fields))
        return existing

    async def _access_changed(self, basis: Mapping[int, AccessBasis]) -> set[int]:
        """The versions whose projection or first observation changed in PostgreSQL since the rows were built.

        A content write can take minutes of embedding; a grant committed meanwhile is projected by the
        access lane, but only onto rows it can read, and rows created after its read were built from the
        older state. Checking after the write closes that gap: such a version is simply projected again
        (cheaply: its vectors are kept)."""
        if not basis:
            return set()
        current = await asyncio.to_thread(self.source.access_bases, sorted(basis))
        return {v for v, used in basis.items() if current.get(v) != used}

    async def _write_versions(
        self,
        version_ids: list[int],
        plans: Mapping[int, ContentPlan],
        existing: Mapping[int, Mapping[str, ExistingRow]],
        stats: SyncStats,
        vectors: Mapping[str, list[float]],
    ) -> set[int]:
        """Write one micro-batch of planned versions with the vectors of its rows that need one (by row
        id); returns the versions to project again."""
        ops: list[BulkOp] = []
        planned: list[tuple[int, IndexRow, RowWrite, ExistingRow | None]] = []
        for version_id in version_ids:
            stored = existing.get(version_id, {})
            plan = plans[version_id]
            ops.extend(_delete(stored[doc_id], version_id) for doc_id in plan.deletes)
            stats.rows_deleted += len(plan.deletes)
            planned.extend((version_id, row, write, stored.get(row.id)) for row, write in plan.writes)

        # REPLACE keeps the stored vector, read here (after step 1, so a row deleted meanwhile is missing).
        kept = await self.index.vectors(
            [old.doc_id for _, _, write, old in planned if old is not None and write is RowWrite.REPLACE]
        )
        lost: set[int] = set()
        for version_id, row, write, old in planned:
            group = str(version_id)
            if write is RowWrite.TEXT:  # text first: searchable by words now, the vector comes later
                waiting = old.source.get(VECTOR_PENDING) if old is not None else None
                body = {**row.source, VECTOR_PENDING: waiting or int(time.time() * 1000)}
                stats.rows_text_first += 1
                if old is None:
                    ops.append(BulkOp("create", row.id, body, group=group))
                else:
                    ops.append(BulkOp("index", row.id, body, old.seq_no, old.primary_term, group=group))
            elif old is None:  # RowWrite.CREATE
                ops.append(BulkOp("create", row.id, {**row.source, "embedding": vectors[row.id]}, group=group))
            elif write is RowWrite.UPDATE:
                ops.append(BulkOp("update", row.id, row.source, old.seq_no, old.primary_term, group=group))
            else:  # REEMBED and ADD_VECTOR with their vector, REPLACE with the stored one
                vector = vectors[row.id] if write.needs_vector else kept.get(old.doc_id)
                if vector is None:
                    lost.add(version_id)  # the row was deleted since step 1: project the version again
                    continue
                body = {**row.source, "embedding": vector}
                ops.append(BulkOp("index", row.id, body, old.seq_no, old.primary_term, group=group))
        result = await self._write(ops, stats)
        stats.rows_written += result.written
        return {int(group) for group in result.conflicts} | lost

    async def _write(self, ops: list[BulkOp], stats: SyncStats) -> BulkResult:
        started = time.perf_counter()
        result = await self.index.bulk(ops)
        stats.timed("write", started)
        return result

    async def _reuse_stored(self, rows: Sequence[IndexRow], stats: SyncStats, known: dict[str, list[float]]) -> None:
        """Add to `known` the vectors the index holds for these rows' embedded strings."""
        wanted = {row.content_hash for row in rows} - known.keys()
        if wanted:
            started = time.perf_counter()
            known.update(await self.index.reusable_vectors(wanted))
            stats.timed("reuse", started)

    async def _vectors_for(
        self, rows: Sequence[IndexRow], stats: SyncStats, known: dict[str, list[float]], counted: set[str]
    ) -> dict[str, list[float]]:
        """A vector for each row: each distinct embedded string once, none whose vector is `known` (held
        by the index, or embedded in an earlier round). Fresh vectors are added to `known`; rows not yet
        `counted` count as embedded (the first row of a fresh string) or reused (every other)."""
        if not rows:
            return {}
        distinct: dict[str, IndexRow] = {}
        for row in rows:
            if row.content_hash not in known:
                distinct.setdefault(row.content_hash, row)
        fresh = list(distinct.values())
        if fresh:
            started = time.perf_counter()
            embedded = await asyncio.to_thread(self.embedder.embed, [row.embed_input for row in fresh])
            known.update((row.content_hash, vector) for row, vector in zip(fresh, embedded, strict=True))
            stats.timed("embed", started)
        first = {row.id for row in fresh}
        for row in rows:
            if row.id not in counted:
                counted.add(row.id)
                if row.id in first:
                    stats.rows_embedded += 1
                else:
                    stats.rows_reused += 1
        return {row.id: known[row.content_hash] for row in rows}

    def _rows_for(
        self, state: VersionSnapshot, granted: GrantedPrincipals | None, old_rows: Mapping[str, ExistingRow]
    ) -> list[IndexRow]:
        granted = granted or GrantedPrincipals((), ())
        access = AccessProjection(
            allowed_principals=granted.allowed_principals,
            denied_principals=granted.denied_principals,
            access_version=next_access_version(old_rows.values(), granted),
        )
        return build_rows(
            state.document,
            state.version,
            doc_type_ancestors=state.doc_type_ancestors,
            doc_type_label=state.doc_type_label,
            matter_title=state.matter_title,
            matter_reference=state.matter_reference,
            access=access,
            settings=self.settings.retrieval,
            source_object_id=str(state.source_object_id) if state.source_object_id is not None else None,
            token_budget=self.token_budget,
            now=state.read_at,
        )

    # -- access-only path ----------------------------------------------------------------------

    async def project_access(
        self, version_ids: Iterable[int], stats: SyncStats | None = None, *, refresh_if_missing: bool = True
    ) -> SyncStats:
        """Rewrite only the principal projection of these versions' rows: no splitting, no embedding. Without
        `refresh_if_missing` (the principals lane) rows written since the last refresh may be missed."""
        stats = stats or SyncStats()

        async def once(ids: list[int], round_stats: SyncStats) -> set[int]:
            return await self._project_access_once(ids, round_stats, refresh_if_missing=refresh_if_missing)

        await self._until_settled("access", once, version_ids, stats)
        return stats

    async def _project_access_once(
        self, version_ids: list[int], stats: SyncStats, *, refresh_if_missing: bool = True
    ) -> set[int]:
        started = time.perf_counter()
        # Index first, PostgreSQL second: a projection read after the seq_no it is conditioned on can
        # only be newer than what that seq_no holds, so a conditional write never regresses the row.
        existing = await self._read_rows(
            version_ids, refresh_if_missing=refresh_if_missing, with_doc_values=PRINCIPAL_FIELDS
        )
        stats.timed("read", started)
        started = time.perf_counter()
        # Only versions with rows need their projection: during a bulk import most dirtied versions have none yet
        # (their rows are written later, from PostgreSQL as it is then).
        with_rows = [version_id for version_id in version_ids if existing.get(version_id)]
        grants = await asyncio.to_thread(self.source.grants, with_rows) if with_rows else {}
        stats.timed("grants", started)
        ops: list[BulkOp | None] = []
        for version_id in version_ids:
            rows = existing.get(version_id, {})
            granted = grants.get(version_id, GrantedPrincipals((), ()))
            ops.extend(_access_update(row, granted, version_id) for row in rows.values())
            stats.access_versions += 1
        result = await self._write([op for op in ops if op is not None], stats)
        stats.access_rows_updated += result.written
        return {int(group) for group in result.conflicts}


def _access_basis(state: VersionSnapshot | None, granted: GrantedPrincipals | None) -> AccessBasis:
    return AccessBasis.of(granted, state.source_object_id if state else None)


def _access_update(row: ExistingRow, granted: GrantedPrincipals, version_id: int) -> BulkOp | None:
    """The conditional partial update giving a stored row this projection; None when it holds it already."""
    body = access_only_update(row, granted)
    if body is None:
        return None
    return BulkOp("update", row.doc_id, body, row.seq_no, row.primary_term, group=str(version_id))


def _delete(old: ExistingRow, version_id: int) -> BulkOp:
    return BulkOp("delete", old.doc_id, None, old.seq_no, old.primary_term, group=str(version_id))
