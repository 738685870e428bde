"""The API's own-row writer (search.telemetry.batches.BatchWriter): a flush waits for one in flight.

The transaction is a stand-in object: what is tested is the writer's ordering of buffer, write and commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from search.telemetry.batches import BatchWriter


class _Transactions:
    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[None]:
        yield None


def _writer(write: Callable[[Any, list[str]], Awaitable[None]], *, batch_rows: int) -> BatchWriter[str]:
    """A writer of ten buffered rows at most that flushes on a full batch (its timer: a minute)."""
    return BatchWriter(_Transactions(), "rows", write, buffer_rows=10, batch_rows=batch_rows, flush_s=60)  # type: ignore[arg-type]


def test_a_flush_returns_only_after_rows_another_flush_took_are_committed() -> None:
    committed: list[str] = []
    write_started, release = asyncio.Event(), asyncio.Event()

    async def slow_write(conn: Any, rows: list[str]) -> None:
        write_started.set()
        await release.wait()
        committed.extend(rows)

    async def scenario() -> None:
        writer = _writer(slow_write, batch_rows=10)
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


def test_close_ends_the_background_task_even_when_it_was_just_woken() -> None:
    """A close in the same turn as the wake-up must still end the task: `asyncio.wait_for` (Python 3.11) returns
    the woken result and drops a cancellation that arrives then, and the loop would run on, `close` waiting for it
    forever (a test's shutdown hung 10 minutes)."""
    written: list[str] = []

    async def write(conn: Any, rows: list[str]) -> None:
        written.extend(rows)

    async def scenario() -> None:
        writer = _writer(write, batch_rows=1)
        writer.start()
        for _ in range(3):  # the task is waiting for its wake-up
            await asyncio.sleep(0)
        writer.record("a")  # a full batch: wakes the task
        await asyncio.sleep(0)  # the wake-up is delivered; the task has not run on yet
        closing = asyncio.create_task(writer.close())
        done, _ = await asyncio.wait({closing}, timeout=10)
        assert done, "close() did not return: the background task ran on"
        assert written == ["a"]

    asyncio.run(scenario())
