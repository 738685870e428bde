"""The sync's decisions (projections.plan) on rows built the way the content path builds them."""

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ki.acl import GrantedPrincipals
from ki.settings import RetrievalSettings
from projections.plan import (
    VECTOR_PENDING,
    RowWrite,
    access_only_update,
    access_only_versions,
    drops_fields,
    expected_rows,
    holds_principals,
    micro_batches,
    next_access_version,
    plan_content_writes,
    row_write,
    smallest_first,
    without_vector,
)
from projections.rows import AccessProjection
from streams.writer import ExistingRow
from tests.unit.projections.test_rows import DOC, FINAL, PARAGRAPHS, rows_for

GRANTED = GrantedPrincipals(allowed_principals=("group:a", "user:b"), denied_principals=("user:x",))
REGRANTED = GrantedPrincipals(allowed_principals=("group:a", "user:c"), denied_principals=("user:x",))


def access(granted=GRANTED, access_version=1):
    return AccessProjection(granted.allowed_principals, granted.denied_principals, access_version)


def stored(rows):
    """The index's rows as `IndexWriter.existing_rows` returns them for one version, vector included."""
    return {
        row.id: ExistingRow(
            doc_id=row.id,
            seq_no=7,
            primary_term=1,
            content_hash=row.content_hash,
            access_version=row.source["access_version"],
            source={**row.source, "embedding": [0.5, 0.5]},
        )
        for row in rows
    }


def writes(plan):
    return {row.id: write for row, write in plan.writes}


# --- which path -----------------------------------------------------------------------------------


def test_a_version_dirtied_both_ways_goes_on_the_content_path_only():
    assert access_only_versions({1, 2}, [2, 3, 4]) == {3, 4}
    assert access_only_versions(set(), [5]) == {5}


# --- content path ---------------------------------------------------------------------------------


def test_a_new_version_creates_every_row_with_access_version_1():
    assert next_access_version([], GRANTED) == 1
    rows = rows_for(access=access())
    plan = plan_content_writes(rows, {})
    assert writes(plan) == {row.id: RowWrite.CREATE for row in rows}
    assert plan.deletes == ()
    assert all(write.needs_vector for write in writes(plan).values())


def test_an_unchanged_version_writes_nothing_and_keeps_its_access_version():
    index = stored(rows_for(access=access(access_version=4)))
    assert next_access_version(index.values(), GRANTED) == 4
    plan = plan_content_writes(rows_for(access=access(access_version=4)), index)
    assert plan.writes == () and plan.deletes == ()


def test_a_title_change_reembeds_every_row():
    index = stored(rows_for(access=access()))
    retitled = rows_for(document=replace(DOC, title="Gewerbemietvertrag Hauptstraße 1"), access=access())
    plan = plan_content_writes(retitled, index)
    # Chunks and clauses embed the title in their header, the profile embeds it in its first line.
    assert writes(plan) == {row.id: RowWrite.REEMBED for row in retitled}
    assert plan.deletes == ()


def test_editing_one_paragraph_reembeds_only_the_chunks_around_it():
    settings = RetrievalSettings(chunk_chars=300, chunk_overlap_chars=0)
    index = stored(rows_for(settings=settings, access=access()))
    edited = "\n".join([*PARAGRAPHS[:5], PARAGRAPHS[5].replace("pünktlich", "spätestens"), *PARAGRAPHS[6:]])
    after = rows_for(version=replace(FINAL, text=edited), settings=settings, access=access())
    changed = writes(plan_content_writes(after, index))
    assert changed and all(i.startswith("42:chunk:") for i in changed)
    reembedded = {i for i, write in changed.items() if write is RowWrite.REEMBED}
    assert 1 <= len(reembedded) <= 2
    # The chunks after the edit keep their text and vector; only where they sit in the text moved.
    moved = {i: w for i, w in changed.items() if i not in reembedded}
    assert set(moved.values()) <= {RowWrite.UPDATE}
    before = {row.id: row for row in rows_for(settings=settings, access=access())}
    for row in after:
        if row.id in moved:
            old = before[row.id].source
            assert old["text"] == row.source["text"] and old["meta"]["start"] != row.source["meta"]["start"]


