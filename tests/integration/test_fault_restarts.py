"""Faults: the Kafka broker, Kafka Connect (Debezium) and PostgreSQL each restarted mid-stream.

Injected, one service per test: `ki stack stop <service>` then `ki stack start <service>` while a change
stream writes ~20 row changes/s (it retries a change whose transaction failed while PostgreSQL was away).
Observed: the one worker started for the module and the Debezium connector carry on by themselves (no
restart, no re-registration), every change committed in PostgreSQL reaches the index, and the index
equals a clean rebuild: no row lost, none extra or duplicated. Takes ~2 min on the 2-core reference
machine (~15 s set-up, ~30-35 s per service).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine

from apps.dev.stack.connector import Connector
from ki.settings import Settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.change_stream import ChangeStream, FaultWorld, make_fault_world
from tests.integration.search_harness import Server
from tests.integration.sync_harness import Worker, assert_index_equals_rebuild, start, stop, wait_until_synced
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.faults]


@pytest.fixture(scope="module")
def worker(settings: Settings) -> Iterator[Worker]:
    w = Worker(settings, name="fault-restart-worker")
    w.start()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def world(engine: Engine, worker: Worker, settings: Settings) -> FaultWorld:
    made = make_fault_world(engine)
    wait_until_synced(settings, engine)
    return made


def connector_running(settings: Settings) -> bool:
    state, tasks, _trace = Connector(settings).state()
    return state == "RUNNING" and bool(tasks) and all(t == "RUNNING" for t in tasks)


@pytest.mark.parametrize("service", ["kafka", "connect", "postgres"])
def test_sync_resumes_by_itself_after_a_restart_mid_stream(
    service: str, world: FaultWorld, worker: Worker, engine: Engine, search: OpenSearch, settings: Settings
) -> None:
    stream = ChangeStream(engine, world, rate=20, seed=hash(service) & 0xFFFF).start()
    try:
        stream.wait_for_more(30)
        stop(settings, service)
        start(settings, service)
        stream.wait_for_more(60)  # changes keep coming after the restart
    finally:
        counts = stream.stop()
    # Nobody restarts or re-registers anything: the connector recovers on its own...
    wait_for(lambda: connector_running(settings), timeout=120, what="the Debezium connector RUNNING again")
    # ...and everything committed in PostgreSQL reaches the index through the same worker.
    wait_until_synced(settings, engine)
    assert worker.alive, f"the worker died; see {worker.log_path}"
    assert_index_equals_rebuild(settings, engine, search, world.documents)
    assert sum(counts.values()) >= 90


def test_a_search_after_a_postgresql_restart_answers_as_before(
    world: FaultWorld, engine: Engine, settings: Settings
) -> None:
    """The API's re-verify connections are lent without a ping: one that the restart killed fails once and
    the read runs again on a fresh one, so the first search after the restart answers like the last before."""
    with engine.begin() as conn:
        w = World(conn)
        word = f"neustart{w.tag}"
        project = w.project("Neustart")
        doc = w.document(project, f"Vermerk {w.tag}")
        w.observe(w.version(doc, f"{word}: Die Frist beginnt mit Zugang.", status="final"), w.source_object(w.source()))
        w.grant("project", project, f"user:rita-{w.tag}")
    token = mint_token(settings.api, f"rita-{w.tag}")
    server = Server("restart-api")
    server.start()
    try:

        def answer() -> dict | None:
            status, body = server.call("/v1/search", {"query": word, "mode": "lexical"}, token)
            return body if status == 200 and body["hits"] else None

        before = wait_for(answer, timeout=90, what="the new document found through the API")
        assert [h["document_id"] for h in before["hits"]] == [doc]
        stop(settings, "postgres")
        start(settings, "postgres")
        status, after = server.call("/v1/search", {"query": word, "mode": "lexical"}, token)
        assert status == 200, after
        assert [h["document_id"] for h in after["hits"]] == [doc]
    finally:
        server.stop()
    wait_for(lambda: connector_running(settings), timeout=120, what="the Debezium connector RUNNING again")
