"""The projector's sequencing (streams.sync.Projector) without services: PostgreSQL and the index are
small in-memory stand-ins for its two interfaces, `VersionSource` and `RowIndex`. What they prove here
is the order and the decisions — which rows are written how, what is embedded once, what is projected
again after a lost race; the same paths run against the real stack in tests/integration (test_lanes,
test_rebuild, the fault and property suites)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

import streams.sync
from ki.acl import GrantedPrincipals
from ki.errors import TransientError, WriteContention
from ki.settings import load_settings
from projections.dirty import DirtyKeys, WrittenWith
from projections.rows import DocumentState, VersionState
from streams.source import AccessBasis, VersionSnapshot
from streams.sync import MAX_CONFLICT_ROUNDS, Projector
from streams.writer import BulkOp, BulkResult, ExistingRow

SETTINGS = load_settings(environ={})
ALICE = GrantedPrincipals(("user:alice",), ())
BOB = GrantedPrincipals(("user:bob",), ())
PARAGRAPHS = [
    f"§ {n} Der Mieter zahlt die Miete für den Monat {n} bis zum dritten Werktag im Voraus auf das Konto "
    f"des Vermieters. Nebenkosten der Abrechnungsperiode {n} werden gesondert abgerechnet. " * 3
    for n in range(1, 9)
]
TEXT = "\n\n".join(PARAGRAPHS)


def snapshot(
    version_id: int = 11, document_id: int = 1, text: str = TEXT, title: str | None = None, **document: Any
) -> VersionSnapshot:
    return VersionSnapshot(
        document=DocumentState(id=document_id, project_id=1, title=title or f"Mietvertrag {document_id}", **document),
        version=VersionState(
            id=version_id,
            document_id=document_id,
            version_no=1,
            status="draft",
            language="de",
            doc_date=date(2026, 1, 5),
            text=text,
        ),
        doc_type_ancestors=(),
        doc_type_label=None,
        matter_title=None,
        matter_reference=None,
        source_object_id=7,
    )


@dataclass
class Source:
    """PostgreSQL as of now; `after_read` runs once after the projector read the versions (a commit
    that lands while the batch is being embedded)."""

    states: dict[int, VersionSnapshot] = field(default_factory=dict)
    granted: dict[int, GrantedPrincipals] = field(default_factory=dict)
    access_dirty: set[int] = field(default_factory=set)
    after_read: Any = None
    #: Rows whose last writer is the transaction named (PostgreSQL's xmin), and what the sync asked about them.
    written: set[WrittenWith] = field(default_factory=set)
    resolved: list[DirtyKeys] = field(default_factory=list)

    def written_by(self, anchors: Collection[WrittenWith]) -> set[WrittenWith]:
        return set(anchors) & self.written

    def resolve(self, keys: DirtyKeys) -> tuple[set[int], set[int]]:
        self.resolved.append(keys)
        asked = keys.content_versions | keys.access_versions
        dirty_access = self.access_dirty if keys.names_access else set()
        return {v for v in self.states if v in asked}, {v for v in dirty_access if v in self.states}

    def versions(self, version_ids: Sequence[int]) -> tuple[dict[int, VersionSnapshot], dict[int, GrantedPrincipals]]:
        found = {v: self.states[v] for v in version_ids if v in self.states}
        grants = {v: self.granted.get(v, GrantedPrincipals((), ())) for v in found}
        if self.after_read is not None:
            change, self.after_read = self.after_read, None
            change(self)
        return found, grants

    def grants(self, version_ids: Sequence[int]) -> dict[int, GrantedPrincipals]:
        return {v: self.granted.get(v, GrantedPrincipals((), ())) for v in version_ids if v in self.states}

    def existing(self, version_ids: Sequence[int]) -> set[int]:
        return {v for v in version_ids if v in self.states}

    def access_bases(self, version_ids: Sequence[int]) -> dict[int, AccessBasis]:
        # A version gone from PostgreSQL has no grants and no observation (as version_projections answers).
        return {
            v: AccessBasis.of(self.granted.get(v), self.states[v].source_object_id)
            if v in self.states
            else AccessBasis.of(None, None)
            for v in version_ids
        }


@dataclass
class Stored:
    source: dict[str, Any]
    embedding: list[float] | None
    seq_no: int


@dataclass
class Index:
    """Rows with sequence numbers and OpenSearch's conditional-write rules: a `create` of an existing id
    and a write conditioned on an old seq_no both conflict. `races[v]` makes version v's next n writes
    lose as if another writer got there first."""

    rows: dict[str, Stored] = field(default_factory=dict)
    races: dict[int, int] = field(default_factory=dict)
    seq: int = 0
    refreshes: int = 0
    bulks: list[list[BulkOp]] = field(default_factory=list)

    async def existing_rows(
        self, version_ids: Iterable[int], *, with_source: Sequence[str] = (), with_doc_values: Sequence[str] = ()
    ) -> dict[int, dict[str, ExistingRow]]:
        found: dict[int, dict[str, ExistingRow]] = {int(v): {} for v in version_ids}
        for doc_id, row in self.rows.items():
            version_id = int(row.source["document_version_id"])
            if version_id in found:
                found[version_id][doc_id] = ExistingRow(
                    doc_id=doc_id,
                    seq_no=row.seq_no,
                    primary_term=1,
                    content_hash=row.source["meta"]["content_hash"],
                    access_version=int(row.source.get("access_version") or 0),
                    source=copy.deepcopy(row.source),
                )
        return found

    async def vectors(self, doc_ids: Sequence[str]) -> dict[str, list[float]]:
        return {d: self.rows[d].embedding for d in doc_ids if d in self.rows and self.rows[d].embedding}  # type: ignore[misc]

    async def reusable_vectors(self, embedding_keys: Iterable[str]) -> dict[str, list[float]]:
        wanted = set(embedding_keys)
        return {
            row.source["embedding_key"]: row.embedding
            for row in self.rows.values()
            if row.source["embedding_key"] in wanted and row.embedding is not None
        }

    async def indexed_versions(self, field_name: str, values: Iterable[int]) -> set[int]:
        wanted = {str(v) for v in values}
        return {int(r.source["document_version_id"]) for r in self.rows.values() if str(r.source[field_name]) in wanted}

    async def all_indexed_versions(self) -> set[int]:
        return {int(r.source["document_version_id"]) for r in self.rows.values()}

    async def bulk(self, ops: Sequence[BulkOp], *, refresh: bool = False) -> BulkResult:
        self.bulks.append(list(ops))
        result = BulkResult()
        for op in ops:
            version_id = int(op.group)
            if self.races.get(version_id):
                self.races[version_id] -= 1
                result.conflicts.add(op.group)
                continue
            current = self.rows.get(op.doc_id)
            stale = op.if_seq_no is not None and (current is None or current.seq_no != op.if_seq_no)
            if stale or (op.kind == "create" and current is not None) or (op.kind != "create" and current is None):
                result.conflicts.add(op.group)
                continue
            self.seq += 1
            body = copy.deepcopy(op.body or {})
            if op.kind == "delete":
                del self.rows[op.doc_id]
            elif op.kind == "update":
                assert current is not None
                self.rows[op.doc_id] = Stored({**current.source, **body}, current.embedding, self.seq)
            else:
                embedding = body.pop("embedding", None)  # a text row (text first) has none yet
                self.rows[op.doc_id] = Stored(body, embedding, self.seq)
            result.written += 1
        return result

    async def refresh(self) -> None:
        self.refreshes += 1

    def of(self, version_id: int) -> dict[str, Stored]:
        return {d: r for d, r in self.rows.items() if int(r.source["document_version_id"]) == version_id}


class Embedder:
    """Words as tokens; each call recorded, so a test sees what was embedded and how often."""

    max_tokens = 512

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return [[float(len(t)), 1.0] for t in texts]

    @property
    def embedded(self) -> int:
        return sum(len(call) for call in self.calls)


def world(*snapshots: VersionSnapshot, **source: Any) -> tuple[Projector, Source, Index, Embedder]:
    db = Source(states={s.version.id: s for s in snapshots}, **source)
    index, embedder = Index(), Embedder()
    return Projector(SETTINGS, db, index, embedder), db, index, embedder  # type: ignore[arg-type]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def content(*version_ids: int) -> DirtyKeys:
    return DirtyKeys(content_versions=set(version_ids))


def granted_to(*principals: str) -> DirtyKeys:
    """A grant, membership or alias change naming these principals (the source knows which versions)."""
    return DirtyKeys(access_principals=set(principals))


def test_a_new_version_gets_its_rows_with_vectors_each_distinct_input_embedded_once() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    stats = run(projector.apply(content(11)))
    rows = index.of(11)
    assert len(rows) > 2 and all(row.embedding for row in rows.values())
    assert all(row.source["allowed_principals"] == ["user:alice"] for row in rows.values())
    distinct_inputs = {row.source["meta"]["content_hash"] for row in rows.values()}
    assert embedder.embedded == len(distinct_inputs) == stats.rows_embedded
    assert stats.rows_written == len(rows) and stats.versions_projected == 1
    # Nothing changed: projecting again writes nothing and embeds nothing.
    again = run(projector.apply(content(11)))
    assert (again.rows_written, embedder.embedded) == (0, len(distinct_inputs))


def test_the_access_lane_writes_a_new_version_as_text_first_and_the_content_lane_adds_the_vectors() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    stats = run(projector.apply(content(11), lane="access"))
    text_rows = index.of(11)
    assert text_rows and embedder.calls == [] and stats.rows_text_first == len(text_rows) == stats.rows_written
    assert all(r.embedding is None and r.source["vector_pending"] > 0 for r in text_rows.values())
    assert all(r.source["allowed_principals"] == ["user:alice"] for r in text_rows.values())
    # Seen again by the access lane: the same text rows, nothing written.
    assert run(projector.apply(content(11), lane="access")).rows_written == 0
    stats = run(projector.apply(content(11), lane="content"))
    rows = index.of(11)
    assert rows.keys() == text_rows.keys() and all(r.embedding for r in rows.values())
    assert all("vector_pending" not in r.source for r in rows.values())  # exactly the rows a rebuild writes
    assert embedder.embedded == stats.rows_embedded == len({r.source["embedding_key"] for r in rows.values()})
    # ... and rows equal to those a lane that embeds writes directly.
    direct, *_ = world(snapshot(), granted={11: ALICE})
    run(direct.apply(content(11)))
    assert {d: (r.source, r.embedding) for d, r in direct.index.rows.items()} == {  # type: ignore[attr-defined]
        d: (r.source, r.embedding) for d, r in rows.items()
    }


def test_the_access_lane_writes_a_changed_text_at_once_and_never_touches_a_vector() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    embedded = embedder.embedded
    db.states[11] = snapshot(text="Ein ganz anderer Text über Kündigungsfristen. " * 3)
    db.granted[11] = BOB
    stats = run(projector.apply(content(11), lane="access"))
    after = index.of(11)
    assert embedder.embedded == embedded and stats.rows_text_first > 0
    chunks = [r for r in after.values() if r.source["chunk_kind"] == "chunk"]
    assert chunks and all("Kündigungsfristen" in r.source["text"] and r.embedding is None for r in chunks)
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in after.values())
    assert all(op.kind != "update" or "embedding" not in (op.body or {}) for op in index.bulks[-1])
    # The content lane then brings the vectors, for the text the access lane wrote.
    run(projector.apply(content(11), lane="content"))
    assert all(r.embedding and "vector_pending" not in r.source for r in index.of(11).values())


def rows_written_by(lane: str | None) -> dict[str, Stored]:
    """The rows one lane alone writes for the standard version (None: a lane that embeds everything)."""
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11), lane=lane))
    return index.rows


def test_text_rows_written_while_the_content_lane_embedded_get_their_vectors_in_the_next_round() -> None:
    text_rows = rows_written_by("access")

    def access_lane_writes(db: Source) -> None:  # between the content lane's reads and its writes
        index.rows.update(copy.deepcopy(text_rows))

    projector, db, index, embedder = world(snapshot(), granted={11: ALICE}, after_read=access_lane_writes)
    stats = run(projector.apply(content(11), lane="content"))
    assert stats.conflict_rounds == 1 and index.of(11).keys() == text_rows.keys()
    assert all(r.embedding and "vector_pending" not in r.source for r in index.of(11).values())
    assert embedder.embedded == len({r.source["embedding_key"] for r in index.of(11).values()})  # once each
    assert stats.rows_embedded + stats.rows_reused == len(index.of(11))  # each row counted once, over both rounds


def test_a_text_row_never_overwrites_a_row_that_got_its_vector_first() -> None:
    vectored = rows_written_by(None)

    def content_lane_writes(db: Source) -> None:  # between the access lane's reads and its writes
        index.rows.update(copy.deepcopy(vectored))

    projector, db, index, embedder = world(snapshot(), granted={11: ALICE}, after_read=content_lane_writes)
    stats = run(projector.apply(content(11), lane="access"))
    assert stats.conflict_rounds == 1 and stats.rows_text_first > 0  # its creates lost, the re-plan kept them
    assert {d: (r.source, r.embedding) for d, r in index.rows.items()} == {
        d: (r.source, r.embedding) for d, r in vectored.items()
    }


def test_the_access_lane_writes_a_short_new_document_before_a_bulk_import_of_the_same_batch() -> None:
    imported = [snapshot(version_id=100 + n, document_id=100 + n) for n in range(12)]
    short = snapshot(version_id=999, document_id=9, text="Kurzer Schriftsatz: die Frist wird gewahrt.")
    projector, db, index, embedder = world(*imported, short)
    projector.settings = load_settings(environ={"KI_STREAMS__BULK_MAX_ROWS": "10"})
    stats = run(projector.apply(content(*[s.version.id for s in imported], 999), lane="access"))
    written = [int(op.group) for bulk in index.bulks for op in bulk]
    assert written[0] == 999  # the short new document first, though its id is the highest
    assert {int(op.group) for op in index.bulks[0]} == {999}  # alone: the first slice is the smallest
    # Written in slices of about one `_bulk` (each cut just before it is written), every row once.
    assert len(index.bulks) > 1 and all(len(bulk) < 10 + len(index.of(100)) for bulk in index.bulks)
    assert len(written) == stats.rows_written == len(index.rows) and stats.versions_projected == 13


def test_a_short_new_document_is_written_alone_before_a_large_import_is_cut() -> None:
    """The slice holding the short document is written before the large version is tokenised: the short
    one's `_bulk` carries none of the large one's rows (with one slice for both it would wait for them)."""
    paragraph = "Der Mieter zahlt die Miete monatlich im Voraus bis zum dritten Werktag des Monats. "
    large = snapshot(version_id=100, document_id=100, text="\n\n".join([paragraph * 8] * 40))
    short = snapshot(version_id=999, document_id=9, text="Kurzer Schriftsatz: die Frist wird gewahrt.")
    projector, db, index, embedder = world(large, short)
    projector.settings = load_settings(environ={"KI_STREAMS__BULK_MAX_ROWS": "20"})
    stats = run(projector.apply(content(100, 999), lane="access"))
    assert len(index.of(100)) > 20  # the large version alone fills more than one slice
    assert {int(op.group) for op in index.bulks[0]} == {999}
    assert stats.rows_written == len(index.rows)


def test_access_only_work_is_written_before_the_text_rows_of_the_same_batch() -> None:
    projector, db, index, embedder = world(snapshot(), snapshot(version_id=12, document_id=2))
    run(projector.apply(content(11)))
    db.granted[11], db.access_dirty = BOB, {11}
    keys = content(12)
    keys.update(granted_to("user:bob"))
    run(projector.apply(keys, lane="access"))
    kinds = [(op.kind, int(op.group)) for bulk in index.bulks[-2:] for op in bulk]
    assert kinds[0] == ("update", 11) and kinds[-1] == ("create", 12)


def test_an_access_change_updates_the_projection_and_bumps_access_version_without_embedding() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    embedded, versions = embedder.embedded, {r.source["access_version"] for r in index.of(11).values()}
    db.granted[11], db.access_dirty = BOB, {11}
    stats = run(projector.apply(granted_to("user:bob"), lane="access"))
    rows = index.of(11).values()
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in rows)
    assert {r.source["access_version"] for r in rows} == {max(versions) + 1}
    assert embedder.embedded == embedded and stats.access_rows_updated == len(rows)
    # The same grants again: every row already holds them, nothing is written.
    assert run(projector.apply(granted_to("user:bob"), lane="access")).access_rows_updated == 0


def test_access_only_work_asks_for_the_projection_of_versions_with_rows_only() -> None:
    """During a bulk import a batch's grants and observations dirty thousands of versions whose rows are not
    written yet (their text comes later, from PostgreSQL as it is then): no projection is computed for them."""
    projector, db, index, embedder = world(snapshot(), snapshot(version_id=12, document_id=2), granted={11: ALICE})
    run(projector.apply(content(11)))  # 12 has no rows yet
    db.granted.update({11: BOB, 12: BOB})
    db.access_dirty = {11, 12}
    asked: list[list[int]] = []
    grants = db.grants
    db.grants = lambda version_ids: asked.append(list(version_ids)) or grants(version_ids)  # type: ignore[method-assign]
    stats = run(projector.project_access([11, 12]))
    assert asked == [[11]] and not index.of(12)
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(11).values())
    assert stats.access_rows_updated == len(index.of(11))


def test_the_principals_lane_rewrites_only_the_projection_of_rows_it_can_see() -> None:
    projector, db, index, embedder = world(snapshot(), snapshot(version_id=12, document_id=2), granted={11: ALICE})
    run(projector.apply(content(11)))  # 12 has no rows yet: its import waits in the access lane
    embedded, bulks, refreshes = embedder.embedded, len(index.bulks), index.refreshes
    db.granted.update({11: BOB, 12: BOB})
    db.access_dirty = {11, 12}
    asked: list[list[int]] = []
    grants = db.grants
    db.grants = lambda version_ids: asked.append(list(version_ids)) or grants(version_ids)  # type: ignore[method-assign]
    stats = run(projector.apply(granted_to("user:bob"), lane="principals"))
    assert asked == [[11]]  # PostgreSQL is asked for the projection of versions with rows only
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(11).values())
    assert stats.access_rows_updated == len(index.of(11)) and stats.versions_projected == 0
    # No rows made for 12 (the access lane writes them, from PostgreSQL as it is then), nothing embedded, one
    # bulk of partial updates, and no refresh forced to look for rows the access lane may have just written.
    assert not index.of(12) and embedder.embedded == embedded
    assert len(index.bulks) == bulks + 1 and all(op.kind == "update" for op in index.bulks[-1])
    assert index.refreshes == refreshes


def test_the_principals_lane_skips_inserts_made_with_the_row_they_point_at_and_applies_the_rest() -> None:
    """A bulk import's grants point at documents its own transactions wrote: nothing to read or write for them.
    A grant inserted on a document written earlier is applied at once."""
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    db.granted[11] = BOB
    db.access_dirty = {11}
    new_document = WrittenWith("documents", 2, 901)
    with_its_document = DirtyKeys(unless_written_with={new_document: DirtyKeys(access_documents={2})})
    db.written = {new_document}
    bulks, resolves = len(index.bulks), len(db.resolved)
    stats = run(projector.apply(with_its_document, lane="principals"))
    assert stats.inserts_skipped == 1 and len(db.resolved) == resolves and len(index.bulks) == bulks
    assert all(r.source["allowed_principals"] == ["user:alice"] for r in index.of(11).values())
    older_document = WrittenWith("documents", 1, 902)
    on_an_older_document = DirtyKeys(unless_written_with={older_document: DirtyKeys(access_documents={1})})
    stats = run(projector.apply(on_an_older_document, lane="principals"))
    assert stats.inserts_skipped == 0 and db.resolved[-1].access_documents == {1}
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(11).values())


def test_the_principals_lane_leaves_content_keys_alone() -> None:
    """A content key reaching the principals lane (it reads no content table) makes no rows and no vectors."""
    projector, db, index, embedder = world(snapshot())
    stats = run(projector.apply(content(11), lane="principals"))
    assert not index.rows and embedder.embedded == 0 and stats.rows_written == 0


def test_a_lost_write_race_refreshes_and_projects_again_without_embedding_again() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    index.races[11] = 1
    stats = run(projector.apply(content(11)))
    assert stats.conflict_rounds == 1 and index.refreshes >= 1
    assert index.of(11) and all(r.embedding for r in index.of(11).values())
    assert embedder.embedded == len({r.source["meta"]["content_hash"] for r in index.of(11).values()})


def test_a_version_that_keeps_losing_fails_the_batch_as_contention_after_the_bounded_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Contention is transient: the batch is retried with backoff, never dead-lettered."""
    monkeypatch.setattr(streams.sync, "CONTENTION_PAUSE_S", 0.0)
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    index.races[11] = 10_000
    with pytest.raises(WriteContention, match="kept conflicting"):
        run(projector.apply(content(11)))
    # A refresh before each round after a lost one, none after the last: the batch's retry backs off anyway.
    assert index.refreshes == MAX_CONFLICT_ROUNDS - 1
    assert isinstance(WriteContention("x"), TransientError)


