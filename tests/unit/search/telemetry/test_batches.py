"""The API's own-row writer (search.telemetry.batches.BatchWriter): a flush waits for one in flight.

The transaction is a stand-in object: what is tested is the writer's ordering of buffer, write and commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from search.telemetry.batches import BatchWriter


class _Transactions:
    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[None]:
        yield None


def test_a_flush_returns_only_after_rows_another_flush_took_are_committed() -> None:
    committed: list[str] = []
    write_started, release = asyncio.Event(), asyncio.Event()

    async def slow_write(conn: Any, rows: list[str]) -> None:
        write_started.set()
        await release.wait()
        committed.extend(rows)

    async def scenario() -> None:
        writer: BatchWriter[str] = BatchWriter(
            _Transactions(),
            "rows",
            slow_write,
            buffer_rows=10,
            batch_rows=10,
            flush_s=60,  # type: ignore[arg-type]
        )
        writer.record("a")
        background = asyncio.create_task(writer.flush())  # takes "a" from the buffer, then waits in the write
        await write_started.wait()
        assert not writer.buffer
        reader = asyncio.create_task(writer.flush())  # what `GET /v1/stats` does before it reads
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not reader.done(), "the reader's flush must wait for the rows in flight"
        release.set()
        assert await background == 1
        assert await reader == 0
        assert committed == ["a"]

    asyncio.run(scenario())
