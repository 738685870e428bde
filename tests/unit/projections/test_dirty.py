import json

import pytest

from projections.cdc import decode
from projections.dirty import DirtyKeys, WrittenWith, dirty_keys, written_with


def _event(
    table: str, op: str, *, before: dict | None = None, after: dict | None = None, key: dict | None = None,
    tx: int | None = None,
):  # fmt: skip
    source = {"lsn": 100, "ts_ms": 1, "table": table, **({"txId": tx} if tx is not None else {})}
    value = {"op": op, "before": before, "after": after, "source": source}
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


@pytest.mark.parametrize(
    ("table", "after", "anchor"),
    [
        ("grants", {"id": 1, "scope": "document", "document_id": 20, "principal": "u:a"}, ("documents", 20)),
        ("grants", {"id": 1, "scope": "project", "project_id": 10, "principal": "u:a"}, ("projects", 10)),
        ("grants", {"id": 1, "source_object_id": 30, "principal": "u:a"}, ("source_objects", 30)),
        ("source_observations", {"id": 2, "document_version_id": 7, "source_object_id": 30}, ("document_versions", 7)),
        ("source_objects", {"id": 30, "source_id": 4}, ("source_objects", 30)),
    ],
)
def test_an_insert_points_at_one_row_with_its_transaction(table: str, after: dict, anchor: tuple[str, int]) -> None:
    assert written_with(_event(table, "c", after=after, tx=901)) == WrittenWith(*anchor, 901)


@pytest.mark.parametrize(
    ("table", "op", "after", "tx"),
    [
        ("grants", "u", {"id": 1, "document_id": 20, "principal": "u:a"}, 901),  # a change, not an insert
        ("grants", "r", {"id": 1, "document_id": 20, "principal": "u:a"}, 901),  # a snapshot read
        ("grants", "c", {"id": 1, "document_id": 20, "principal": "u:a"}, None),  # no transaction id
        ("grants", "c", {"id": 1, "document_id": 20, "project_id": 10, "principal": "u:a"}, 901),  # two targets
        ("group_memberships", "c", {"id": 3, "group_principal": "group:g", "member_principal": "u:a"}, 901),
        ("documents", "c", {"id": 20, "project_id": 10}, 901),  # content: the access lane's
    ],
)
def test_anything_else_points_at_nothing(table: str, op: str, after: dict, tx: int | None) -> None:
    assert written_with(_event(table, op, after=after, tx=tx)) is None


def test_only_a_fast_path_lane_makes_an_insert_conditional_and_settling_keeps_what_was_not_written_with_it() -> None:
    grant = _event("grants", "c", after={"id": 1, "document_id": 20, "principal": "u:a"}, tx=901)
    observation = _event("source_observations", "c", after={"id": 2, "document_version_id": 7}, tx=902)
    revoked = _event("grants", "d", before={"id": 5, "document_id": 21, "principal": "u:b"}, tx=903)
    assert dirty_keys(grant).access_documents == {20} and not dirty_keys(grant).unless_written_with
    keys = DirtyKeys()
    for event in (grant, observation, revoked):
        keys.update(dirty_keys(event, fast_path=True))
    assert keys and keys.access_documents == {21} and len(keys.unless_written_with) == 2
    # The document was written by the grant's transaction; the version was written again since.
    settled, dropped = keys.settled({WrittenWith("documents", 20, 901)})
    assert dropped == 1 and not settled.unless_written_with
    assert settled.access_documents == {21} and settled.access_versions == {7}
    assert keys.access_documents == {21}  # settling leaves the batch's keys as they were