def test_a_version_that_wins_in_the_last_round_is_written_and_fails_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams.sync, "CONTENTION_PAUSE_S", 0.0)
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    db.granted[11] = BOB
    db.access_dirty = {11}
    index.races[11] = len(index.of(11)) * (MAX_CONFLICT_ROUNDS - 1)  # each row's update loses, round after round
    stats = run(projector.apply(granted_to("user:bob"), lane="access"))
    assert stats.conflict_rounds == MAX_CONFLICT_ROUNDS - 1 and index.races[11] == 0
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(11).values())


def test_the_principals_lane_leaves_a_version_that_keeps_losing_to_the_access_lane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streams.sync, "CONTENTION_PAUSE_S", 0.0)
    projector, db, index, embedder = world(
        snapshot(), snapshot(version_id=12, document_id=2), granted={11: ALICE, 12: ALICE}
    )
    run(projector.apply(content(11, 12)))
    db.granted.update({11: BOB, 12: BOB})
    db.access_dirty = {11, 12}
    index.races[11] = 10_000
    stats = run(projector.apply(granted_to("user:bob"), lane="principals"))  # no error: the batch is done
    assert stats.conflict_rounds == MAX_CONFLICT_ROUNDS
    assert all(r.source["allowed_principals"] == ["user:alice"] for r in index.of(11).values())
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(12).values())


