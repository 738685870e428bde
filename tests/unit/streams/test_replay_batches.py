"""`streams.replay.project_in_batches`: batches in flight at once, progress in order, failures cancel the rest.

The projector is a stand-in that records what it is asked; what is tested is the batching around it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.replay import project_in_batches
from streams.sync import SyncStats


class _Recorder:
    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.running = self.most_running = 0
        self.fail_on = fail_on
        self.cancelled = 0

    async def project_versions(self, ids: list[int]) -> SyncStats:
        self.batches.append(ids)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            for _ in range(3):  # yield to the loop, so batches in flight really overlap
                await asyncio.sleep(0)
            if self.fail_on is not None and self.fail_on in ids:
                raise RuntimeError(f"version {self.fail_on} failed")
            return SyncStats(versions_projected=len(ids), rows_written=10 * len(ids), seconds={"write": 0.5})
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


def test_batches_overlap_up_to_the_bound_and_progress_counts_in_order() -> None:
    projector, progress = _Recorder(), []

    def on_progress(unit: str, done: int, total: int) -> None:
        progress.append((unit, done, total))

    stats = asyncio.run(project_in_batches(projector, set(range(10)), on_progress, batch=3, in_flight=2))  # type: ignore[arg-type]
    assert projector.batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert projector.most_running == 2
    assert progress == [("versions", n, 10) for n in (0, 3, 6, 9, 10)]
    assert (stats.versions_projected, stats.rows_written, stats.seconds) == (10, 100, {"write": 2.0})


def test_one_in_flight_projects_one_batch_at_a_time() -> None:
    projector = _Recorder()
    asyncio.run(project_in_batches(projector, set(range(7)), lambda *a: None, batch=2, in_flight=1))  # type: ignore[arg-type]
    assert projector.most_running == 1 and len(projector.batches) == 4


def test_a_failed_batch_fails_the_run_and_cancels_the_batch_in_flight() -> None:
    projector: Any = _Recorder(fail_on=0)
    with pytest.raises(RuntimeError, match="version 0 failed"):
        asyncio.run(project_in_batches(projector, set(range(9)), lambda *a: None, batch=3, in_flight=2))
    assert projector.batches == [[0, 1, 2], [3, 4, 5]]  # nothing started after the failure
    assert projector.running == 0  # and the batch in flight did not outlive the run
