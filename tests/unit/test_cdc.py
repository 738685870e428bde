import base64
import json
import pickle
from datetime import UTC, date, datetime

import pytest

from projections.cdc import (
    DEBEZIUM_UNAVAILABLE,
    UNAVAILABLE,
    ChangeEvent,
    PoisonEvent,
    Tombstone,
    UnavailableColumns,
    date_from_debezium,
    decode,
    document_from_row,
    external_version,
    is_unavailable,
    jsonb_from_debezium,
    matter_from_row,
    merge_unavailable,
    ontology_node_from_row,
    ordering_key,
    table_of_topic,
    timestamp_from_debezium,
    topic_name,
    unavailable_columns,
    version_from_row,
)
from projections.rows import NotableClause

TOPIC = "ki.public.document_versions"

VERSION_ROW = {
    "id": 42,
    "document_id": 7,
    "version_no": 2,
    "status": "final",
    "language": "de",
    "doc_date": 19783,  # 2024-03-01
    "text": "Der Mieter zahlt.",
    "notable_clauses": json.dumps([{"clause_type_id": 31, "locus": "§ 4", "text": "Kündigung"}]),
}


def envelope(op="c", before=None, after=None, lsn=1000, snapshot="false", **extra):
    value = {
        "before": before,
        "after": after,
        "source": {
            "version": "3.0",
            "connector": "postgresql",
            "name": "ki",
            "ts_ms": 1_700_000_000_000,
            "snapshot": snapshot,
            "db": "ki",
            "schema": "public",
            "table": "document_versions",
            "txId": 777,
            "lsn": lsn,
            "xmin": None,
        },
        "op": op,
        "ts_ms": 1_700_000_000_123,
        "transaction": None,
        **extra,
    }
    return json.dumps(value).encode()


KEY = b'{"id": 42}'


def test_decode_create():
    event = decode(TOPIC, KEY, envelope(after=VERSION_ROW))
    assert isinstance(event, ChangeEvent)
    assert event.table == "document_versions" and event.op == "c" and event.key == {"id": 42}
    assert event.after == VERSION_ROW and event.before is None and event.row == VERSION_ROW
    assert event.source.lsn == 1000 and event.source.tx_id == 777 and not event.source.snapshot


def test_decode_update_delete_and_snapshot_read():
    update = decode(TOPIC, KEY, envelope(op="u", before=None, after=VERSION_ROW))
    assert update.op == "u"
    delete = decode(TOPIC, KEY, envelope(op="d", before={"id": 42, "text": None}, after=None))
    assert delete.is_delete and delete.row is None and delete.before["id"] == 42
    read = decode(TOPIC, KEY, envelope(op="r", after=VERSION_ROW, snapshot="last"))
    assert read.op == "r" and read.source.snapshot


def test_decode_tombstone():
    assert decode(TOPIC, KEY, None) == Tombstone(topic=TOPIC, table="document_versions", key={"id": 42})


def test_decode_truncate_without_key():
    event = decode(TOPIC, None, envelope(op="t"))
    assert event.op == "t" and event.key is None and event.row is None


def test_unknown_columns_are_tolerated():
    row = {**VERSION_ROW, "added_later": [1, 2]}
    event = decode(TOPIC, KEY, envelope(after=row))
    assert version_from_row(event.after).id == 42


def test_schema_envelope_is_unwrapped():
    key = json.dumps({"schema": {}, "payload": {"id": 42}}).encode()
    value = json.dumps({"schema": {}, "payload": json.loads(envelope(after=VERSION_ROW))}).encode()
    assert decode(TOPIC, key, value).key == {"id": 42}