def test_a_grant_committed_while_the_content_was_embedded_is_projected_before_the_batch_ends() -> None:
    def revoke(db: Source) -> None:
        db.granted[11] = BOB

    projector, db, index, embedder = world(snapshot(), granted={11: ALICE}, after_read=revoke)
    stats = run(projector.apply(content(11), lane="content"))
    assert stats.conflict_rounds == 1
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(11).values())


def test_a_grant_committed_while_text_first_rows_were_cut_is_projected_before_the_batch_ends() -> None:
    """The access lane's text-first rows are checked against PostgreSQL after their write: with several access
    workers the grant may be another worker's, whose access work read the index before these rows existed."""

    def revoke(db: Source) -> None:
        db.granted[11] = BOB

    projector, db, index, embedder = world(snapshot(), granted={11: ALICE}, after_read=revoke)
    stats = run(projector.apply(content(11), lane="access"))
    assert stats.conflict_rounds == 1 and embedder.calls == []
    assert all(r.source["allowed_principals"] == ["user:bob"] for r in index.of(11).values())
    # Nothing changed since: the check finds nothing and no second round runs.
    assert run(projector.apply(content(11), lane="access")).conflict_rounds == 0


def test_a_new_version_reuses_its_predecessors_vectors_for_repeated_paragraphs() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    first = embedder.embedded
    amended = snapshot(version_id=12, text=TEXT + "\n\n§ 9 Die Kaution beträgt drei Monatsmieten.")
    db.states[12] = replace(amended, version=replace(amended.version, version_no=2))
    stats = run(projector.apply(content(12)))
    assert stats.rows_reused > 0 and stats.rows_embedded < stats.rows_reused + stats.rows_embedded
    assert embedder.embedded - first == stats.rows_embedded


