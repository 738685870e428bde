import base64
import json

import pytest

from projections.cdc import (
    DEBEZIUM_UNAVAILABLE,
    UNAVAILABLE,
    ChangeEvent,
    PoisonEvent,
    Tombstone,
    decode,
    is_unavailable,
    table_of_topic,
    topic_name,
)

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
    assert event.after == VERSION_ROW and event.before is None
    assert event.source.lsn == 1000 and event.source.ts_ms == 1_700_000_000_000 and not event.source.snapshot
    assert event.source.tx_id == 777


@pytest.mark.parametrize("tx_id", ["777", None, True, 7.5])
def test_a_transaction_id_that_is_not_an_integer_is_left_out_and_poisons_nothing(tx_id: object) -> None:
    value = json.loads(envelope(after=VERSION_ROW))
    value["source"]["txId"] = tx_id
    event = decode(TOPIC, KEY, json.dumps(value))
    assert isinstance(event, ChangeEvent) and event.source.tx_id is None


def test_decode_update_delete_and_snapshot_read():
    update = decode(TOPIC, KEY, envelope(op="u", before=None, after=VERSION_ROW))
    assert update.op == "u"
    delete = decode(TOPIC, KEY, envelope(op="d", before={"id": 42, "text": None}, after=None))
    assert delete.op == "d" and delete.after is None and delete.before["id"] == 42
    read = decode(TOPIC, KEY, envelope(op="r", after=VERSION_ROW, snapshot="last"))
    assert read.op == "r" and read.source.snapshot


def test_decode_tombstone():
    assert decode(TOPIC, KEY, None) == Tombstone(topic=TOPIC, table="document_versions", key={"id": 42})


def test_decode_truncate_without_key():
    event = decode(TOPIC, None, envelope(op="t"))
    assert event.op == "t" and event.key is None and event.after is None


def test_unknown_columns_are_tolerated():
    row = {**VERSION_ROW, "added_later": [1, 2]}
    event = decode(TOPIC, KEY, envelope(after=row))
    assert event.after["added_later"] == [1, 2] and event.after["id"] == 42


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
    assert {col for col, val in event.after.items() if val is UNAVAILABLE} == {
        "text",
        "notable_clauses",
        "identifiers",
        "blob",
    }
    assert event.after["id"] == 42 and event.after["status"] == "final"


def test_unavailable_refuses_truthiness():
    with pytest.raises(TypeError):
        bool(UNAVAILABLE)
    assert is_unavailable(UNAVAILABLE) and not is_unavailable("text") and not is_unavailable(["a"])


def test_custom_placeholder():
    event = decode(TOPIC, KEY, envelope(op="u", after={**VERSION_ROW, "text": "<toast>"}), placeholder="<toast>")
    assert event.after["text"] is UNAVAILABLE


def test_logical_decoding_message_has_no_table():
    event = decode("ki.message", None, envelope(op="m"))
    assert event.op == "m" and event.table == "" and event.after is None


def test_a_truncate_marker_is_decoded_as_its_tables_truncate():
    # Emitted by the AFTER TRUNCATE trigger (migration 0013) on Debezium's message topic, keyed by its prefix.
    marker = envelope(op="m", message={"prefix": "ki.truncate.grants", "content": ""})
    event = decode("ki.message", b'{"prefix": "ki.truncate.grants"}', marker)
    assert (event.op, event.table, event.topic) == ("t", "grants", "ki.message")
    other = decode("ki.message", b'{"prefix": "app.audit"}', envelope(op="m", message={"prefix": "app.audit"}))
    assert (other.op, other.table) == ("m", "")
    with pytest.raises(PoisonEvent, match="names no table"):
        decode("ki.message", None, envelope(op="m", message={"prefix": "ki.truncate."}))