@pytest.mark.parametrize(
    ("topic", "key", "value", "reason"),
    [
        (TOPIC, KEY, b"{not json", "not valid JSON"),
        (TOPIC, b"\xff\xfe", envelope(after=VERSION_ROW), "not valid JSON"),
        (TOPIC, KEY, json.dumps({"after": VERSION_ROW}).encode(), "op"),
        (TOPIC, KEY, envelope(op="x", after=VERSION_ROW), "op"),
        ("ki.public.unknown_table", KEY, envelope(after=VERSION_ROW), "unknown table"),
        ("noschema", KEY, envelope(after=VERSION_ROW), "topic"),
        (TOPIC, None, envelope(after=VERSION_ROW), "without a key"),
        (TOPIC, b"[]", envelope(after=VERSION_ROW), "key"),
        (TOPIC, KEY, envelope(op="c", after=None), "after"),
        (TOPIC, KEY, envelope(after=VERSION_ROW, lsn=None), "lsn"),
        (TOPIC, KEY, envelope(after=VERSION_ROW, lsn="abc"), "lsn"),
        (TOPIC, KEY, b"[1, 2]", "object"),
        (TOPIC, KEY, envelope(after="text"), "object"),
        (TOPIC, None, None, "tombstone"),
    ],
)
def test_poison_events(topic, key, value, reason):
    with pytest.raises(PoisonEvent) as info:
        decode(topic, key, value)
    assert reason in info.value.reason


def test_access_tables_are_known_and_the_set_can_be_widened():
    assert decode("ki.public.grants", KEY, envelope(after={"id": 42})).table == "grants"
    event = decode("ki.public.debezium_heartbeat", KEY, envelope(after={"id": 1}), known_tables=None)
    assert event.table == "debezium_heartbeat"
    with pytest.raises(PoisonEvent):
        decode("ki.public.grants", KEY, envelope(after={"id": 42}), known_tables={"documents"})


def test_topic_names():
    assert topic_name("ki", "documents") == "ki.public.documents"
    assert table_of_topic("my.prefix.public.matters") == "matters"


# --- TOAST placeholders ----------------------------------------------------------------------------


def test_placeholder_becomes_unavailable_and_never_reaches_text():
    row = {
        **VERSION_ROW,
        "text": DEBEZIUM_UNAVAILABLE,
        "notable_clauses": DEBEZIUM_UNAVAILABLE,
        "identifiers": [DEBEZIUM_UNAVAILABLE],
        "blob": base64.b64encode(DEBEZIUM_UNAVAILABLE.encode()).decode(),
    }
    event = decode(TOPIC, KEY, envelope(op="u", after=row))
    assert event.after["text"] is UNAVAILABLE
    assert unavailable_columns(event.after) == {"text", "notable_clauses", "identifiers", "blob"}
    with pytest.raises(UnavailableColumns) as info:
        version_from_row(event.after)
    assert info.value.columns == ("notable_clauses", "text")


def test_unavailable_refuses_truthiness_and_survives_pickle():
    with pytest.raises(TypeError):
        bool(UNAVAILABLE)
    assert pickle.loads(pickle.dumps(UNAVAILABLE)) is UNAVAILABLE
    assert is_unavailable(UNAVAILABLE) and not is_unavailable("text") and not is_unavailable(["a"])


def test_merge_unavailable_fills_from_previous_row():
    after = {"id": 42, "text": UNAVAILABLE, "status": "final"}
    merged = merge_unavailable(after, {"id": 42, "text": "alter Text", "status": "draft"})
    assert merged.complete and merged.row == {"id": 42, "text": "alter Text", "status": "final"}


def test_merge_unavailable_reports_what_is_still_missing():
    after = {"id": 42, "text": UNAVAILABLE, "notable_clauses": UNAVAILABLE}
    merged = merge_unavailable(after, {"text": "alt", "notable_clauses": UNAVAILABLE})
    assert not merged.complete and merged.missing == {"notable_clauses"}
    assert merge_unavailable(after, None).missing == {"text", "notable_clauses"}


def test_custom_placeholder():
    event = decode(TOPIC, KEY, envelope(op="u", after={**VERSION_ROW, "text": "<toast>"}), placeholder="<toast>")
    assert event.after["text"] is UNAVAILABLE


# --- ordering ------------------------------------------------------------------------------------


