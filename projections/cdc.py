"""Typed decoding of Debezium change events (JSON converter, schemas disabled).

A record's value is `{before, after, source, op, ts_ms}`; its key is the primary key as JSON
(`{"id": 5}`); a record with a null value is a tombstone (it lets log compaction drop the key).
Anything we cannot decode raises `PoisonEvent` with a reason, so the stream sends it to the
dead-letter topic instead of dropping it.

Column encodings (Debezium PostgreSQL connector defaults): `date` is days since the epoch,
`timestamptz` an ISO-8601 string, `timestamp` microseconds since the epoch, `jsonb` a JSON
string, arrays JSON lists. An unchanged TOASTed column in an update arrives as a placeholder;
we turn it into the `UNAVAILABLE` sentinel so it can never be indexed as text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any, Final, Literal, cast

from ki.errors import PermanentError
from projections.rows import (
    VERSION_STATUSES,
    DocumentState,
    MatterState,
    NotableClause,
    OntologyNode,
    VersionState,
)

Op = Literal["r", "c", "u", "d", "t", "m"]
OPS: frozenset[str] = frozenset({"r", "c", "u", "d", "t", "m"})
ROW_OPS: frozenset[str] = frozenset({"r", "c", "u", "d"})

#: Tables whose rows shape index content.
CONTENT_TABLES: frozenset[str] = frozenset({"documents", "document_versions", "ontology_nodes", "matters"})
#: Tables whose rows only change the principal projection (access-only path).
ACCESS_TABLES: frozenset[str] = frozenset(
    {
        "projects",
        "sources",
        "source_objects",
        "source_observations",
        "grants",
        "group_memberships",
        "principal_aliases",
    }
)
#: Default for `decode(known_tables=...)`: the tables the schema publishes for the sidecar.
KNOWN_TABLES: frozenset[str] = CONTENT_TABLES | ACCESS_TABLES

# Debezium's default `unavailable.value.placeholder`.
DEBEZIUM_UNAVAILABLE: Final = "__debezium_unavailable_value"
_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PoisonEvent(PermanentError):
    """A record that can never be applied; `reason` goes to the dead-letter topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnavailableColumns(PermanentError):
    """A row still holds TOAST placeholders in columns we need; fill them from known state first."""

    def __init__(self, table: str, columns: Collection[str]) -> None:
        self.table = table
        self.columns = tuple(sorted(columns))
        super().__init__(f"{table}: unchanged TOAST columns not available: {', '.join(self.columns)}")


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
        # Loud on purpose: `value or ""` would silently index an empty text for a TOASTed column.
        raise TypeError("UNAVAILABLE has no truth value; merge it with known state first")

    def __reduce__(self) -> str:
        return "UNAVAILABLE"  # pickles as the module-level singleton


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


def unavailable_columns(row: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(col for col, val in row.items() if val is UNAVAILABLE)


@dataclass(frozen=True, slots=True)
class MergeResult:
    row: dict[str, Any]
    missing: frozenset[str]

    @property
    def complete(self) -> bool:
        return not self.missing


def merge_unavailable(after: Mapping[str, Any], previous: Mapping[str, Any] | None) -> MergeResult:
    """Fill `UNAVAILABLE` columns of `after` from a previously known row of the same key.

    Columns the previous row does not know (or knows only as unavailable) stay `UNAVAILABLE`
    and are reported in `missing`.
    """
    merged = dict(after)
    missing: set[str] = set()
    for col, val in after.items():
        if val is not UNAVAILABLE:
            continue
        known = previous.get(col, UNAVAILABLE) if previous is not None else UNAVAILABLE
        if known is UNAVAILABLE or is_unavailable(known):
            missing.add(col)
        else:
            merged[col] = known
    return MergeResult(row=merged, missing=frozenset(missing))


# --- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceInfo:
    lsn: int | None
    ts_ms: int | None
    tx_id: int | None
    snapshot: bool
    db: str | None
    schema: str | None
    table: str | None


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    topic: str
    table: str
    op: Op
    key: dict[str, Any] | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    source: SourceInfo
    ts_ms: int | None = None

    @property
    def row(self) -> dict[str, Any] | None:
        """The row state the event leaves behind (None for deletes and truncates)."""
        return None if self.op in ("d", "t", "m") else self.after

    @property
    def is_delete(self) -> bool:
        return self.op == "d"


@dataclass(frozen=True, slots=True)
class Tombstone:
    topic: str
    table: str
    key: dict[str, Any] = field(default_factory=dict)


def topic_name(prefix: str, table: str, schema: str = "public") -> str:
    return f"{prefix}.{schema}.{table}"


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

    # Logical-decoding messages go to `<prefix>.message`, which names no table.
    table = "" if op == "m" and topic.endswith(".message") else table_of_topic(topic)
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
        tx_id=_optional_int(src.get("txId"), "source.txId"),
        snapshot=_snapshot_flag(src.get("snapshot")),
        db=src.get("db"),
        schema=src.get("schema"),
        table=src.get("table"),
    )
    if op in ROW_OPS and source.lsn is None:
        raise PoisonEvent("source.lsn missing: cannot order the event")
    return ChangeEvent(
        topic=topic,
        table=table,
        op=cast(Op, op),
        key=key,
        before=before,
        after=after,
        source=source,
        ts_ms=_optional_int(value.get("ts_ms"), "ts_ms"),
    )


def ordering_key(event: ChangeEvent) -> tuple[int, int, int]:
    """Sort key that follows commit order for one row: (lsn, streamed-after-snapshot, ts_ms).

    Snapshot reads of a table share the snapshot's LSN; a streamed change at the same LSN is
    newer, hence the second component.
    """
    if event.source.lsn is None:
        raise ValueError(f"event on {event.topic} has no LSN")
    return (event.source.lsn, 0 if event.op == "r" else 1, event.ts_ms or 0)


