"""Faults: sync workers killed with SIGKILL.

Each worker is `ki sync run`: an access lane and a content lane, each a process and a consumer group of
its own; SIGKILL of the worker kills both lanes. Injected: (3) one worker SIGKILLed ten times, each time
at a random moment 0–3 s after its successor started consuming, while a change stream writes ~25 row
changes/s (a few thousand in all: grants, memberships and observations, ~3 % content edits); (4) two
workers in one consumer group, the one holding every partition SIGKILLed while the group rebalances for
the other's arrival; (13) two workers with both lanes busy — access changes streaming and a content
backlog being embedded — one SIGKILLed mid-stream. Observed: after the last kill the surviving (or
restarted) worker catches up by itself and the index equals a clean rebuild — nothing lost, nothing
extra. The random seed is printed; set KI_FAULT_SEED to repeat a run's kill moments and change mix.
Takes ~140 s (3; each restarted worker waits out the killed one's 10 s session) and ~45 s (4) on the
2-core reference machine.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from confluent_kafka import ConsumerGroupState
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from ki.settings import Settings
from tests.conftest import wait_for
from tests.integration.change_stream import ChangeStream, make_fault_world
from tests.integration.sync_harness import GroupWatch, Worker, assert_index_equals_rebuild, wait_until_synced
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.faults]

KILLS = 10
REBALANCING = (ConsumerGroupState.PREPARING_REBALANCING, ConsumerGroupState.COMPLETING_REBALANCING)


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("KI_FAULT_SEED") or random.randrange(1 << 31))
    print(f"KI_FAULT_SEED={value}")
    return value


def consuming(worker: Worker) -> bool:
    return worker.counter("ki_sync_events_total") > 0


def test_a_worker_killed_ten_times_at_random_points_loses_nothing(
    engine: Engine, search: OpenSearch, settings: Settings, seed: int
) -> None:
    rng = random.Random(seed)
    world = make_fault_world(engine)
    worker = Worker(settings, name="fault-kill-worker")
    worker.start()
    kills: list[tuple[float, float]] = []  # (seconds after the worker started consuming, events it consumed)
    try:
        wait_until_synced(settings, engine)
        stream = ChangeStream(engine, world, rate=25, seed=seed).start()
        try:
            for n in range(KILLS):
                # A fresh worker consumes only once the broker has given it the partitions (the killed
                # one's session has to expire first); kill it at a random moment of its sync.
                wait_for(lambda: consuming(worker), timeout=120, interval=0.5, what=f"worker {n + 1} consuming")
                moment = rng.uniform(0.0, 3.0)
                time.sleep(moment)  # the injection's random moment, not a wait for a result
                consumed = worker.counter("ki_sync_events_total")
                worker.kill()
                kills.append((moment, consumed))
                worker.start()
            stream.wait_for_more(50)  # the last worker syncs changes that are still coming in
        finally:
            counts = stream.stop()
        wait_until_synced(settings, engine)
        assert worker.alive, f"the last worker died; see {worker.log_path}"
    finally:
        worker.stop()
    print(f"{sum(counts.values())} row changes {dict(counts)}; kills (moment s, events consumed): {kills}")
    assert len(kills) == KILLS and all(consumed > 0 for _moment, consumed in kills)
    assert sum(counts.values()) >= 2000, f"only {sum(counts.values())} row changes: not the sync of a few thousand"
    assert_index_equals_rebuild(settings, engine, search, world.documents)


def test_two_workers_one_killed_during_a_rebalance_lose_nothing(
    engine: Engine, search: OpenSearch, settings: Settings, seed: int
) -> None:
    world = make_fault_world(engine, documents=12)
    first = Worker(settings, name="fault-group-worker-1")
    second = Worker(settings, name="fault-group-worker-2")
    group = GroupWatch(settings)
    first.start()
    try:
        wait_until_synced(settings, engine)
        stream = ChangeStream(engine, world, rate=25, seed=seed).start()
        try:
            wait_for(lambda: consuming(first), timeout=60, interval=0.5, what="the first worker consuming")
            stream.wait_for_more(25)
            second.spawn()  # joining the group starts a rebalance
            state = wait_for(
                lambda: (s := group.state())[0] in REBALANCING and s,
                timeout=90,
                interval=0.05,
                what="the group to rebalance for the second worker",
            )
            first.kill()  # holds every partition, has a batch in flight, and is mid-rebalance
            second.wait_ready()
            wait_for(lambda: consuming(second), timeout=120, interval=0.5, what="the second worker taking over")
            stream.wait_for_more(50)
        finally:
            counts = stream.stop()
        wait_until_synced(settings, engine)
        assert second.alive, f"the second worker died; see {second.log_path}"
        # The killed member leaves the group when its session expires (`streams.session_timeout_s` after the kill),
        # which may be after the survivor has caught up.
        wait_for(
            lambda: group.state() == (ConsumerGroupState.STABLE, 1),
            timeout=3 * settings.streams.session_timeout_s,
            interval=0.2,
            what="the group to settle with the survivor alone",
        )
    finally:
        first.stop()
        second.stop()
    print(f"killed in group state {state}; {sum(counts.values())} row changes {dict(counts)}")
    assert_index_equals_rebuild(settings, engine, search, world.documents)


def backlog_text(n: int) -> str:
    return "\n\n".join(
        f"Abschnitt {i} des Gutachtens {n}: Die Sachverständige stellt fest, dass die Mängel am Dach auf eine "
        f"fehlerhafte Abdichtung zurückgehen und eine Nachbesserung binnen {i + 2} Wochen möglich ist." * 3
        for i in range(12)
    )


def test_two_workers_with_both_lanes_busy_one_killed_during_a_content_backlog_lose_nothing(
    engine: Engine, search: OpenSearch, settings: Settings, seed: int
) -> None:
    world = make_fault_world(engine, documents=12)
    first, second = Worker(settings, name="lanes-kill-worker-1"), Worker(settings, name="lanes-kill-worker-2")
    first.start()
    second.start()
    try:
        wait_until_synced(settings, engine)
        stream = ChangeStream(engine, world, rate=25, seed=seed).start()
        try:
            with engine.begin() as conn:  # a content backlog: every one of these chunks must be embedded
                w = World(conn)
                backlog = [w.document(world.project, f"Gutachten {n} {world.tag}") for n in range(8)]
                for n, doc in enumerate(backlog):
                    w.version(doc, backlog_text(n))
            stream.wait_for_more(25)
            wait_for(
                lambda: indexed_documents(search, settings, backlog) >= 1,
                timeout=180,
                interval=0.5,
                what="the content lanes writing the backlog",
            )
            assert indexed_documents(search, settings, backlog) < len(backlog), "the backlog drained before the kill"
            first.kill()  # both its lanes, mid-stream, with access batches and an embedding micro-batch in flight
            stream.wait_for_more(50)
        finally:
            counts = stream.stop()
        wait_until_synced(settings, engine)
        assert second.alive, f"the surviving worker died; see {second.log_path}"
    finally:
        first.stop()
        second.stop()
    print(f"{sum(counts.values())} row changes {dict(counts)} beside a backlog of {len(backlog)} documents")
    assert indexed_documents(search, settings, backlog) == len(backlog)
    assert_index_equals_rebuild(settings, engine, search, world.documents | set(backlog))


def indexed_documents(search: OpenSearch, settings: Settings, documents: list[int]) -> int:
    """Documents with a row that has its vector: the content lanes' progress (the access lanes write every
    document's text at once, rows without vectors)."""
    alias = settings.retrieval.index_name
    search.indices.refresh(index=alias)
    body = {
        "size": 0,
        "query": {
            "bool": {
                "filter": {"terms": {"document_id": [str(d) for d in documents]}},
                "must_not": {"exists": {"field": "vector_pending"}},
            }
        },
        "aggs": {"docs": {"cardinality": {"field": "document_id"}}},
    }
    return int(search.search(index=alias, body=body)["aggregations"]["docs"]["value"])