def test_a_grant_change_on_the_content_path_bumps_access_version_and_updates_in_place():
    index = stored(rows_for(access=access(access_version=3)))
    assert next_access_version(index.values(), REGRANTED) == 4
    rows = rows_for(access=access(REGRANTED, access_version=4))
    plan = plan_content_writes(rows, index)
    # Principals are not embedded: no new vectors, a partial update per row.
    assert writes(plan) == {row.id: RowWrite.UPDATE for row in rows}
    assert not any(write.needs_vector for write in writes(plan).values())


def test_a_removed_field_replaces_the_row_and_an_added_one_updates_it():
    with_object = rows_for(access=access(), source_object_id="9")
    without_object = rows_for(access=access())
    # A partial update merges `meta` and would leave the old source_object_id behind.
    assert set(writes(plan_content_writes(without_object, stored(with_object))).values()) == {RowWrite.REPLACE}
    assert set(writes(plan_content_writes(with_object, stored(without_object))).values()) == {RowWrite.UPDATE}
    assert not RowWrite.REPLACE.needs_vector


def test_rows_a_version_no_longer_has_are_deleted():
    index = stored(rows_for(access=access()))
    draft = rows_for(version=replace(FINAL, status="draft"), access=access())  # loses its clause rows
    plan = plan_content_writes(draft, index)
    assert plan.deletes == ("42:clause:1000", "42:clause:1002")
    # The rows it keeps only change their version_status: updated in place, nothing re-embedded.
    assert writes(plan) == {row.id: RowWrite.UPDATE for row in draft}


def test_a_deleted_document_or_version_deletes_every_row():
    index = stored(rows_for(access=access()))
    deleted = rows_for(document=replace(DOC, deleted_at=datetime.now(UTC)), access=access())
    assert deleted == []
    plan = plan_content_writes(deleted, index)
    assert set(plan.deletes) == set(index) and plan.writes == ()


def test_plan_rejects_duplicate_row_ids():
    row = rows_for()[0]
    with pytest.raises(ValueError, match="duplicate"):
        plan_content_writes([row, row], {})


def test_row_write_for_a_missing_row_is_create():
    row = rows_for()[0]
    assert row_write(row, None) is RowWrite.CREATE
    assert row_write(row, stored([row])[row.id]) is RowWrite.KEEP


def test_drops_fields_looks_into_nested_objects():
    old = {"text": "a", "meta": {"kind": "chunk", "source_object_id": "7"}}
    assert drops_fields(old, {"text": "a", "meta": {"kind": "chunk"}})
    assert drops_fields(old, {"meta": {"kind": "chunk", "source_object_id": "7"}})
    assert not drops_fields(old, {"text": "b", "meta": {"kind": "chunk", "source_object_id": "8", "locus": "§ 1"}})


# --- principal projection and the access-only path ------------------------------------------------


def test_holds_principals_ignores_order_and_repeats_but_not_denials():
    source = {"allowed_principals": ["user:b", "group:a", "user:b"], "denied_principals": ["user:x"]}
    assert holds_principals(source, GRANTED)
    assert not holds_principals({**source, "denied_principals": []}, GRANTED)
    assert not holds_principals(source, REGRANTED)
    assert holds_principals({}, GrantedPrincipals((), ()))


def test_access_version_is_kept_only_if_a_stored_row_holds_the_projection():
    index = stored(rows_for(access=access(access_version=2)))
    assert next_access_version(index.values(), GRANTED) == 2
    assert next_access_version(index.values(), REGRANTED) == 3
    # Rows written before access_version existed (0) get 1 even when they hold the projection.
    legacy = [replace(row, access_version=0) for row in index.values()]
    assert next_access_version(legacy, GRANTED) == 1


def test_a_grant_change_on_the_access_only_path_rewrites_principals_and_bumps_access_version():
    row = stored(rows_for(access=access(access_version=5)))["42:chunk:0"]
    assert access_only_update(row, REGRANTED) == {
        "allowed_principals": ["group:a", "user:c"],
        "denied_principals": ["user:x"],
        "access_version": 6,
    }


