"""The dead-letter topic's records without Kafka (streams.dead_letters): how a dead letter reads back (also one
written before it carried its class, attempts and time), which wait, how `--key` / `--all` select, and the table
`ki dlq list` prints."""

from __future__ import annotations

import json

import pytest

from streams.dead_letters import (
    DeadLetter,
    Failure,
    SelectionError,
    age,
    backlog,
    by_key,
    display_key,
    letter_value,
    parse,
    replayable,
    select,
    summary_line,
    table_lines,
    unhandled,
)
from tests.unit.projections.test_cdc import VERSION_ROW, envelope

TOPIC = "ki.public.document_versions"


def letter(offset: int, key: str = '{"id": 42}', at_ms: int = 1_000_000, value: bytes | None = None) -> DeadLetter:
    raw = letter_value(
        "content",
        Failure("cannot be applied: EmbeddingError: HTTP 400", "EmbeddingError", 3),
        topic=TOPIC,
        partition=0,
        offset=100 + offset,
        key=key.encode(),
        value=value if value is not None else envelope(after=VERSION_ROW),
        at_ms=at_ms,
    )
    return parse(0, offset, 5, raw)


def test_a_dead_letter_reads_back_with_its_key_table_class_attempts_and_time() -> None:
    d = letter(7)
    assert (d.key, d.table, d.error_class, d.attempts, d.at_ms) == (
        "document_versions/42", "document_versions", "EmbeddingError", 3, 1_000_000
    )  # fmt: skip
    assert d.position == (0, 7) and d.source_offset == 107
    assert 42 in d.dirty_keys().content_versions  # what the lane decoded, decoded again for a replay


def test_an_older_dead_letter_takes_its_class_from_the_reason_and_its_time_from_the_broker() -> None:
    old = {"lane": "access", "reason": "cannot be applied: BulkRejected: mapper_parsing_exception", "topic": TOPIC,
           "partition": 1, "offset": 3, "key": '{"id": 9}', "value": None}  # fmt: skip
    d = parse(0, 4, 1234, json.dumps(old).encode())
    assert (d.error_class, d.attempts, d.at_ms, d.key) == ("BulkRejected", None, 1234, "document_versions/9")
    assert parse(0, 5, 1, json.dumps({**old, "reason": "undecodable: bad"}).encode()).error_class == "undecodable"
    # Not even JSON: still listed (and so droppable), not hidden.
    broken = parse(0, 6, 99, b"\xff")
    assert broken.error_class == "undecodable" and broken.at_ms == 99 and broken.key == "?/-"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [('{"id": 42}', "42"), ('{"schema": {}, "payload": {"id": 7}}', "7"), ('{"a": 1, "b": 2}', '{"a": 1, "b": 2}'),
     ("not json", "not json"), (None, "-"), ('{"id": true}', '{"id": true}')],
)  # fmt: skip
def test_display_key(raw: str | None, shown: str) -> None:
    assert display_key(raw) == shown


def test_handled_dead_letters_are_not_waiting_and_the_oldest_sets_the_age() -> None:
    letters = [letter(1, at_ms=5_000), letter(2, at_ms=2_000), letter(3, at_ms=9_000)]
    waiting = unhandled(letters, {(0, 2)})
    assert [d.offset for d in waiting] == [1, 3]
    assert backlog(waiting, now_s=10.0).count == 2 and backlog(waiting, now_s=10.0).oldest_s == 5.0
    assert backlog([], now_s=10.0).count == 0 and backlog([], now_s=10.0).oldest_s == 0.0


def test_select_by_key_takes_every_dead_letter_of_the_key() -> None:
    letters = [letter(1), letter(2, key='{"id": 43}'), letter(3)]
    assert [d.offset for d in select(letters, ["document_versions/42"], False, "replay")] == [1, 3]
    assert [d.offset for d in select(letters, [], True, "drop")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("letters", "keys", "every", "says"),
    [
        ([], [], True, "nothing to replay"),
        ([letter(1)], ["document_versions/1"], False, "no waiting dead letter has the key document_versions/1"),
        ([], ["document_versions/42"], False, "no dead letter is waiting"),
        ([letter(1)], [], False, "give --key KEY"),
        ([letter(1)], ["document_versions/42"], True, "not both"),
    ],
)
def test_select_refuses_in_one_line(letters: list[DeadLetter], keys: list[str], every: bool, says: str) -> None:
    with pytest.raises(SelectionError, match=says) as refused:
        select(letters, keys, every, "replay")
    assert "\n" not in str(refused.value)


def test_a_record_that_cannot_be_decoded_is_not_replayed_but_named() -> None:
    split = replayable([letter(1), letter(2, value=b"{not json")])
    assert [d.offset for d in split.decodable] == [1] and 42 in split.keys.content_versions
    ((d, why),) = split.undecodable
    assert d.offset == 2 and why.startswith("undecodable:") and "drop it" in why


def test_the_list_groups_by_key_and_sums_the_attempts() -> None:
    letters = [letter(1, at_ms=1_000), letter(2, key='{"id": 43}', at_ms=2_000), letter(3, at_ms=3_000)]
    (first, second) = by_key(letters)
    assert (first.key, first.letters, first.attempts, first.first_seen_ms) == ("document_versions/42", 2, 6, 1_000)
    assert second.key == "document_versions/43"
    lines = table_lines([first, second], now_s=3_601.0, reason_width=20)
    assert lines[0].split() == ["KEY", "TABLE", "ERROR", "FIRST", "SEEN", "ATTEMPTS", "REASON"]
    assert lines[1].startswith("document_versions/42  document_versions  EmbeddingError  1h 0m ago")
    assert "6 (2 dead letters)" in lines[1] and lines[1].endswith("cannot be applied: …")
    assert first.as_json()["dead_letters"] == 2


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0s"), (59.9, "59s"), (61, "1m"), (3_720, "1h 2m"),
                                                (90_000, "1d 1h"), (-5, "0s")])  # fmt: skip
def test_age(seconds: float, shown: str) -> None:
    assert age(seconds) == shown


def test_summary_line() -> None:
    assert summary_line("replay", {"replayed": 1}) == "replayed 1 dead letter"
    assert summary_line("drop", {"dropped": 3}) == "dropped 3 dead letters"
    assert summary_line("replay", {"replayed": 2, "failed": 1}) == "replay: 1 failed, 2 replayed"