def test_another_document_with_the_same_embedded_strings_reuses_their_vectors_and_embeds_nothing() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    first = embedder.embedded
    # Same title (the context header is part of what is embedded) and text: every input is known.
    db.states[21] = snapshot(version_id=21, document_id=2, title="Mietvertrag 1")
    db.states[31] = snapshot(version_id=31, document_id=3, text=TEXT + "\n\n§ 9 Neu.")
    embedded_when_written: dict[str, int] = {}
    write = index.bulk

    async def recording(ops: Sequence[BulkOp], *, refresh: bool = False) -> BulkResult:
        for op in ops:
            embedded_when_written.setdefault(op.group, embedder.embedded)
        return await write(ops, refresh=refresh)

    index.bulk = recording  # type: ignore[method-assign]
    stats = run(projector.apply(content(21, 31)))
    copied = index.of(21)
    assert copied and all(r.embedding == index.rows[d.replace("21:", "11:", 1)].embedding for d, r in copied.items())
    assert (
        embedder.embedded - first
        == stats.rows_embedded
        == len({r.source["embedding_key"] for r in index.of(31).values()})
    )
    assert stats.rows_reused == len(copied)
    # Rows whose vectors are known are written before anything is embedded (they wait for no micro-batch).
    assert embedded_when_written == {"21": first, "31": embedder.embedded}


