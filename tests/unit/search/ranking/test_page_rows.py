"""The page's fields are read after collapse, for the page's rows only: what `ScopedIndex.page_rows` asks and
what it makes of the answer (a recording stand-in for the client's `mget`; the live read is covered by the
search integration tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from search.ranking.fusion import Candidate
from search.ranking.legs import PAGE_SOURCE_INCLUDES, SOURCE_INCLUDES
from search.ranking.scoped import ScopedIndex
from search.telemetry.metrics import SearchMetrics


class RecordingClient:
    def __init__(self, rows: dict[str, dict[str, Any]]) -> None:
        self.rows, self.calls = rows, []  # type: list[dict[str, Any]]

    async def mget(self, index: str, body: dict[str, Any], params: dict[str, str]) -> dict[str, Any]:
        self.calls.append({"index": index, "body": body, "params": params})
        docs = [{"_id": i, "found": i in self.rows, **({"_source": self.rows[i]} if i in self.rows else {})}
                for i in body["ids"]]  # fmt: skip
        return {"docs": docs}


def _candidate(chunk_id: str, version: int) -> Candidate:
    source = {"document_id": "1", "document_version_id": str(version), "project_id": "7", "version_status": "final"}
    return Candidate(chunk_id, 1.0 / version, source)


def test_the_legs_read_no_page_field_and_the_page_read_reads_them_all() -> None:
    assert not set(PAGE_SOURCE_INCLUDES) & set(SOURCE_INCLUDES)
    assert {"text", "meta.start", "meta.end", "meta.locus", "vector_pending"} <= set(PAGE_SOURCE_INCLUDES)


def test_page_rows_asks_the_page_ids_in_id_order_and_adds_their_fields_in_page_order() -> None:
    client = RecordingClient({
        "3:chunk:0": {"text": "drei", "meta": {"start": 0, "end": 4}},
        "1:chunk:2": {"text": "eins", "chunk_kind": "chunk", "document_id": "999"},
    })  # fmt: skip
    scoped = ScopedIndex(client, "ki-chunks", None, SearchMetrics())  # type: ignore[arg-type]
    page = [_candidate("3:chunk:0", 3), _candidate("1:chunk:2", 1)]

    rows = asyncio.run(scoped.page_rows(page))

    assert client.calls == [{"index": "ki-chunks", "body": {"ids": ["1:chunk:2", "3:chunk:0"]},
                             "params": {"_source_includes": ",".join(PAGE_SOURCE_INCLUDES)}}]  # fmt: skip
    assert [c.chunk_id for c in rows] == ["3:chunk:0", "1:chunk:2"]
    assert rows[0].source["text"] == "drei" and rows[0].source["meta"] == {"start": 0, "end": 4}
    assert rows[1].source["document_id"] == "1"  # what the legs read (and the re-verify checked) stays
    assert rows[1].score == page[1].score and rows[1].source["version_status"] == "final"


def test_a_row_gone_since_the_legs_leaves_the_page_and_an_empty_page_asks_nothing() -> None:
    client = RecordingClient({"1:chunk:2": {"text": "eins"}})
    scoped = ScopedIndex(client, "ki-chunks", None, SearchMetrics())  # type: ignore[arg-type]

    rows = asyncio.run(scoped.page_rows([_candidate("3:chunk:0", 3), _candidate("1:chunk:2", 1)]))
    assert [c.chunk_id for c in rows] == ["1:chunk:2"]

    client.calls.clear()
    assert asyncio.run(scoped.page_rows([])) == []
    assert client.calls == []
