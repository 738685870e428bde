"""Decoding of Debezium change events (JSON converter, schemas disabled) into `ChangeEvent`/`Tombstone`.

A record's value is `{before, after, source, op, ts_ms}`; its key is the primary key as JSON
(`{"id": 5}`); a record with a null value is a tombstone (it lets log compaction drop the key).
Anything we cannot decode raises `PoisonEvent` with a reason, so the stream sends it to the
dead-letter topic instead of dropping it.

An event is only a trigger: `projections.dirty` reads the ids in its before/after images (and its
key), and the sync re-reads everything else from PostgreSQL (`projections.plan` describes the model).
So no column value of an event is ever indexed, and event order does not matter. An unchanged TOASTed
column in an update arrives as a placeholder; it becomes the `UNAVAILABLE` sentinel so that it can
never be taken for an id or a principal name.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final, Literal, cast

from ki.errors import PermanentError
from ki.table_roles import CAPTURED_TABLES

Op = Literal["r", "c", "u", "d", "t", "m"]
OPS: frozenset[str] = frozenset({"r", "c", "u", "d", "t", "m"})
ROW_OPS: frozenset[str] = frozenset({"r", "c", "u", "d"})

#: Default for `decode(known_tables=...)`: the captured tables (`ki.table_roles`).
KNOWN_TABLES: frozenset[str] = frozenset(CAPTURED_TABLES)

#: The prefix of the logical-decoding message an `AFTER TRUNCATE` trigger emits for a truncated table
#: (migration 0013): `ki.truncate.<table>`. Debezium's own truncate event (op "t") has no key, and a compacted
#: topic rejects a record without one (the connector task would fail), so it stays skipped
#: (`skipped.operations`); the message's key is its prefix, one per table.
TRUNCATE_PREFIX: Final = "ki.truncate."

# Debezium's default `unavailable.value.placeholder`.
DEBEZIUM_UNAVAILABLE: Final = "__debezium_unavailable_value"


class PoisonEvent(PermanentError):
    """A record that can never be applied; `reason` goes to the dead-letter topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Unavailable:
    """Sentinel for a column Debezium did not send (unchanged TOAST value)."""

    _instance: _Unavailable | None = None

    def __new__(cls) -> _Unavailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNAVAILABLE"

    def __bool__(self) -> bool:
        # Loud on purpose: `value or ""` would silently treat a TOASTed column as empty.
        raise TypeError("UNAVAILABLE has no truth value: the column's value is in PostgreSQL, not in the event")


UNAVAILABLE: Final = _Unavailable()


@lru_cache(maxsize=8)
def _placeholder_forms(placeholder: str) -> frozenset[str]:
    raw = placeholder.encode("utf-8")
    # text/varchar/jsonb send the string itself; bytea sends its bytes as base64 (default
    # binary.handling.mode) or hex.
    return frozenset({placeholder, base64.b64encode(raw).decode("ascii"), raw.hex()})


_DEFAULT_PLACEHOLDERS = _placeholder_forms(DEBEZIUM_UNAVAILABLE)


def is_unavailable(value: Any, placeholders: Collection[str] = _DEFAULT_PLACEHOLDERS) -> bool:
    """True for the placeholder itself, its bytea encodings, or an array that carries it."""
    if value is UNAVAILABLE:
        return True
    if isinstance(value, str):
        return value in placeholders
    if isinstance(value, list):
        return any(isinstance(item, str) and item in placeholders for item in value)
    return False


def _mark_unavailable(row: Mapping[str, Any], placeholders: Collection[str]) -> dict[str, Any]:
    return {col: UNAVAILABLE if is_unavailable(val, placeholders) else val for col, val in row.items()}


# --- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """The event's `source` block, as far as the worker reads it: `ts_ms` (commit time) and `snapshot`
    feed the freshness metric; `tx_id`, the writing transaction's id, lets the principals lane skip what a
    transaction inserted beside the rows it points at (`projections.dirty.written_with`)."""

    lsn: int | None
    ts_ms: int | None
    snapshot: bool
    tx_id: int | None = None


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    topic: str
    table: str
    op: Op
    key: dict[str, Any] | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    source: SourceInfo


@dataclass(frozen=True, slots=True)
class Tombstone:
    topic: str
    table: str
    key: dict[str, Any] = field(default_factory=dict)


def topic_name(prefix: str, table: str, schema: str = "public") -> str:
    return f"{prefix}.{schema}.{table}"


def message_topic(prefix: str) -> str:
    """Debezium's topic of logical-decoding messages (the truncate markers among them)."""
    return f"{prefix}.message"