def test_an_unchanged_projection_gives_no_access_only_write():
    row = stored(rows_for(access=access(access_version=5)))["42:chunk:0"]
    assert access_only_update(row, GRANTED) is None
    # The access-only path reads principals from doc values: sorted lists, no other fields.
    doc_values = replace(row, source={"allowed_principals": ["group:a", "user:b"], "denied_principals": ["user:x"]})
    assert access_only_update(doc_values, GRANTED) is None


def test_micro_batches_write_free_versions_first_and_pack_the_rest_in_order():
    needs = [(1, 30), (2, 0), (3, 30), (4, 10), (5, 0), (6, 64)]
    assert micro_batches(needs, 64) == [[2, 5], [1, 3], [4], [6]]


def test_a_version_bigger_than_a_micro_batch_is_a_group_of_its_own_never_split():
    assert micro_batches([(1, 5), (2, 200), (3, 5)], 64) == [[1], [2], [3]]
    assert micro_batches([], 64) == []
    with pytest.raises(ValueError, match="max_rows"):
        micro_batches([(1, 1)], 0)


# --- one plan per version and lane ----------------------------------------------------------------


def text_rows(rows):
    """The index's rows as the access lane wrote them: text first, no vector yet."""
    return {
        doc_id: replace(row, source={**without_vector(row.source), VECTOR_PENDING: 1_764_000_000_000})
        for doc_id, row in stored(rows).items()
    }


def test_the_access_lane_writes_rows_that_need_a_vector_as_text_the_content_lane_with_vectors() -> None:
    index = stored(rows_for(access=access()))
    retitled = rows_for(document=replace(DOC, title="Gewerbemietvertrag Hauptstraße 1"), access=access())
    assert writes(plan_content_writes(retitled, index, embeds=False)) == {row.id: RowWrite.TEXT for row in retitled}
    assert writes(plan_content_writes(retitled, index, embeds=True)) == {row.id: RowWrite.REEMBED for row in retitled}
    new = rows_for(access=access())
    assert set(writes(plan_content_writes(new, {}, embeds=False)).values()) == {RowWrite.TEXT}
    assert set(writes(plan_content_writes(new, {}, embeds=True)).values()) == {RowWrite.CREATE}


def test_a_text_row_gets_its_vector_from_the_content_lane_and_is_kept_by_the_access_lane() -> None:
    rows = rows_for(access=access())
    pending = text_rows(rows)
    assert set(writes(plan_content_writes(rows, pending, embeds=True)).values()) == {RowWrite.ADD_VECTOR}
    assert writes(plan_content_writes(rows, pending, embeds=False)) == {}  # the same text: nothing to write
    assert all(write.needs_vector for write in (RowWrite.ADD_VECTOR, RowWrite.CREATE, RowWrite.REEMBED))
    assert not RowWrite.TEXT.needs_vector
    # A grant change meanwhile: the text row is rewritten as text (still pending), never given a vector here.
    regranted = rows_for(access=access(REGRANTED, access_version=2))
    assert set(writes(plan_content_writes(regranted, pending, embeds=False)).values()) == {RowWrite.TEXT}
    assert set(writes(plan_content_writes(regranted, pending, embeds=True)).values()) == {RowWrite.ADD_VECTOR}


def test_a_grant_change_is_written_by_whichever_lane_sees_it_first() -> None:
    index = stored(rows_for(access=access(access_version=3)))
    regranted = rows_for(access=access(REGRANTED, access_version=4))
    for embeds in (False, True):  # no vector needed: the access lane writes the partial updates itself
        plan = plan_content_writes(regranted, index, embeds=embeds)
        assert set(writes(plan).values()) == {RowWrite.UPDATE}


def test_smallest_first_orders_by_size_then_by_id():
    assert smallest_first({7: 300, 3: 20, 9: 20, 1: 5000}) == [3, 9, 7, 1]
    assert smallest_first({}) == []


def test_expected_rows_grows_with_the_text_and_is_never_zero() -> None:
    assert expected_rows(0, 1200, 120) == 1
    assert expected_rows(1080, 1200, 120) == 2
    assert expected_rows(108_000, 1200, 120) == 101
    assert expected_rows(500, 100, 100) == 501  # no stride left: one row per character at most
