"""Rows the API keeps about its own work (retrieval statistics, the access audit), written off the request
path: buffered (bounded), written in batches by a background task every `flush_s` or as soon as
`batch_rows` are waiting. A failed write is logged and counted (`on_dropped`), never raised into a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ki.settings import ApiSettings

log = logging.getLogger(__name__)

Row = TypeVar("Row")


def batch_limits(api: ApiSettings) -> dict[str, Any]:
    """The buffer and batch settings every writer of the API's own rows shares (`api.stats.*`)."""
    return {"buffer_rows": api.stats.buffer_rows, "batch_rows": api.stats.batch_rows, "flush_s": api.stats.flush_s}


class BatchWriter(Generic[Row]):
    """`write(conn, rows)` stores a batch (and expires old rows) inside one transaction."""

    def __init__(
        self,
        engine: AsyncEngine,
        what: str,
        write: Callable[[AsyncConnection, list[Row]], Awaitable[None]],
        *,
        buffer_rows: int,
        batch_rows: int,
        flush_s: float,
        on_dropped: Callable[[int], Any] | None = None,
    ) -> None:
        self.engine, self.what, self.write = engine, what, write
        self.batch_rows, self.flush_s = batch_rows, flush_s
        self.buffer: deque[Row] = deque(maxlen=buffer_rows)
        self.on_dropped = on_dropped or (lambda n: None)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # One flush at a time: a reader that flushes before it reads must wait for rows a background flush
        # has already taken from the buffer but not yet committed.
        self._flushing = asyncio.Lock()

    def record(self, row: Row) -> None:
        if len(self.buffer) == self.buffer.maxlen:
            self.on_dropped(1)  # the oldest unwritten row makes room
        self.buffer.append(row)
        if len(self.buffer) >= self.batch_rows:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            # `asyncio.timeout`, not `wait_for`: on Python 3.11 the latter drops a cancellation that arrives as
            # the wake-up does, and `close` would wait for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> int:
        """Write what is buffered now, after any flush in flight has committed; returns the rows written."""
        async with self._flushing:
            return await self._write_buffered()

    async def _write_buffered(self) -> int:
        rows = [self.buffer.popleft() for _ in range(len(self.buffer))]
        if not rows:
            return 0
        started = time.perf_counter()
        try:
            async with self.engine.begin() as conn:
                await self.write(conn, rows)
        except Exception as exc:  # noqa: BLE001 - bookkeeping never fails or slows a request
            log.warning("%s: %d rows not written (%s: %s)", self.what, len(rows), type(exc).__name__, exc)
            self.on_dropped(len(rows))
            return 0
        log.debug("%s: %d rows in %.1f ms", self.what, len(rows), (time.perf_counter() - started) * 1000)
        return len(rows)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
