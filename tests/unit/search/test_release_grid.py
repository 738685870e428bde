"""The release grid (search.ports.SqlReader.on_the_grid): an answer, or an error, never leaves before the next
multiple of the quantum from the start, whichever grid (the reads' 25 ms, the searches' own) it is on."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ki.settings import load_settings
from search.ports import SqlReader


def _reader(**environ: str) -> SqlReader:
    none: Any = None  # no engine: the grid reads only the settings
    return SqlReader(load_settings(environ=environ), none, none)


async def _timed(reader: SqlReader, work_s: float, quantum_ms: float | None, fail: bool = False) -> float:
    async def work() -> str:
        await asyncio.sleep(work_s)
        if fail:
            raise LookupError("refused")
        return "answer"

    started = time.perf_counter()
    try:
        assert await reader.on_the_grid(work(), quantum_ms) == "answer"
    except LookupError:
        assert fail
    return time.perf_counter() - started


@pytest.mark.parametrize(("work_s", "points"), [(0.0, 1), (0.012, 2), (0.031, 4)])
def test_an_answer_leaves_no_earlier_than_the_next_point_of_the_search_grid(work_s: float, points: int) -> None:
    elapsed = asyncio.run(_timed(_reader(), work_s, 10.0))
    assert elapsed >= points * 0.010


def test_the_reads_grid_is_the_default_and_an_error_waits_for_it_too() -> None:
    reader = _reader(KI_API__LIMITS__RELEASE_QUANTUM_MS="30")
    assert asyncio.run(_timed(reader, 0.0, None, fail=True)) >= 0.030
    assert asyncio.run(_timed(reader, 0.0, None)) >= 0.030


def test_a_zero_quantum_answers_at_once() -> None:
    reader = _reader()
    elapsed = asyncio.run(_timed(reader, 0.0, 0.0))
    assert elapsed < 1.0  # no grid: nothing to wait for (a generous bound, not a timing figure)


def test_the_search_grid_has_its_own_setting() -> None:
    limits = load_settings(environ={"KI_API__LIMITS__SEARCH_RELEASE_QUANTUM_MS": "7.5"}).api.limits
    assert limits.search_release_quantum_ms == 7.5
    assert load_settings(environ={}).api.limits.search_release_quantum_ms == 5.0
