"""A scope compiled while a change arrived is kept, stale since its compile began (search.stages.scope with
search.access.scope_cache): under an import's stream of changes every compile races one, and refusing them all
left a broad caller compiling their scope in SQL on every search -- a miss whose time tells that something
changed, the signal stale answers exist to hide."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ki.acl import Caller
from ki.settings import load_settings
from search.access.invalidation import FeedHealth
from search.access.scope import CompiledScope
from search.access.scope_cache import Invalidation, ScopeCache
from search.stages import scope as scope_stage
from search.stages.scope import ScopeStage
from search.telemetry.metrics import SearchMetrics

PRINCIPALS = ["user:anna"]


class _Sql:
    """Counts the scope compiles (no PostgreSQL: the stage's bookkeeping is under test, not the statement). Each
    takes half a second, in whose middle an import's change marks every scope stale while `racing`."""

    def __init__(self, clock: list[float], cache: ScopeCache) -> None:
        self.compiles = 0
        self.clock, self.cache = clock, cache
        self.racing = True

    async def read(self, work: Callable[[Any], Any]) -> tuple[CompiledScope, Caller]:
        self.compiles += 1
        self.clock[0] += 0.25
        if self.racing:
            self.cache.apply(Invalidation(scopes="all"))
        self.clock[0] += 0.25
        return CompiledScope.of((1,), (10,), 65_536), Caller(frozenset(PRINCIPALS))


class _Clock:
    def __init__(self, now: list[float]) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now[0]

    def perf_counter(self) -> float:
        return self.now[0]


class _Feed:
    def health(self) -> FeedHealth:
        return FeedHealth(True, "ok", 0.0)


class _Background:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(work))

    async def drain(self) -> None:
        while self.tasks:
            await self.tasks.pop()


def test_scopes_compiled_while_changes_arrive_are_kept_stale_and_every_later_search_is_answered_from_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(scope_stage, "time", _Clock(clock))  # the stage's clock only, not asyncio's
    settings = load_settings(environ={})
    cache = ScopeCache(100, 1_000_000, clock=lambda: clock[0])
    sql, background, metrics = _Sql(clock, cache), _Background(), SearchMetrics()
    stage = ScopeStage(settings, sql, metrics, background, cache, _Feed())  # type: ignore[arg-type]
    key = ScopeCache.scope_key(Caller(frozenset(PRINCIPALS)), None)

    async def search() -> None:
        await stage.compile(PRINCIPALS, None)
        await background.drain()

    async def import_running() -> None:
        await search()  # a miss: compiled in the request, a change arriving meanwhile
        for _ in range(8):  # searches 0.1 s apart, a change between any two
            cache.apply(Invalidation(scopes="all"))
            await search()
            clock[0] += 0.1

    asyncio.run(import_running())
    counts = {r: metrics.scope_cache.labels(r)._value.get() for r in ("miss", "stale", "hit")}
    # Only the first search compiled in the request; each later one was answered from the raced (stale) entry
    # while the background compiled it again -- which raced a change too and was kept stale as well.
    assert counts == {"miss": 1, "stale": 8, "hit": 0}
    assert sql.compiles == 9
    assert cache.scope(key, settings.api.caches.scope_stale_s)[1], "a raced compile is never kept as fresh"

    sql.racing = False  # the import is over: the next background compile races nothing and is stored fresh
    asyncio.run(search())
    scope, stale = cache.scope(key, settings.api.caches.scope_stale_s)
    assert scope is not None and not stale
    asyncio.run(search())
    assert metrics.scope_cache.labels("hit")._value.get() == 1 and sql.compiles == 10


def test_a_raced_entry_is_answered_no_longer_than_the_stale_bound_from_when_its_compile_began(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(scope_stage, "time", _Clock(clock))
    settings = load_settings(environ={})
    cache = ScopeCache(100, 1_000_000, clock=lambda: clock[0])
    sql, background, metrics = _Sql(clock, cache), _Background(), SearchMetrics()
    stage = ScopeStage(settings, sql, metrics, background, cache, _Feed())  # type: ignore[arg-type]
    key = ScopeCache.scope_key(Caller(frozenset(PRINCIPALS)), None)
    began = clock[0]
    asyncio.run(stage.compile(PRINCIPALS, None))  # raced: kept stale since `began`
    bound = settings.api.caches.scope_stale_s
    clock[0] = began + bound - 0.01
    assert cache.scope(key, bound)[0] is not None
    clock[0] = began + bound + 0.01
    assert cache.scope(key, bound)[0] is None, "older than the stale bound, counted from the compile's start"