def test_ordering_follows_lsn_and_streamed_beats_snapshot_at_same_lsn():
    early = decode(TOPIC, KEY, envelope(op="u", after=VERSION_ROW, lsn=100))
    late = decode(TOPIC, KEY, envelope(op="u", after=VERSION_ROW, lsn=200))
    snap = decode(TOPIC, KEY, envelope(op="r", after=VERSION_ROW, lsn=200, snapshot="true"))
    assert ordering_key(early) < ordering_key(snap) < ordering_key(late)
    assert external_version(late) == 200


# --- converters and typed rows -------------------------------------------------------------------


def test_date_converter():
    assert date_from_debezium(0) == date(1970, 1, 1)
    assert date_from_debezium(19783) == date(2024, 3, 1)
    assert date_from_debezium(-1) == date(1969, 12, 31)
    assert date_from_debezium("2024-03-01") == date(2024, 3, 1)
    assert date_from_debezium(None) is None
    with pytest.raises(PoisonEvent):
        date_from_debezium("gestern")


def test_timestamp_converter():
    assert timestamp_from_debezium("2024-05-01T10:00:00.123456Z") == datetime(2024, 5, 1, 10, 0, 0, 123456, UTC)
    assert timestamp_from_debezium("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert timestamp_from_debezium(1_000_000) == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert timestamp_from_debezium(None) is None
    with pytest.raises(PoisonEvent):
        timestamp_from_debezium("soon")


def test_jsonb_converter():
    assert jsonb_from_debezium('[{"a": 1}]') == [{"a": 1}]
    assert jsonb_from_debezium([1]) == [1] and jsonb_from_debezium(None) is None
    with pytest.raises(PoisonEvent):
        jsonb_from_debezium("{oops")


def test_version_from_row():
    version = version_from_row(VERSION_ROW)
    assert version.doc_date == date(2024, 3, 1) and version.status == "final"
    assert version.notable_clauses == (NotableClause(clause_type_id=31, locus="§ 4", text="Kündigung"),)


@pytest.mark.parametrize(
    "change",
    [
        {"status": "published"},
        {"notable_clauses": '{"not": "a list"}'},
        {"notable_clauses": "[1]"},
        {"notable_clauses": '[{"locus": "§ 1"}]'},
        {"id": None},
    ],
)
def test_invalid_version_rows_are_poison(change):
    with pytest.raises(PoisonEvent):
        version_from_row({**VERSION_ROW, **change})


def test_missing_column_is_poison():
    row = dict(VERSION_ROW)
    del row["text"]
    with pytest.raises(PoisonEvent):
        version_from_row(row)


def test_document_from_row():
    doc = document_from_row(
        {
            "id": 7,
            "project_id": 3,
            "title": "Mietvertrag",
            "matter_id": None,
            "doc_type_id": 21,
            "identifiers": ["2 BvR 1234/19"],
            "latest_final_version_id": 42,
            "deleted_at": "2024-05-01T10:00:00Z",
            "created_at": "2024-01-01T00:00:00Z",
        }
    )
    assert doc.identifiers == ("2 BvR 1234/19",) and doc.matter_id is None
    assert doc.deleted_at == datetime(2024, 5, 1, 10, tzinfo=UTC)


def test_ontology_and_matter_rows():
    node = ontology_node_from_row({"id": 21, "kind": "doc_type", "key": "lease", "label": "Miete", "parent_id": 1})
    assert node.parent_id == 1 and node.label == "Miete"
    with pytest.raises(PoisonEvent):
        ontology_node_from_row({"id": 1, "kind": "tag", "key": "k", "label": "l", "parent_id": None})
    matter = matter_from_row({"id": 11, "project_id": 3, "title": "Müller ./. Schmidt", "reference": "AZ-17"})
    assert matter.reference == "AZ-17"


def test_logical_decoding_message_has_no_table():
    event = decode("ki.message", None, envelope(op="m"))
    assert event.op == "m" and event.table == "" and event.row is None
