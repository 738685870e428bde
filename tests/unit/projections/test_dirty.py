import json

import pytest

from projections.cdc import decode
from projections.dirty import DirtyKeys, dirty_keys


def _event(table: str, op: str, *, before: dict | None = None, after: dict | None = None, key: dict | None = None):
    value = {"op": op, "before": before, "after": after, "source": {"lsn": 100, "ts_ms": 1, "table": table}}
    row = after or before or {}
    return decode(f"ki.public.{table}", json.dumps(key or {"id": row.get("id", 1)}), json.dumps(value))


def test_version_edit_dirties_only_that_versions_content() -> None:
    keys = dirty_keys(_event("document_versions", "u", after={"id": 7, "document_id": 3, "text": "x"}))
    assert keys.content_versions == {7}
    assert not keys.access_versions and not keys.content_documents


def test_version_update_with_toast_placeholder_still_names_the_version() -> None:
    keys = dirty_keys(
        _event("document_versions", "u", after={"id": 7, "text": "__debezium_unavailable_value", "status": "final"})
    )
    assert keys.content_versions == {7}


def test_grant_move_dirties_old_and_new_target() -> None:
    keys = dirty_keys(
        _event(
            "grants",
            "u",
            before={"id": 1, "scope": "project", "project_id": 10, "principal": "u:a"},
            after={"id": 1, "scope": "document", "document_id": 20, "principal": "u:a"},
        )
    )
    assert keys.access_projects == {10}
    assert keys.access_documents == {20}
    assert not keys.content_versions


def test_membership_and_alias_dirty_normalised_principals() -> None:
    member = dirty_keys(
        _event(
            "group_memberships", "d", before={"id": 2, "group_principal": " Group:Legal ", "member_principal": "u:b"}
        )
    )
    assert member.access_principals == {"group:legal", "u:b"}
    alias = dirty_keys(_event("principal_aliases", "c", after={"id": 3, "alias": "Bob", "principal": "user:bob"}))
    assert alias.access_principals == {"bob", "user:bob"}


def test_observation_source_and_object_changes_are_access_only() -> None:
    obs = dirty_keys(
        _event("source_observations", "d", before={"id": 5, "document_version_id": 9, "source_object_id": 4})
    )
    assert obs.access_versions == {9} and not obs.content_versions
    obj = dirty_keys(_event("source_objects", "u", after={"id": 4, "acl_known": True}))
    assert obj.access_source_objects == {4}


def test_tombstones_and_unindexed_tables_dirty_nothing() -> None:
    tomb = decode("ki.public.grants", json.dumps({"id": 1}), None)
    assert not dirty_keys(tomb)


def test_dirty_keys_merge_and_truthiness() -> None:
    keys = DirtyKeys()
    assert not keys
    keys.update(DirtyKeys(content_versions={1}))
    keys.update(DirtyKeys(content_versions={2}, access_principals={"x"}))
    assert keys.content_versions == {1, 2} and keys.access_principals == {"x"} and keys


def test_names_access_only_for_access_keys() -> None:
    assert not DirtyKeys(content_versions={1}, content_documents={2}).names_access
    assert DirtyKeys(access_principals={"user:a"}).names_access
    assert DirtyKeys(content_versions={1}, access_sources={3}).names_access


def test_unknown_table_has_no_rule() -> None:
    from projections.cdc import ChangeEvent, SourceInfo

    event = ChangeEvent("t", "mystery", "c", {"id": 1}, None, {"id": 1}, SourceInfo(1, 1, False))
    with pytest.raises(ValueError, match="mystery"):
        dirty_keys(event)


@pytest.mark.parametrize("table", ["matters", "ontology_nodes"])
def test_a_new_matter_or_type_node_dirties_nothing_but_its_update_and_delete_do(table: str) -> None:
    row = {"id": 7, "title": "Mietsache Müller", "label": "Vertrag"}
    for op in ("c", "r"):  # insert, snapshot read: no existing row can refer to it yet
        assert not dirty_keys(_event(table, op, after=row, key={"id": 7}))
    updated = dirty_keys(_event(table, "u", before=row, after=row, key={"id": 7}))
    deleted = dirty_keys(_event(table, "d", before=row, key={"id": 7}))
    field = "content_matters" if table == "matters" else "content_ontology_nodes"
    assert getattr(updated, field) == {7} and getattr(deleted, field) == {7}


@pytest.mark.parametrize("table", ["document_versions", "grants", "group_memberships"])
def test_a_truncate_names_its_table_and_no_row(table: str) -> None:
    value = {"op": "t", "before": None, "after": None, "source": {"lsn": 100, "ts_ms": 1, "table": table}}
    keys = dirty_keys(decode(f"ki.public.{table}", None, json.dumps(value)))
    assert keys.truncated == {table} and bool(keys) and not keys.names_access
    marker = {"op": "m", "source": {"lsn": 101, "ts_ms": 1}, "message": {"prefix": f"ki.truncate.{table}"}}
    assert dirty_keys(decode("ki.message", json.dumps({"prefix": "x"}), json.dumps(marker))).truncated == {table}
