"""Admission control: at most `api.max_concurrent_requests` searches run at once, at most
`api.max_queued_requests` wait for a slot, and none waits longer than `api.queue_timeout_s`.

Overload is answered at once instead of queueing without bound (which would grow memory and latency
until the process falls over): a full queue is `Overloaded(429)`, a wait that timed out `Overloaded(503)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ki.errors import TransientError


class Overloaded(TransientError):
    """The API is at capacity; `status` is 429 (queue full) or 503 (waited too long)."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(message)


class AdmissionGate:
    def __init__(self, max_in_flight: int, max_queued: int, queue_timeout_s: float) -> None:
        self.max_in_flight, self.max_queued, self.queue_timeout_s = max_in_flight, max_queued, queue_timeout_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.waiting = 0

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        if self._slots.locked():
            if self.waiting >= self.max_queued:
                raise Overloaded(429, f"{self.in_flight} requests in flight and {self.waiting} waiting; retry later")
            self.waiting += 1
            try:
                await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s)
            except TimeoutError:
                raise Overloaded(503, f"no capacity within {self.queue_timeout_s:g} s; retry later") from None
            finally:
                self.waiting -= 1
        else:
            await self._slots.acquire()  # free: returns at once
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._slots.release()
