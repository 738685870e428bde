"""Work a request defers (search.after_answer) starts only once its answer has been sent, on every path."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from search import after_answer
from search.web.api import answer_first


def test_work_outside_a_request_starts_at_once() -> None:
    started: list[str] = []
    after_answer.start_after_answer(lambda: started.append("now"))
    assert started == ["now"]


def test_collected_work_starts_on_release_once() -> None:
    started: list[int] = []
    with after_answer.collecting() as pending:
        after_answer.start_after_answer(lambda: started.append(1))
        after_answer.start_after_answer(lambda: started.append(2))
        assert started == []
    after_answer.start_after_answer(lambda: started.append(3))  # the collection ended: at once
    assert started == [3]
    after_answer.release(pending)
    after_answer.release(pending)
    assert started == [3, 1, 2]


def _run(handler: Any) -> tuple[list[str], int]:
    """The events of one request through `answer_first`, and the status the client got."""
    events: list[str] = []

    async def main() -> int:
        app = web.Application(middlewares=[answer_first])

        async def prepared(request: web.Request, response: web.StreamResponse) -> None:
            events.append("answer sent")

        async def route(request: web.Request) -> web.StreamResponse:
            return await handler(request, events)

        app.on_response_prepare.append(prepared)
        app.router.add_get("/", route)
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/")
            await response.read()
            events.append("client read the answer")
            return response.status

    return events, asyncio.run(main())


def test_deferred_work_starts_after_the_answer_is_sent() -> None:
    async def handler(request: web.Request, events: list[str]) -> web.Response:
        after_answer.start_after_answer(lambda: events.append("refresh started"))
        events.append("handler done")
        return web.json_response({"ok": True})

    events, status = _run(handler)
    assert status == 200
    assert events.index("handler done") < events.index("answer sent") < events.index("refresh started")


def test_deferred_work_starts_when_the_handler_fails() -> None:
    async def handler(request: web.Request, events: list[str]) -> web.Response:
        after_answer.start_after_answer(lambda: events.append("refresh started"))
        raise RuntimeError("boom")

    events, status = _run(handler)
    assert status == 500
    assert "refresh started" in events