def table_of_topic(topic: str) -> str:
    """`prefix.schema.table` -> `table` (the prefix itself may contain dots)."""
    parts = topic.rsplit(".", 2)
    if len(parts) < 3 or not parts[2]:
        raise PoisonEvent(f"topic {topic!r} is not <prefix>.<schema>.<table>")
    return parts[2]


def _load_json(data: bytes | str | None, what: str) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PoisonEvent(f"{what} is not valid JSON: {exc}") from None


def _unwrap_envelope(payload: Any) -> Any:
    # Tolerate a converter accidentally left with schemas enabled.
    if isinstance(payload, dict) and set(payload) == {"schema", "payload"}:
        return payload["payload"]
    return payload


def _optional_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise PoisonEvent(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise PoisonEvent(f"{what} must be an integer, got {value!r}") from None


def _snapshot_flag(value: Any) -> bool:
    # Debezium sends "true", "last", "first", "first_in_data_collection", ... or "false"/null.
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value not in ("", "false")


def _row(value: Any, what: str, placeholders: Collection[str]) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PoisonEvent(f"{what} must be an object, got {type(value).__name__}")
    return _mark_unavailable(value, placeholders)


def _truncated_table(value: Mapping[str, Any]) -> str | None:
    message = value.get("message")
    prefix = message.get("prefix") if isinstance(message, dict) else None
    if not isinstance(prefix, str) or not prefix.startswith(TRUNCATE_PREFIX):
        return None
    table = prefix.removeprefix(TRUNCATE_PREFIX)
    if not table:
        raise PoisonEvent(f"truncate marker {prefix!r} names no table")
    return table


def decode(
    topic: str,
    key_bytes: bytes | str | None,
    value_bytes: bytes | str | None,
    *,
    known_tables: Collection[str] | None = KNOWN_TABLES,
    placeholder: str = DEBEZIUM_UNAVAILABLE,
) -> ChangeEvent | Tombstone:
    """Decode one Kafka record into a `ChangeEvent` or a `Tombstone`; raise `PoisonEvent` if invalid.

    `known_tables=None` accepts any table. Unknown columns are kept as they come, so a column
    added upstream does not break decoding.
    """
    placeholders = _placeholder_forms(placeholder)
    key = _unwrap_envelope(_load_json(key_bytes, "key"))
    if key is not None and (not isinstance(key, dict) or not key):
        raise PoisonEvent(f"key must be a non-empty object, got {key!r}")
    value = _unwrap_envelope(_load_json(value_bytes, "value"))
    if value is not None and not isinstance(value, dict):
        raise PoisonEvent(f"value must be an object, got {type(value).__name__}")
    op = value.get("op") if value is not None else None
    if value is not None and op not in OPS:
        raise PoisonEvent(f"missing or unknown op {op!r}")

    # Logical-decoding messages go to `<prefix>.message`, which names no table; a truncate marker names its
    # table in its prefix and is decoded as that table's truncate (op "t").
    table = "" if op == "m" and topic.endswith(".message") else table_of_topic(topic)
    if op == "m" and value is not None:
        truncated = _truncated_table(value)
        if truncated is not None:
            op, table = "t", truncated
    if op != "m" and known_tables is not None and table not in known_tables:
        raise PoisonEvent(f"unknown table {table!r} (topic {topic!r})")
    if value is None:
        if key is None:
            raise PoisonEvent("tombstone without a key")
        return Tombstone(topic=topic, table=table, key=key)
    if op in ROW_OPS and key is None:
        raise PoisonEvent(f"op {op!r} without a key")
    before = _row(value.get("before"), "before", placeholders)
    after = _row(value.get("after"), "after", placeholders)
    if op in ("r", "c", "u") and after is None:
        raise PoisonEvent(f"op {op!r} without an after image")

    raw_source = value.get("source")
    if op in ROW_OPS and not isinstance(raw_source, dict):
        raise PoisonEvent("missing source block")
    src = raw_source if isinstance(raw_source, dict) else {}
    source = SourceInfo(
        lsn=_optional_int(src.get("lsn"), "source.lsn"),
        ts_ms=_optional_int(src.get("ts_ms"), "source.ts_ms"),
        snapshot=_snapshot_flag(src.get("snapshot")),
        # Only an optimisation reads it: an unreadable one means no skip, never a poison event.
        tx_id=src["txId"] if isinstance(src.get("txId"), int) and not isinstance(src["txId"], bool) else None,
    )
    if op in ROW_OPS and source.lsn is None:
        raise PoisonEvent("source.lsn missing: not a Debezium change event")
    return ChangeEvent(
        topic=topic,
        table=table,
        op=cast(Op, op),
        key=key,
        before=before,
        after=after,
        source=source,
    )
