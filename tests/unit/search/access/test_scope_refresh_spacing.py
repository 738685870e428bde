"""Background compiles of a stale scope are spaced by their own cost (search.stages.scope)."""

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
from search.stages.scope import REFRESH_SPACING, ScopeStage, refresh_not_before
from search.telemetry.metrics import SearchMetrics

PRINCIPALS = ["user:anna"]


def test_the_next_compile_waits_a_multiple_of_the_last_ones_cost_at_most_half_the_stale_window() -> None:
    assert refresh_not_before(100.0, 0.3, 5.0) == pytest.approx(100.0 + REFRESH_SPACING * 0.3)
    assert refresh_not_before(100.0, 4.0, 5.0) == pytest.approx(102.5)  # a slow compile: half of scope_stale_s
    assert refresh_not_before(100.0, 0.3, 0.0) == 100.0  # stale answers off: nothing to space


class _Sql:
    """Counts the scope compiles (no PostgreSQL: the stage's bookkeeping is under test, not the statement)."""

    def __init__(self, clock: list[float]) -> None:
        self.compiles = 0
        self.clock = clock

    async def read(self, work: Callable[[Any], Any]) -> tuple[CompiledScope, Caller]:
        self.compiles += 1
        self.clock[0] += 0.5  # each compile takes half a second on the stage's clock
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


def test_a_scope_kept_stale_by_changes_is_compiled_once_per_spacing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(scope_stage, "time", _Clock(clock))  # the stage's clock only, not asyncio's
    settings = load_settings(environ={})
    sql, background, cache = _Sql(clock), _Background(), ScopeCache(100, 1_000_000)
    stage = ScopeStage(settings, sql, SearchMetrics(), background, cache, _Feed())  # type: ignore[arg-type]

    async def searches() -> list[int]:
        await stage.compile(PRINCIPALS, None)  # a miss: compiled in the request
        compiles = [sql.compiles]
        for _ in range(8):  # an import marks every scope stale between any two searches, 0.1 s apart
            cache.apply(_everything())
            await stage.compile(PRINCIPALS, None)
            await background.drain()
            compiles.append(sql.compiles)
            clock[0] += 0.1
        return compiles

    compiles = asyncio.run(searches())
    # The first stale hit compiles again (0.5 s), the next may start REFRESH_SPACING * 0.5 = 1.5 s after it ended:
    # hits 2-8 come 0.1 s apart and fall inside that window.
    assert compiles == [1, 2, 2, 2, 2, 2, 2, 2, 2]
    clock[0] += REFRESH_SPACING * 0.5
    cache.apply(_everything())
    asyncio.run(_search_and_drain(stage, background))
    assert sql.compiles == 3  # past the spacing: compiled again


async def _search_and_drain(stage: ScopeStage, background: _Background) -> None:
    await stage.compile(PRINCIPALS, None)
    await background.drain()


def _everything() -> Invalidation:
    return Invalidation(scopes="all")
