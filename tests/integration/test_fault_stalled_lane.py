"""Faults: a sync lane that stops making progress (issue 51, item 1).

A lane stopped with SIGSTOP keeps its process but fetches nothing; past its session timeout the broker drops it
from its group, and before this test's change nothing noticed: the supervisor only acted on a child that exited.
Here `ki sync run`'s access lane is stopped while access changes stream in; the supervisor finds it no longer
answering its `/healthz` for `streams.stall_after_s`, kills it and starts another, which catches up: every
change is in the index, which equals a clean rebuild. Takes ~60 s (the stopped member's session expires first).
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from ki.settings import Settings
from tests.conftest import wait_for
from tests.integration.change_stream import ChangeStream, make_fault_world
from tests.integration.sync_harness import Worker, assert_index_equals_rebuild, wait_until_synced

pytestmark = [pytest.mark.stack, pytest.mark.faults]

STALL_AFTER_S = 8


def test_a_stopped_lane_is_restarted_by_the_supervisor_and_loses_nothing(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    world = make_fault_world(engine, documents=8)
    liveness = {"KI_STREAMS__STALL_AFTER_S": str(STALL_AFTER_S), "KI_STREAMS__LIVENESS_INTERVAL_S": "1"}
    worker = Worker(settings, name="fault-stalled-worker", env=liveness)
    worker.start()
    stopped: int | None = None
    try:
        wait_until_synced(settings, engine)
        stopped = wait_for(lambda: worker.lane_pid("access"), timeout=30, what="the access lane's process")
        os.kill(stopped, signal.SIGSTOP)
        stream = ChangeStream(engine, world, rate=10, seed=51).start()
        try:
            restarted = wait_for(
                lambda: (pid := worker.lane_pid("access")) not in (None, stopped) and pid,
                timeout=120,
                interval=0.5,
                what="the supervisor to replace the stopped access lane",
            )
            stream.wait_for_more(20)  # changes written after the restart reach the new lane too
        finally:
            counts = stream.stop()
        wait_until_synced(settings, engine)
        assert worker.alive and worker.lane_pid("access") == restarted, worker.log_tail()
        log = worker.log_path.read_text(errors="replace")
        assert f"the access lane (pid {stopped}) made no progress (no answer for" in log, worker.log_tail()
        assert worker.lane_pid("content") is not None  # the other lane ran on undisturbed
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):  # replaced: gone already
                os.kill(stopped, signal.SIGCONT)
        worker.stop()
    print(f"{sum(counts.values())} row changes {dict(counts)} while the access lane was stopped and replaced")
    assert sum(counts.values()) >= 20
    assert_index_equals_rebuild(settings, engine, search, set(world.versions))
