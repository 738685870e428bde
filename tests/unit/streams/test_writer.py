"""Pure parts of the OpenSearch writer."""

from __future__ import annotations

import math

import pytest

from streams.writer import BulkOp, interval_seconds, pending_vectors_of, pending_vectors_query, reuse_query


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


def test_pending_vectors_counts_the_rows_written_text_first_and_the_oldest_wait() -> None:
    query = pending_vectors_query()
    assert query["query"] == {"exists": {"field": "vector_pending"}} and query["size"] == 0
    answer = {"hits": {"total": {"value": 3}}, "aggregations": {"oldest": {"value": 1_000_000.0}}}
    assert pending_vectors_of(answer, now=1_090.0) == (3, 90.0)
    none = {"hits": {"total": {"value": 0}}, "aggregations": {"oldest": {"value": None}}}
    assert pending_vectors_of(none, now=1_090.0) == (0, 0.0)


def test_vectors_are_reused_only_from_rows_that_have_one() -> None:
    query = reuse_query(["k1", "k2"])
    assert query["collapse"] == {"field": "embedding_key"} and query["size"] == 2
    assert query["query"]["bool"]["must_not"] == {"exists": {"field": "vector_pending"}}
