"""Processes and isolation for the search API's end-to-end tests: real `ki serve` and `ki sync run`
children on free ports, an index alias and consumer group of a module's own, and a small HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from confluent_kafka import Consumer, KafkaException, TopicPartition

from apps.dev.checkout import REPO_ROOT
from apps.dev.stack.ports import lane_port_env
from apps.runtime.processes import Child as Process
from apps.runtime.processes import free_port
from ki import exposition
from ki.clients import make_kafka_admin, make_kafka_consumer, make_sync_client
from ki.settings import Settings, load_settings
from projections.lanes import LANES
from search.web.auth import mint_token
from tests.conftest import wait_for


class Child:
    """A `ki ...` child process with extra environment, logging to build/<name>.log: this checkout's code run
    in its root, or `command` (e.g. an installed `ki`) in `cwd`."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        *,
        command: list[str] | None = None,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.name = name
        self.log_path = REPO_ROOT / "build" / f"{name}.log"
        self.process = Process(
            [*(command or [sys.executable, "-m", "apps.cli"]), *args],
            self.log_path,
            cwd=cwd,
            env={"PYTHONUNBUFFERED": "1", **env},
        )

    def start(self, ready_url: str, timeout: float = 120) -> None:
        self.process.start()
        why = self.process.wait_ready(lambda: self._up(ready_url), timeout)
        assert why is None, f"{self.name} at {ready_url}: {why}; see {self.log_path}"

    @staticmethod
    def _up(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.process.stop()


class McpHttp(Child):
    def __init__(self, **env: str) -> None:
        self.port = free_port()
        super().__init__("mcp-http", ["mcp", "--port", str(self.port)], env)
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def start(self, ready_url: str = "", timeout: float = 120) -> None:
        self.process.start()
        why = self.process.wait_ready(self._listening, timeout)
        assert why is None, f"{self.name}: {why}; see {self.log_path}"

    def _listening(self) -> bool:
        try:
            urllib.request.urlopen(self.url, timeout=2)
        except urllib.error.HTTPError:
            return True  # it answers (401 without a token)
        except OSError:
            return False
        return True


class SyncWorker(Child):
    def __init__(
        self, env: dict[str, str], lane: str | None = None, *, command: list[str] | None = None, cwd: Path = REPO_ROOT
    ) -> None:
        # Ports of its own: another module's worker may still hold settings.streams.web_port.
        self.ports: dict[str, int] = {lane: free_port() for lane in LANES}
        self.port, self.access_port = self.ports["content"], self.ports["access"]
        # What an API (or another process) needs to read this worker's lanes.
        self.lane_env = lane_port_env(self.ports)
        self.lane = lane  # None: every lane
        args = ["sync", "run", *(["--lane", lane] if lane else [])]
        name = "search-sync-worker" + (f"-{lane}" if lane else "")
        super().__init__(name, args, {**env, **self.lane_env}, command=command, cwd=cwd)

    def start(self, ready_url: str = "", timeout: float = 120) -> None:
        self.process.start()
        urls = [f"http://127.0.0.1:{port}/metrics" for lane, port in self.ports.items() if self.lane in (None, lane)]
        why = self.process.wait_ready(lambda: all(exposition.answers(url) for url in urls), timeout)
        assert why is None, f"{self.name} ({self.lane or 'both'} lanes): {why}; see {self.log_path}"


class Server(Child):
    def __init__(
        self, name: str = "search-api", *, command: list[str] | None = None, cwd: Path = REPO_ROOT, **env: str
    ) -> None:
        self.port = free_port()
        # No per-caller rate limit unless a test asks for one: tests that fire requests as fast as they can
        # must not race it (test_search_hardening's tight server tests it).
        env = {"KI_API__LIMITS__RATE_PER_S": "0", **env}
        super().__init__(name, ["serve"], {"KI_API__PORT": str(self.port), **env}, command=command, cwd=cwd)
        self.base = f"http://127.0.0.1:{self.port}"

    def start(self, ready_url: str = "", timeout: float = 120) -> None:
        super().start(f"{self.base}/healthz", timeout)

    def operator_token(self) -> str:
        """A token of `role:operator`: who may read `/metrics` and `timings_ms`."""
        api = load_settings(environ={**os.environ, **self.process.env}).api
        return mint_token(api, "ki-test-operator", roles=["operator"])

    def metric(self, sample: str, **labels: str) -> float:
        """The sum of `/metrics` samples named `sample` whose labels include `labels` (0 if none)."""
        samples = exposition.scrape(f"{self.base}/metrics", token=self.operator_token())
        return exposition.total(samples, sample, exposition.having(**labels))

    def call(self, path: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        """Status and JSON body of one `request` (same arguments). A non-JSON body fails the test."""
        status, content_type, payload = self.request(path, *args, **kwargs)
        assert content_type.startswith("application/json"), f"{path} -> {status} {content_type}: {payload[:300]!r}"
        return status, json.loads(payload)

    def request(
        self,
        path: str,
        body: Any = None,
        token: str | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, bytes]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.base + path, data=data, method="POST" if data is not None else "GET")
        request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.headers.get("Content-Type", ""), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _end_offsets(consumer: Consumer, topic: str) -> list[TopicPartition]:
    """End offset of every partition; empty while a freshly created topic is still electing its leaders."""
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return [
            TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in partitions
        ]
    except KafkaException:
        return []


def _cdc_topics(settings: Settings) -> list[str]:
    from streams.topics import cdc_topics, ensure_topics

    ensure_topics(settings)
    return cdc_topics(settings)


def position_at_end(settings: Settings, group: str) -> None:
    """Commit the end of every CDC topic for this consumer group: a worker in it reads only what comes after."""
    consumer = make_kafka_consumer(settings, group, **{"enable.auto.commit": False})
    try:
        positions = []
        for topic in _cdc_topics(settings):
            positions += wait_for(lambda t=topic: _end_offsets(consumer, t), timeout=60, what=f"leaders of {topic}")
        consumer.commit(offsets=positions, asynchronous=False)
    finally:
        consumer.close()


@contextlib.contextmanager
def isolated(
    settings: Settings, prefix: str = "ki-search-test", group_prefix: str | None = None
) -> Iterator[dict[str, str]]:
    """An index alias and a consumer group of the caller's own (environment overrides for children).

    The shared database may hold a large unsynced backlog (a demo corpus) that the shared consumer group
    works through for a long time. A worker with these overrides runs the real CDC path but in its own
    consumer group, positioned at the end of every CDC topic before it starts, so it projects exactly the
    rows written afterwards, into an index nobody else writes to. Both are removed afterwards.
    """
    uid = uuid.uuid4().hex[:8]
    env = {"KI_RETRIEVAL__INDEX_NAME": f"{prefix}-{uid}", "KI_STREAMS__APP_ID": f"{group_prefix or prefix}-{uid}"}
    group = env["KI_STREAMS__APP_ID"]
    # The content lane's group, and the principals lane's (a fast path: history is the access lane's work).
    for positioned in (group, f"{group}-principals"):
        position_at_end(settings, positioned)
    try:
        yield env
    finally:
        client = make_sync_client(settings, timeout_s=30)
        client.indices.delete(index=f"{env['KI_RETRIEVAL__INDEX_NAME']}--*", ignore_unavailable=True)
        admin = make_kafka_admin(settings)
        groups = [group, *(f"{group}-{lane}" for lane in LANES if lane != "content")]
        for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
            with contextlib.suppress(Exception):  # best effort; a leftover empty group is harmless
                future.result(timeout=60)


@contextlib.contextmanager
def synced_api(
    settings: Settings, prefix: str, name: str, lane: str | None = None, **server_env: str
) -> Iterator[tuple[Server, SyncWorker, dict[str, str]]]:
    """An isolated index and consumer group (`isolated`), a sync worker on it (both lanes, or `lane` only) and
    an API over it that reads the worker's lanes for its dashboard; stopped and removed afterwards. Yields
    (server, worker, isolation env)."""
    with isolated(settings, prefix=prefix) as env:
        worker = SyncWorker(env, lane)
        worker.start()
        server = Server(name, **env, **worker.lane_env, **server_env)
        try:
            server.start()
            yield server, worker, env
        finally:
            server.stop()
            worker.stop()


class RerankGateway:
    """A real OpenAI-compatible chat-completions server (aiohttp) on a free port, in a thread of its own.

    It is the external rerank gateway, not one of the stack's services. `mode`:
    * "reverse": scores passage i (0-based) with i, leaving passage 0 unscored, so the prefix comes back
      reversed with the fused leader last;
    * "error": HTTP 500; "garbage": HTTP 200 with a reply that is not the JSON asked for;
    * after `hold()`: requests wait until `release()`, then answer as "reverse".
    Every request (headers and JSON body) is kept in `requests`.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.mode = "reverse"
        self.requests: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._released: asyncio.Event | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        if self.mode == "hold":
            assert self._released is not None
            await self._released.wait()
        if self.mode == "error":
            return web.json_response({"error": {"message": "upstream model crashed"}}, status=500)
        content = "I think passage 2 is best."
        if self.mode in ("reverse", "hold"):
            items = json.loads(body["messages"][1]["content"])["passages"]
            content = json.dumps({"scores": {p["id"]: float(i) for i, p in enumerate(items) if i > 0}})
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})

    def start(self) -> None:
        started = threading.Event()

        async def run() -> None:
            self._released = asyncio.Event()
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            started.set()

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(run())
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=main, name="rerank-gateway", daemon=True)
        self._thread.start()
        assert started.wait(30), "rerank gateway did not start"

    def hold(self) -> None:
        self.mode = "hold"

    def release(self) -> None:
        assert self._loop is not None and self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    def stop(self) -> None:
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        loop, runner = self._loop, self._runner

        async def shutdown() -> None:
            if runner is not None:
                await runner.cleanup()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self._thread.join(30)


def wait_until_indexed(server: Server, settings: Settings, projects: list[int], documents: set[int], what: str) -> None:
    """Poll metadata-only search as an administrator until every one of `documents` is in the index, then
    until none of their rows waits for its vector (rows are written text first; tests rank with all legs)."""
    from search.web.auth import mint_token

    admin = mint_token(settings.api, "root", roles=["admin"])

    def indexed() -> bool:
        status, body = server.call("/v1/search/filter", {"limit": 50, "filters": {"project_id": projects}}, admin)
        return status == 200 and {h["document_id"] for h in body["hits"]} >= documents

    wait_for(indexed, timeout=120, what=what)
    index = load_settings(environ={**os.environ, **server.process.env}).retrieval.index_name
    wait_until_vectored(settings, index, {"terms": {"document_id": [str(d) for d in documents]}}, what)


def wait_until_vectored(settings: Settings, index: str, query: dict[str, Any], what: str) -> None:
    """Until no row that `query` matches waits for its vector: rows are written text first, and a test that
    ranks with every leg, or compares scores, needs the semantic leg to see them all. Then the index is
    merged to one segment: each text row overwritten with its vector left a deleted document behind, which
    Lucene's BM25 statistics count until a merge, and tests that expect an exact order need exact scores."""
    search = make_sync_client(settings, timeout_s=30)
    waiting = {"bool": {"filter": [query, {"exists": {"field": "vector_pending"}}]}}

    def vectored() -> bool:
        search.indices.refresh(index=index)
        return search.count(index=index, body={"query": waiting})["count"] == 0

    try:
        wait_for(vectored, timeout=240, what=f"{what}: every row with its vector")
        search.indices.forcemerge(index=index, max_num_segments=1)
        search.indices.refresh(index=index)
    finally:
        search.close()


def remove_world(engine: Any, projects: list[int], sources: list[int]) -> None:
    """Delete a test world's projects (and everything below them) and sources."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM projects WHERE id = ANY(:p)"), {"p": projects})
        conn.execute(text("DELETE FROM sources WHERE id = ANY(:s)"), {"s": sources})