def test_a_deleted_document_loses_its_rows_found_through_the_index() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    db.states.clear()  # the document and its versions are gone from PostgreSQL
    stats = run(projector.apply(DirtyKeys(content_documents={1})))
    assert index.rows == {} and stats.rows_deleted > 0


def test_a_soft_deleted_document_loses_its_rows() -> None:
    projector, db, index, embedder = world(snapshot(), granted={11: ALICE})
    run(projector.apply(content(11)))
    db.states[11] = snapshot(deleted_at=datetime(2026, 2, 1))
    run(projector.apply(content(11)))
    assert index.of(11) == {}


def test_a_truncated_versions_table_deletes_the_rows_of_every_version_gone() -> None:
    projector, db, index, embedder = world(snapshot(), snapshot(version_id=12, document_id=2), granted={11: ALICE})
    run(projector.apply(content(11, 12)))
    del db.states[11]  # TRUNCATE ... CASCADE names no row: the index is compared with PostgreSQL
    stats = run(projector.apply(DirtyKeys(truncated={"document_versions"}), lane="access"))
    assert index.of(11) == {} and index.of(12) and stats.rows_deleted > 0


@pytest.mark.parametrize("slice_versions", [1, 2000])
def test_a_truncated_grants_table_rewrites_every_indexed_versions_projection_without_embedding(
    slice_versions: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams.sync, "ACCESS_SLICE_VERSIONS", slice_versions)
    granted = {11: ALICE, 12: BOB}
    projector, db, index, embedder = world(snapshot(), snapshot(version_id=12, document_id=2), granted=granted)
    run(projector.apply(content(11, 12)))
    embedded = embedder.embedded
    db.granted.clear()
    stats = run(projector.apply(DirtyKeys(truncated={"grants"}), lane="access"))
    rows = [*index.of(11).values(), *index.of(12).values()]
    assert all(r.source["allowed_principals"] == [] for r in rows)
    assert stats.access_rows_updated == len(rows) and embedder.embedded == embedded


