"""Fault: OpenSearch stopped for 30 s while row changes stream in.

Injected: `ki stack stop opensearch` while a change stream writes ~20 row changes/s; 30 s later
`ki stack start opensearch`. Observed: the worker stays up, retries with backoff, and the consumer
group's committed offsets never pass the log end taken the moment OpenSearch went away (nothing written
after that can have been applied); once OpenSearch is back every change is applied and the index equals a
clean rebuild. A second test stops (SIGTERM) the worker during an outage: it must commit nothing it did not
apply. Takes ~105 s + ~75 s on the 2-core reference machine (each restart of OpenSearch ~25-35 s).
"""

from __future__ import annotations

import time

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from ki.settings import Settings
from tests.conftest import wait_for
from tests.integration.change_stream import ChangeStream, make_fault_world
from tests.integration.sync_harness import (
    Worker,
    assert_index_equals_rebuild,
    committed_offsets,
    end_offsets,
    start,
    stop,
    wait_until_synced,
)

pytestmark = [pytest.mark.stack, pytest.mark.faults]

OUTAGE_S = 30.0


def test_opensearch_down_for_30_s_pauses_the_sync_without_committing_and_loses_nothing(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    world = make_fault_world(engine)
    worker = Worker(settings, name="fault-opensearch-worker")
    worker.start()
    try:
        wait_until_synced(settings, engine)
        stream = ChangeStream(engine, world, rate=20).start()
        try:
            stream.wait_for_more(40)  # changes are flowing through the worker
            stop(settings, "opensearch")
            try:
                # Every event at or past these offsets was written while OpenSearch was away: none of
                # them can have been applied, so no committed offset may pass them.
                bound = end_offsets(settings)
                retries_before = worker.counter("ki_sync_retries_total")
                ends = bound
                # The fault is "down for 30 s": a fixed duration, during which the offsets are polled.
                outage_ends = time.monotonic() + OUTAGE_S
                while time.monotonic() < outage_ends:
                    committed = committed_offsets(settings)
                    early = {tp: (c, bound.get(tp, 0)) for tp, c in committed.items() if c > bound.get(tp, 0)}
                    assert not early, f"offsets committed past events OpenSearch never acknowledged: {early}"
                    assert worker.alive, f"the worker died while OpenSearch was down; see {worker.log_path}"
                    ends = end_offsets(settings)
                    time.sleep(1.0)  # polling interval within the fixed outage
                retries = worker.counter("ki_sync_retries_total") - retries_before
            finally:
                start(settings, "opensearch")
            assert any(ends[tp] > bound.get(tp, 0) for tp in ends), "no change was written during the outage"
            # Backed off, not spinning: each lane's delay doubles from 0.5 s to 15 s (and each attempt
            # already retries its request with backoff), so a 30 s outage costs a handful of rounds per lane.
            assert 1 <= retries <= 15 * len(worker.lanes), f"{retries} sync retries during a {OUTAGE_S:.0f}s outage"
            stream.wait_for_more(40)  # and the stream goes on after the restart
        finally:
            counts = stream.stop()
        wait_until_synced(settings, engine)
        assert worker.alive, f"the worker died; see {worker.log_path}"
    finally:
        worker.stop()
    assert_index_equals_rebuild(settings, engine, search, world.documents)
    assert counts["content edit"] and counts["grant added"] and counts["member joined"]


def test_a_worker_stopped_while_opensearch_is_down_commits_nothing_it_did_not_apply(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    """SIGTERM (a deploy, a scale-down) while the batch waits for OpenSearch: Faust's batching acked the
    batch on the way out and committed it on stop, so the change was lost. Now it stays uncommitted and
    the next worker applies it."""
    world = make_fault_world(engine, documents=2)
    worker = Worker(settings, name="fault-opensearch-worker")
    worker.start()
    try:
        wait_until_synced(settings, engine)
        stop(settings, "opensearch")
        try:
            bound = end_offsets(settings)
            retries_before = worker.counter("ki_sync_retries_total")
            ChangeStream(engine, world, seed=61, limit=5).start().stop_when_done()
            wait_for(
                lambda: worker.counter("ki_sync_retries_total") > retries_before,
                timeout=60,
                what="the worker to fail on the missing OpenSearch and back off",
            )
            worker.stop()
            assert worker.returncode is not None
            early = {tp: (c, bound.get(tp, 0)) for tp, c in committed_offsets(settings).items() if c > bound.get(tp, 0)}
            assert not early, f"a stopping worker committed events it never applied: {early}"
        finally:
            start(settings, "opensearch")
        worker.start()  # its successor
        wait_until_synced(settings, engine)
    finally:
        worker.stop()
    assert_index_equals_rebuild(settings, engine, search, world.documents)
