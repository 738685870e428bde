"""The dead-letter topic's records, apart from Kafka and PostgreSQL: what a dead letter carries, how it reads
back, which ones are still to be handled, how `ki dlq` selects and shows them (pure; `streams.dlq` does the I/O).

A dead letter is one JSON value on `streams.dlq_topic` (keyed by the original record's key), written by a lane
(`streams.app.DeadLetters`) once its record could not be read or applied:
`lane`, `reason` (one line), `error_class` (the exception's class, or `undecodable`), `attempts` (how often the
lane tried to apply it; 1 for an unreadable record), `at_ms` (when it gave up), the original record's
`topic`, `partition`, `offset`, `key` and `value`. Records written before `error_class`, `attempts` and `at_ms`
existed read back with the class taken from the reason, no attempts and the broker's timestamp.

The topic is append-only, so "handled" is PostgreSQL's: `ki dlq replay` and `ki dlq drop` write one row per dead
letter to `ki_dlq_operations` (migration 0012), and a dead letter with a row whose outcome is `replayed` or
`dropped` is handled; every other one is listed, counted and selectable.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ki.errors import PermanentError
from projections.cdc import PoisonEvent, decode
from projections.dirty import DirtyKeys, dirty_keys

UNDECODABLE = "undecodable"
Action = Literal["replay", "drop"]
#: Outcomes that handle a dead letter for good; `failed` leaves it to be handled.
HANDLED_OUTCOMES = ("replayed", "dropped")
# `cannot be applied: EmbeddingError: ...` (the reason the lanes have written from the start)
_REASON_CLASS = re.compile(r"^cannot be applied: ([A-Za-z_][A-Za-z0-9_.]*):")


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a lane gave up on a record: the reason's one line, the failure's class, the attempts made."""

    reason: str
    error_class: str
    attempts: int

    @classmethod
    def undecodable(cls, exc: BaseException) -> Failure:
        return cls(f"{UNDECODABLE}: {exc}", UNDECODABLE, 1)

    @classmethod
    def not_applied(cls, exc: BaseException, attempts: int) -> Failure:
        return cls(f"cannot be applied: {type(exc).__name__}: {exc}", type(exc).__name__, attempts)


def letter_value(
    lane: str,
    failure: Failure,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    at_ms: int,
) -> bytes:
    """The dead letter's value on the topic (its Kafka key is the original record's key)."""
    return json.dumps(
        {
            "lane": lane,
            "reason": failure.reason,
            "error_class": failure.error_class,
            "attempts": failure.attempts,
            "at_ms": at_ms,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key": key.decode("utf-8", "replace") if key else None,
            "value": value.decode("utf-8", "replace") if value else None,
        }
    ).encode()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of the dead-letter topic, read back. `position` is where it is on the DLQ topic (what the
    operations log marks); `source_*` is the original CDC record it stands for."""

    partition: int
    offset: int
    at_ms: int
    lane: str
    reason: str
    error_class: str
    attempts: int | None
    source_topic: str
    source_partition: int | None
    source_offset: int | None
    source_key: str | None
    source_value: str | None

    @property
    def position(self) -> tuple[int, int]:
        return self.partition, self.offset

    @property
    def table(self) -> str:
        return self.source_topic.rsplit(".", 1)[-1] if self.source_topic else "?"

    @property
    def key(self) -> str:
        """What `ki dlq` shows and `--key` selects: `<table>/<primary key>` (`document_versions/42`); a key that is
        not a one-field JSON object is shown as it came (`grants/{"id": -1, ...}`), a record without one as `-`."""
        return f"{self.table}/{display_key(self.source_key)}"

    def dirty_keys(self) -> DirtyKeys:
        """What the original record dirties, exactly as the lane decoded it; raises `PoisonEvent` (or
        ValueError/TypeError) for a record that cannot be decoded."""
        return dirty_keys(decode(self.source_topic, self.source_key, self.source_value))


def display_key(raw: str | None) -> str:
    if raw is None:
        return "-"
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(parsed, dict) and set(parsed) == {"payload", "schema"}:
        parsed = parsed["payload"]
    if isinstance(parsed, dict) and len(parsed) == 1:
        (only,) = parsed.values()
        if isinstance(only, int | str) and not isinstance(only, bool):
            return str(only)
    return raw


def parse(partition: int, offset: int, timestamp_ms: int, value: bytes | None) -> DeadLetter:
    """A dead letter as the DLQ topic holds it; anything unreadable still reads back as a dead letter (of an
    unknown record), so that it can be listed and dropped rather than hidden."""
    try:
        payload: Any = json.loads(value or b"")
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return DeadLetter(partition, offset, timestamp_ms, "?", "the dead letter itself is not JSON", UNDECODABLE,
                          None, "", None, None, None, None)  # fmt: skip
    reason = str(payload.get("reason") or "")
    error_class = payload.get("error_class")
    if not isinstance(error_class, str) or not error_class:
        error_class = error_class_of(reason)
    attempts = payload.get("attempts")
    at_ms = payload.get("at_ms")
    return DeadLetter(
        partition=partition,
        offset=offset,
        at_ms=at_ms if isinstance(at_ms, int) and not isinstance(at_ms, bool) else timestamp_ms,
        lane=str(payload.get("lane") or "?"),
        reason=reason,
        error_class=error_class,
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else None,
        source_topic=str(payload.get("topic") or ""),
        source_partition=_int_or_none(payload.get("partition")),
        source_offset=_int_or_none(payload.get("offset")),
        source_key=_str_or_none(payload.get("key")),
        source_value=_str_or_none(payload.get("value")),
    )


def error_class_of(reason: str) -> str:
    """The failure's class as an older dead letter's reason names it."""
    if reason.startswith(f"{UNDECODABLE}:"):
        return UNDECODABLE
    found = _REASON_CLASS.match(reason)
    return found.group(1) if found else "?"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# -- handled and unhandled -------------------------------------------------------------------------


def unhandled(letters: Iterable[DeadLetter], handled: Collection[tuple[int, int]]) -> list[DeadLetter]:
    """The dead letters no replay or drop has handled (`handled`: their (partition, offset)), oldest first."""
    return sorted((d for d in letters if d.position not in handled), key=lambda d: (d.at_ms, d.position))


@dataclass(frozen=True, slots=True)
class Backlog:
    """The figures the worker exports: dead letters to handle and how long the oldest has waited."""

    count: int
    oldest_s: float  # 0 when there is none


def backlog(letters: Sequence[DeadLetter], now_s: float) -> Backlog:
    if not letters:
        return Backlog(0, 0.0)
    return Backlog(len(letters), max(0.0, now_s - min(d.at_ms for d in letters) / 1000))


class SelectionError(PermanentError):
    """A `--key` / `--all` choice that selects nothing `ki dlq` can act on (one readable line)."""


def select(letters: Sequence[DeadLetter], keys: Sequence[str], every: bool, action: Action) -> list[DeadLetter]:
    """The unhandled dead letters `--key K ...` or `--all` picks for `action`, oldest first; every dead letter of a
    key is picked (a row that failed twice has two). Refuses both or neither, an unknown key, and nothing to do."""
    if every == bool(keys):
        raise SelectionError(f"dlq {action}: give --key KEY (repeatable) or --all, not both and not neither")
    if every:
        if not letters:
            raise SelectionError(f"dlq {action}: nothing to {action}: no dead letter is waiting")
        return list(letters)
    known = {d.key for d in letters}
    unknown = [k for k in dict.fromkeys(keys) if k not in known]
    if unknown:
        hint = "no dead letter is waiting" if not letters else "`ki dlq list` shows the waiting ones"
        raise SelectionError(f"dlq {action}: no waiting dead letter has the key {', '.join(unknown)} ({hint})")
    wanted = set(keys)
    return [d for d in letters if d.key in wanted]


@dataclass(frozen=True, slots=True)
class Replayable:
    """A replay's selection split by what can go through the projector: the dirty keys of the decodable dead
    letters, and the ones whose record cannot be decoded (replaying cannot help them: drop them)."""

    keys: DirtyKeys
    decodable: list[DeadLetter]
    undecodable: list[tuple[DeadLetter, str]]


def replayable(letters: Sequence[DeadLetter]) -> Replayable:
    keys = DirtyKeys()
    decodable: list[DeadLetter] = []
    undecodable: list[tuple[DeadLetter, str]] = []
    for letter in letters:
        try:
            keys.update(letter.dirty_keys())
        except (PoisonEvent, ValueError, TypeError) as exc:
            undecodable.append((letter, f"{UNDECODABLE}: {exc}; replaying cannot help, drop it"))
            continue
        decodable.append(letter)
    return Replayable(keys, decodable, undecodable)


# -- what `ki dlq list` shows -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeySummary:
    """One key's waiting dead letters: `attempts` sums the tries each of them records (unknown counts 1)."""

    key: str
    table: str
    error_class: str
    first_seen_ms: int
    letters: int
    attempts: int
    reason: str  # the newest one's

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "table": self.table,
            "error_class": self.error_class,
            "first_seen_ms": self.first_seen_ms,
            "dead_letters": self.letters,
            "attempts": self.attempts,
            "reason": self.reason,
        }