def test_resolve_sends_a_version_dirtied_both_ways_down_the_content_path_alone() -> None:
    projector, db, index, embedder = world(snapshot(), snapshot(version_id=12, document_id=2), access_dirty={11, 12})
    keys = DirtyKeys(content_versions={11, 99}, access_principals={"group:litigation"})
    to_content, to_access = run(projector.resolve(keys))
    # 99 is gone from PostgreSQL but was named by its event: the content path deletes its rows.
    assert (to_content, to_access) == ({11, 99}, {12})


@dataclass
class Expiring(Source):
    """`Source` with a database clock: versions judged against it, the sweep's look-up of expired documents."""

    clock: datetime = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
    swept_since: list[datetime | None] = field(default_factory=list)

    def resolve(self, keys: DirtyKeys) -> tuple[set[int], set[int]]:
        content, access = super().resolve(keys)
        return content | {v for v, s in self.states.items() if s.document.id in keys.content_documents}, access

    def versions(self, version_ids: Sequence[int]) -> tuple[dict[int, VersionSnapshot], dict[int, GrantedPrincipals]]:
        found, grants = super().versions(version_ids)
        return {v: replace(s, read_at=self.clock) for v, s in found.items()}, grants

    def expired_since(self, since: datetime | None) -> tuple[list[int], datetime]:
        self.swept_since.append(since)
        ids = {
            s.document.id
            for s in self.states.values()
            if (at := s.document.expires_at) is not None and at <= self.clock and (since is None or at > since)
        }
        return sorted(ids), self.clock


def test_the_sweep_removes_the_rows_of_a_document_whose_expiry_passed_without_a_change() -> None:
    start = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
    db = Expiring(states={11: snapshot(expires_at=start + timedelta(minutes=1)), 12: snapshot(12, 2)}, clock=start)
    projector = Projector(SETTINGS, db, Index(), Embedder())  # type: ignore[arg-type]
    index: Index = projector.index  # type: ignore[assignment]
    run(projector.apply(content(11, 12), lane="access"))
    assert index.of(11) and index.of(12)  # not expired yet: indexed like any other
    stats, clock = run(projector.sweep_expired(None, lane="access"))
    assert (stats.rows_deleted, clock) == (0, start) and index.of(11)
    db.clock = start + timedelta(minutes=2)  # the expiry passes; no change names the document
    stats, clock = run(projector.sweep_expired(start, lane="access"))
    assert not index.of(11) and index.of(12) and stats.rows_deleted > 0 and clock == db.clock
    # The next window no longer holds that expiry: nothing to do.
    stats, _ = run(projector.sweep_expired(clock, lane="access"))
    assert stats.rows_deleted == 0 and db.swept_since == [None, start, clock]
