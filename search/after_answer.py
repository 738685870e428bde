"""Work a request starts that must not run beside it.

A request answered from a stale cache entry starts that entry's refresh. Started at once, the refresh
shares the event loop, the CPU and the database pool with the rest of the request, which then takes longer
exactly when something changed -- hidden or not, a caller could time that. So the transport boundary (the
HTTP middleware, the MCP tool call) collects such work while the request runs and starts it once the answer
has left; outside a request (tests, benchmarks, background tasks) work starts at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Start = Callable[[], None]

_PENDING: ContextVar[list[Start] | None] = ContextVar("ki_after_answer", default=None)


def start_after_answer(start: Start) -> None:
    """`start()` once the current request's answer has left, or now when no request is collecting."""
    pending = _PENDING.get()
    if pending is None:
        start()
    else:
        pending.append(start)


@contextmanager
def collecting() -> Iterator[list[Start]]:
    """Collect the work started within; the caller hands the list to `release` after answering (and on
    every error path: a refresh never started would keep its entry marked as refreshing)."""
    pending: list[Start] = []
    token = _PENDING.set(pending)
    try:
        yield pending
    finally:
        _PENDING.reset(token)


def release(pending: list[Start]) -> None:
    """Start the collected work (each once: the list is emptied)."""
    while pending:
        pending.pop(0)()
