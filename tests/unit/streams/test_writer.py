"""Pure parts of the OpenSearch writer."""

from __future__ import annotations

import math

import pytest

from streams.writer import BulkOp, interval_seconds


@pytest.mark.parametrize(
    ("value", "seconds"), [("1s", 1.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), ("1d", 86400.0), ("1.5s", 1.5)]
)
def testinterval_seconds_reads_opensearch_time_values(value: str, seconds: float) -> None:
    assert interval_seconds(value) == seconds


def test_a_disabled_refresh_never_counts_as_published() -> None:
    assert math.isinf(interval_seconds("-1"))


@pytest.mark.parametrize("value", ["", "fast", "1w", "s"])
def testinterval_seconds_rejects_what_opensearch_would_not_accept(value: str) -> None:
    with pytest.raises(ValueError, match="time value"):
        interval_seconds(value)


def test_conditional_update_lines_carry_seq_no_and_primary_term() -> None:
    op = BulkOp("update", "7:chunk:0", {"access_version": 2}, if_seq_no=11, if_primary_term=1, group="7")
    meta, doc = op.lines("idx")
    assert meta == {"update": {"_index": "idx", "_id": "7:chunk:0", "if_seq_no": 11, "if_primary_term": 1}}
    assert doc == {"doc": {"access_version": 2}}