def by_key(letters: Sequence[DeadLetter]) -> list[KeySummary]:
    """One summary per key, the key first seen earliest first."""
    grouped: dict[str, list[DeadLetter]] = {}
    for letter in sorted(letters, key=lambda d: (d.at_ms, d.position)):
        grouped.setdefault(letter.key, []).append(letter)
    return [
        KeySummary(
            key=key,
            table=group[0].table,
            error_class=group[-1].error_class,
            first_seen_ms=group[0].at_ms,
            letters=len(group),
            attempts=sum(d.attempts or 1 for d in group),
            reason=group[-1].reason,
        )
        for key, group in grouped.items()
    ]


def age(seconds: float) -> str:
    """`45s`, `12m`, `3h 20m`, `2d 4h`: how long ago, to the minute once past one."""
    s = max(0, math.floor(seconds))
    if s < 60:
        return f"{s}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if hours < 1:
        return f"{minutes}m"
    if days < 1:
        return f"{hours}h {minutes % 60}m"
    return f"{days}d {hours % 24}h"


def table_lines(summaries: Sequence[KeySummary], now_s: float, reason_width: int = 80) -> list[str]:
    """`ki dlq list`'s table: a header and one line per key (no line at all when nothing waits)."""
    rows = [("KEY", "TABLE", "ERROR", "FIRST SEEN", "ATTEMPTS", "REASON")]
    for s in summaries:
        reason = s.reason if len(s.reason) <= reason_width else s.reason[: reason_width - 1] + "…"
        seen = f"{age(now_s - s.first_seen_ms / 1000)} ago"
        attempts = str(s.attempts) if s.letters == 1 else f"{s.attempts} ({s.letters} dead letters)"
        rows.append((s.key, s.table, s.error_class, seen, attempts, reason))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
            for row in rows]  # fmt: skip


def summary_line(action: Action, outcomes: Mapping[str, int]) -> str:
    """`replayed 3 dead letters` / `replay: 2 replayed, 1 failed`."""
    done = "replayed" if action == "replay" else "dropped"
    if set(outcomes) <= {done}:
        n = outcomes.get(done, 0)
        return f"{done} {n} dead letter{'s' if n != 1 else ''}"
    return f"{action}: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
