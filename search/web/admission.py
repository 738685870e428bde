"""Admission control: at most `api.limits.max_concurrent_requests` searches run at once, at most
`api.limits.max_queued_requests` wait for a slot, and none waits longer than `api.limits.queue_timeout_s`.

Overload is answered at once instead of queueing without bound (which would grow memory and latency
until the process falls over): a full queue is `Overloaded(429)`, a wait that timed out `Overloaded(503)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from ki.errors import TransientError


class Overloaded(TransientError):
    """The API is at capacity; `status` is 429 (queue full) or 503 (waited too long)."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(message)


class AdmissionGate:
    """`on_change(in_flight, waiting)` is told every change (the metrics' gauges: values set as they change
    work in multiprocess mode, callbacks read at scrape time do not)."""

    def __init__(
        self,
        max_in_flight: int,
        max_queued: int,
        queue_timeout_s: float,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        self.max_in_flight, self.max_queued, self.queue_timeout_s = max_in_flight, max_queued, queue_timeout_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.waiting = 0
        self.on_change = on_change or (lambda in_flight, waiting: None)

    def _count(self, in_flight: int = 0, waiting: int = 0) -> None:
        self.in_flight += in_flight
        self.waiting += waiting
        self.on_change(self.in_flight, self.waiting)

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        if self._slots.locked():
            if self.waiting >= self.max_queued:
                raise Overloaded(429, f"{self.in_flight} requests in flight and {self.waiting} waiting; retry later")
            self._count(waiting=1)
            try:
                await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s)
            except TimeoutError:
                raise Overloaded(503, f"no capacity within {self.queue_timeout_s:g} s; retry later") from None
            finally:
                self._count(waiting=-1)
        else:
            await self._slots.acquire()  # free: returns at once
        self._count(in_flight=1)
        try:
            yield
        finally:
            self._count(in_flight=-1)
            self._slots.release()