def external_version(event: ChangeEvent) -> int:
    """The OpenSearch external version for writes caused by `event`: its LSN (fits a signed long)."""
    return ordering_key(event)[0]


# --- column converters ---------------------------------------------------------------------------


def date_from_debezium(value: Any) -> date | None:
    """`date` column: int days since 1970-01-01 (also accepts an ISO date string)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return _EPOCH_DATE + timedelta(days=value)
    if isinstance(value, str):
        try:
            return date.fromisoformat(value[:10])
        except ValueError:
            pass
    raise PoisonEvent(f"cannot read date from {value!r}")


def timestamp_from_debezium(value: Any) -> datetime | None:
    """`timestamptz`: ISO-8601 string; `timestamp`: int microseconds since the epoch (read as UTC)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return _EPOCH + timedelta(microseconds=value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise PoisonEvent(f"cannot read timestamp from {value!r}") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise PoisonEvent(f"cannot read timestamp from {value!r}")


def jsonb_from_debezium(value: Any) -> Any:
    """`jsonb` arrives as a JSON string; already-parsed values pass through."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise PoisonEvent(f"jsonb column is not valid JSON: {exc.msg}") from None
    return value


# --- rows -> typed states --------------------------------------------------------------------------


def _require(row: Mapping[str, Any], table: str, *columns: str) -> None:
    absent = [c for c in columns if c not in row]
    if absent:
        raise PoisonEvent(f"{table}: missing column(s) {', '.join(absent)}")
    unavailable = [c for c in columns if row[c] is UNAVAILABLE]
    if unavailable:
        raise UnavailableColumns(table, unavailable)


def _int(row: Mapping[str, Any], table: str, column: str) -> int:
    value = _optional_int(row.get(column), f"{table}.{column}")
    if value is None:
        raise PoisonEvent(f"{table}.{column} must not be null")
    return value


def _text_list(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PoisonEvent(f"{what} must be a list of strings")
    return tuple(value)


def document_from_row(row: Mapping[str, Any]) -> DocumentState:
    table = "documents"
    _require(
        row,
        table,
        "id",
        "project_id",
        "title",
        "matter_id",
        "doc_type_id",
        "identifiers",
        "latest_final_version_id",
        "deleted_at",
    )
    return DocumentState(
        id=_int(row, table, "id"),
        project_id=_int(row, table, "project_id"),
        title=row["title"] or "",
        matter_id=_optional_int(row["matter_id"], "documents.matter_id"),
        doc_type_id=_optional_int(row["doc_type_id"], "documents.doc_type_id"),
        identifiers=_text_list(row["identifiers"], "documents.identifiers"),
        latest_final_version_id=_optional_int(row["latest_final_version_id"], "documents.latest_final_version_id"),
        deleted_at=timestamp_from_debezium(row["deleted_at"]),
    )


def _clauses(value: Any) -> tuple[NotableClause, ...]:
    parsed = jsonb_from_debezium(value)
    if parsed is None:
        return ()
    if not isinstance(parsed, list):
        raise PoisonEvent("document_versions.notable_clauses must be a JSON list")
    clauses: list[NotableClause] = []
    for i, item in enumerate(parsed):
        if not isinstance(item, dict):
            raise PoisonEvent(f"document_versions.notable_clauses[{i}] must be an object")
        text = item.get("text")
        locus = item.get("locus")
        if not isinstance(text, str) or not (locus is None or isinstance(locus, str)):
            raise PoisonEvent(f"document_versions.notable_clauses[{i}] needs string text and locus")
        clause_type_id = _optional_int(item.get("clause_type_id"), f"notable_clauses[{i}].clause_type_id")
        clauses.append(NotableClause(clause_type_id=clause_type_id, locus=locus or "", text=text))
    return tuple(clauses)


def version_from_row(row: Mapping[str, Any]) -> VersionState:
    table = "document_versions"
    _require(
        row,
        table,
        "id",
        "document_id",
        "version_no",
        "status",
        "language",
        "doc_date",
        "text",
        "notable_clauses",
    )
    status = row["status"]
    if status not in VERSION_STATUSES:
        raise PoisonEvent(f"document_versions.status {status!r} is not one of {', '.join(VERSION_STATUSES)}")
    return VersionState(
        id=_int(row, table, "id"),
        document_id=_int(row, table, "document_id"),
        version_no=_int(row, table, "version_no"),
        status=status,
        language=row["language"] or "",
        doc_date=date_from_debezium(row["doc_date"]),
        text=row["text"] or "",
        notable_clauses=_clauses(row["notable_clauses"]),
    )


def ontology_node_from_row(row: Mapping[str, Any]) -> OntologyNode:
    table = "ontology_nodes"
    _require(row, table, "id", "kind", "key", "label", "parent_id")
    if row["kind"] not in ("doc_type", "clause_type"):
        raise PoisonEvent(f"ontology_nodes.kind {row['kind']!r} is not doc_type or clause_type")
    return OntologyNode(
        id=_int(row, table, "id"),
        kind=row["kind"],
        key=row["key"] or "",
        label=row["label"] or "",
        parent_id=_optional_int(row["parent_id"], "ontology_nodes.parent_id"),
    )


def matter_from_row(row: Mapping[str, Any]) -> MatterState:
    table = "matters"
    _require(row, table, "id", "project_id", "title", "reference")
    return MatterState(
        id=_int(row, table, "id"),
        project_id=_int(row, table, "project_id"),
        title=row["title"] or "",
        reference=row["reference"],
    )
