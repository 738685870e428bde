"""Pure parts of the OpenSearch writer."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, cast

import pytest
from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import TransportError

from ki.errors import BulkThrottled, IndexReadOnly
from ki.settings import Settings
from streams.writer import (
    BulkOp,
    IndexWriter,
    interval_seconds,
    pending_vectors_of,
    pending_vectors_query,
    reuse_query,
    write_block_of,
)


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


class _RecordingIndices:
    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = calls

    async def put_settings(self, **kwargs: Any) -> None:
        self.calls.append(("put_settings", kwargs))

    async def delete(self, **kwargs: Any) -> None:
        self.calls.append(("delete", kwargs))


class _RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.indices = _RecordingIndices(self.calls)

    async def search(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("search", kwargs))
        return {"aggregations": {"versions": {"buckets": [{"key": 7}, {"key": "12"}]}}}


def test_the_writer_owns_the_index_level_writes_a_rebuild_makes() -> None:
    """Rebuild and reconcile reach OpenSearch only through the writer: the refresh pause while loading, its
    end, retiring an old index, and reading which versions are indexed, each against the index written."""
    settings = Settings()
    client = _RecordingClient()
    writer = IndexWriter(cast(AsyncOpenSearch, client), settings, index="phys--1")

    async def steps() -> set[int]:
        await writer.pause_refresh()
        await writer.resume_refresh()
        await writer.delete_index("phys--0")
        return await writer.all_indexed_versions()

    assert asyncio.run(steps()) == {7, 12}
    assert [name for name, _ in client.calls] == ["put_settings", "put_settings", "delete", "search"]
    assert client.calls[0][1] == {"index": "phys--1", "body": {"index": {"refresh_interval": "-1"}}}
    restored = {"index": {"refresh_interval": settings.opensearch.refresh_interval}}
    assert client.calls[1][1] == {"index": "phys--1", "body": restored}
    assert client.calls[2][1] == {"index": "phys--0", "ignore": (404,)}
    assert client.calls[3][1]["index"] == "phys--1"


# -- back-pressure and write blocks on `_bulk` --------------------------------------------------------

REJECTED = {"status": 429, "error": {"type": "es_rejected_execution_exception", "reason": "queue capacity 1"}}
BLOCKED = {
    "status": 429,
    "error": {"type": "cluster_block_exception", "reason": "blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded…]"},
}


class _BulkClient:
    """Answers each `_bulk` with the next scripted item answers (one per line pair sent)."""

    def __init__(self, *answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.sent: list[list[str]] = []

    async def bulk(self, body: bytes, params: dict[str, str]) -> dict[str, Any]:
        lines = [json.loads(line) for line in body.decode().splitlines()]
        self.sent.append([next(iter(meta.values()))["_id"] for meta in lines[::2]])
        return {"errors": True, "items": [{"index": answer} for answer in self.answers.pop(0)]}


def _ops(*ids: str) -> list[BulkOp]:
    return [BulkOp("index", doc_id, {"text": doc_id}, group="7") for doc_id in ids]


def test_bulk_items_rejected_with_429_are_sent_again_alone_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("streams.writer.asyncio.sleep", sleep)
    client = _BulkClient([{"status": 201}, REJECTED, REJECTED], [REJECTED, {"status": 201}], [{"status": 201}])
    writer = IndexWriter(cast(AsyncOpenSearch, client), Settings(), index="phys--1")
    result = asyncio.run(writer.bulk(_ops("a", "b", "c")))
    assert result.written == 3 and client.sent == [["a", "b", "c"], ["b", "c"], ["b"]]
    assert waits == [0.2, 0.4]  # the writer slows down: exponential backoff between the rounds


def test_a_bulk_item_refused_by_a_write_block_raises_index_read_only_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("streams.writer.asyncio.sleep", sleep)
    client = _BulkClient([BLOCKED, REJECTED])
    writer = IndexWriter(cast(AsyncOpenSearch, client), Settings(), index="phys--1")
    with pytest.raises(IndexReadOnly, match="cluster_block_exception"):
        asyncio.run(writer.bulk(_ops("a", "b")))
    assert len(client.sent) == 1 and waits == []  # not retried here: the lane pauses and checks the block


def test_the_write_block_is_read_from_the_index_settings() -> None:
    flood = {"phys--1": {"settings": {"index.blocks.read_only_allow_delete": "true"}}}
    flooded = "index read-only (flood stage: the disk is past its flood-stage watermark) on phys--1"
    assert write_block_of(flood) == flooded
    assert write_block_of({"phys--1": {"settings": {"index.blocks.write": "true"}}}) is not None
    assert write_block_of({"phys--1": {"settings": {"index.blocks.read_only_allow_delete": "false"}}}) is None
    assert write_block_of({"phys--1": {"settings": {}}}) is None


class _RejectingClient(_BulkClient):
    """Rejects the first `_bulk` requests as a whole (shard indexing pressure's coordinating rejection)."""

    def __init__(self, rejections: list[TransportError], *answers: list[dict[str, Any]]) -> None:
        super().__init__(*answers)
        self.rejections = rejections

    async def bulk(self, body: bytes, params: dict[str, str]) -> dict[str, Any]:
        if self.rejections:
            self.sent.append(["rejected"])
            raise self.rejections.pop(0)
        return await super().bulk(body, params)


def _rejected(kind: str = "rejected_execution_exception", status: int = 429) -> TransportError:
    reason = "rejected execution of coordinating operation"
    return TransportError(status, kind, {"error": {"type": kind, "reason": reason}})


def test_a_bulk_request_rejected_with_429_as_a_whole_is_retried_then_throttled(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("streams.writer.asyncio.sleep", sleep)
    client = _RejectingClient([_rejected(), _rejected()], [{"status": 201}, {"status": 201}])
    writer = IndexWriter(cast(AsyncOpenSearch, client), Settings(), index="phys--1")
    assert asyncio.run(writer.bulk(_ops("a", "b"))).written == 2
    assert client.sent == [["rejected"], ["rejected"], ["a", "b"]] and waits == [0.2, 0.4]
    # Still rejected after the writer's retries: back-pressure (transient, not an attempt of the lane), never a refusal.
    settings = Settings()
    client = _RejectingClient([_rejected()] * (settings.opensearch.max_retries + 1))
    writer = IndexWriter(cast(AsyncOpenSearch, client), settings, index="phys--1")
    with pytest.raises(BulkThrottled, match="429 rejected_execution_exception"):
        asyncio.run(writer.bulk(_ops("a")))
    # A write block answered 429 to the whole request is the index read-only, not back-pressure.
    client = _RejectingClient([_rejected("cluster_block_exception")])
    with pytest.raises(IndexReadOnly):
        asyncio.run(IndexWriter(cast(AsyncOpenSearch, client), settings, index="phys--1").bulk(_ops("a")))


class _PublishingClient(_BulkClient):
    """Records each `_bulk`'s refresh parameter and every forced refresh."""

    def __init__(self) -> None:
        super().__init__()
        self.refresh_params: list[str] = []
        self.refreshes = 0
        self.indices = self

    async def bulk(self, body: bytes, params: dict[str, str]) -> dict[str, Any]:
        self.refresh_params.append(params["refresh"])
        return {"errors": False, "items": [{"index": {"status": 201}} for _ in body.decode().splitlines()[::2]]}

    async def refresh(self, index: str) -> None:
        self.refreshes += 1


@pytest.mark.parametrize(("waits", "interval", "sent", "forced"), [
    (False, "1s", "false", 1),  # reading a version it just wrote forces a refresh first
    (True, "1s", "wait_for", 0),  # the write returned once published: nothing to force
    (True, "-1", "false", 1),  # no periodic refresh would ever publish it: forced as before
])  # fmt: skip
def test_a_writer_that_waits_for_the_periodic_refresh_forces_none(
    waits: bool, interval: str, sent: str, forced: int
) -> None:
    client = _PublishingClient()
    settings = Settings.model_validate({"opensearch": {"refresh_interval": interval}})
    writer = IndexWriter(cast(AsyncOpenSearch, client), settings, index="phys--1", waits_for_refresh=waits)

    async def write_then_read() -> None:
        await writer.bulk(_ops("a"))
        await writer._publish_own_writes([7])  # what every read of version 7's rows does first

    asyncio.run(write_then_read())
    assert client.refresh_params == [sent] and client.refreshes == forced
