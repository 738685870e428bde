"""Faults: OpenSearch under pressure -- the index turns read-only (a full disk's flood stage), and `_bulk`
answered 429 (back-pressure) -- while changes come in.

Read-only:

Injected: `index.blocks.read_only_allow_delete: true` on an isolated index, the block OpenSearch itself sets
on every index of a node whose disk is past `cluster.routing.allocation.disk.watermark.flood_stage` (2.x
answers writes with 429 `cluster_block_exception`, "disk usage exceeded flood-stage watermark"). Set per
index, not by lowering the watermarks: those are per node, so on the one-node test stack they would block
every index -- the session worker's, other tests', OpenSearch's own -- and OpenSearch only lifts the block
on its next disk check after the watermarks are put back (`cluster.info.update.interval`, 30 s). A second
run sets an operator's `index.blocks.write` instead (answered 403): before, that was a permanent failure and
the lanes dead-lettered their batches after `streams.max_attempts`.

Observed: every lane pauses instead of failing -- `/healthz` answers 200 `paused` with the reason (not a
stall: the supervisor must not restart them in a loop), `ki_sync_lane_paused{reason="index_read_only"}` is 1,
nothing is dead-lettered although `streams.max_attempts` is 1, and no offset is committed past the changes
written while the index was read-only. Lifting the block (OpenSearch does so itself once the disk is below
the high watermark) resumes them by themselves: every change lands and the index equals a clean rebuild.

Back-pressure: shard indexing pressure (dynamic cluster settings, unlike the write thread pool's queue size
and `indexing_pressure.memory.limit`, which are static) set so that it rejects every `_bulk` on a shard after
that shard's first success, with 429 `rejected_execution_exception`: on demand, at once, and lifted at once.
It is per node (every index of the one-node stack for the few seconds it is on; always reset, transient, so a
cluster restart drops it too). Observed: the lanes retry with backoff (`ki_sync_throttled_total`) instead of
failing, nothing is dead-lettered although `streams.max_attempts` is 1, nothing lands while it lasts, and once
it is lifted every change lands and the index equals a clean rebuild.

Isolated: an index alias and consumer group of its own, and an embedding endpoint in this process (a
fixed vector per text) so the content lane needs no model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opensearchpy import OpenSearch, TransportError
from sqlalchemy import Engine

from ki import exposition
from ki.settings import Settings, load_settings
from tests.conftest import wait_for
from tests.integration.search_harness import SyncWorker, isolated, position_at_end, remove_world
from tests.integration.sync_harness import (
    assert_index_equals_rebuild,
    committed_offsets,
    dump,
    end_offsets,
    worker_lag,
)
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.faults]

DIMENSIONS = 16
# The flood stage's block (2.x answers 429 cluster_block_exception), and an operator's write block (403): the
# latter was a permanent failure, so its batch went to the dead-letter topic after `streams.max_attempts`.
BLOCKS = ["index.blocks.read_only_allow_delete", "index.blocks.write"]
DISK_MONITOR = "cluster.routing.allocation.disk.threshold_enabled"
PRIMER = "pressure-test-primer"


class Embeddings(BaseHTTPRequestHandler):
    """`POST /v1/embeddings`: a fixed vector per text (its length decides the first component)."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = [{"index": i, "embedding": [1.0 + (len(t) % 7) / 10] + [1.0] * (DIMENSIONS - 1)}
                for i, t in enumerate(body["input"])]  # fmt: skip
        raw = json.dumps({"data": data, "model": body.get("model")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def env(settings: Settings) -> Iterator[dict[str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Embeddings)
    threading.Thread(target=server.serve_forever, name="read-only-test-embeddings", daemon=True).start()
    try:
        with isolated(settings, prefix="ki-read-only-test") as isolation:
            # `isolated` positions the content and principals lanes' groups; the access lane has its own, which
            # would otherwise read every change the stack ever captured into this index.
            access_group = f"{isolation['KI_STREAMS__APP_ID']}-access"
            position_at_end(settings, access_group)
            yield {
                **isolation,
                "KI_EMBEDDING__PROVIDER": "openai",
                "KI_EMBEDDING__URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
                "KI_EMBEDDING__MODEL": "read-only-test",
                "KI_RETRIEVAL__EMBEDDING_DIMENSIONS": str(DIMENSIONS),
                # One permanent failure would dead-letter a batch at once: a block must not be one.
                "KI_STREAMS__MAX_ATTEMPTS": "1",
            }  # `isolated` removes every lane's group afterwards
    finally:
        server.shutdown()


def health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def metric(port: int, name: str, **labels: str) -> float:
    samples = exposition.scrape(f"http://127.0.0.1:{port}/metrics", timeout_s=30)
    return exposition.total(samples, name, exposition.having(**labels))


def versions_indexed(search: OpenSearch, alias: str) -> set[int]:
    if not search.indices.exists_alias(name=alias):
        return set()  # the worker creates it with its first batch
    search.indices.refresh(index=alias)
    body = {"size": 1000, "_source": ["document_version_id"]}
    return {int(h["_source"]["document_version_id"]) for h in search.search(index=alias, body=body)["hits"]["hits"]}


@pytest.mark.parametrize("block", BLOCKS, ids=["flood-stage", "write-block"])
def test_a_read_only_index_pauses_every_lane_dead_letters_nothing_and_they_resume_when_it_is_lifted(
    block: str, env: dict[str, str], engine: Engine, search: OpenSearch
) -> None:
    ours = load_settings(environ={**os.environ, **env})  # the isolated index and consumer groups
    alias = ours.retrieval.index_name
    worker = SyncWorker(env)
    worker.start()
    lanes = dict(worker.ports)
    with engine.begin() as conn:
        w = World(conn)
        project, source = w.project("Schreibschutz"), w.source("local_fs")
        obj = w.source_object(source)
        w.grant("project", project, f"user:anna-{w.tag}")
        first_doc = w.document(project, f"Vorher {w.tag}")
        first = w.version(first_doc, "Der Mietvertrag wurde vor dem Schreibschutz geschlossen.")
        w.observe(first, obj)
    documents = {first_doc}
    try:
        wait_for(lambda: first in versions_indexed(search, alias) or None, timeout=120, what="the first version")
        # OpenSearch's disk monitor lifts a flood-stage block by itself on its next disk check (every 30 s)
        # when the disk is below the high watermark -- as this one is: off while the block is ours.
        search.cluster.put_settings(body={"transient": {DISK_MONITOR: False}})
        search.indices.put_settings(index=alias, body={block: True})
        try:
            before = end_offsets(ours)  # every change from here on meets the read-only index
            with engine.begin() as conn:
                w = World(conn, tag=w.tag)
                w.grant("project", project, f"user:bert-{w.tag}")  # the access lane's
                second_doc = w.document(project, f"Während {w.tag}")
                second = w.version(second_doc, "Diese Fassung entstand, als die Platte voll war.")  # the content lane's
                w.observe(second, obj)
            documents.add(second_doc)

            def paused(lane: str) -> dict[str, Any] | None:
                status, body = health(lanes[lane])
                return body if status == 200 and body["status"] == "paused" else None

            for lane, port in lanes.items():
                body = wait_for(lambda lane=lane: paused(lane), timeout=120, what=f"the {lane} lane to pause")
                assert "index read-only" in body["paused"], body
                assert metric(port, "ki_sync_lane_paused", lane=lane, reason="index_read_only") == 1
            # What an operator reads: `ki sync status` says each lane's worker is paused, and why.
            status = subprocess.run([sys.executable, "-m", "apps.cli", "sync", "status"],
                                    env={**os.environ, **env, **worker.lane_env}, capture_output=True, text=True,
                                    timeout=120)  # fmt: skip
            workers = [line.strip() for line in status.stdout.splitlines() if line.strip().startswith("worker:")]
            assert len(workers) == len(lanes) and all(w.startswith("worker: paused (") for w in workers), status.stdout
            # Paused, not failing: nothing dead-lettered, nothing written, nothing committed past the block.
            assert sum(metric(port, "ki_sync_dlq_events_total") for port in lanes.values()) == 0
            assert versions_indexed(search, alias) == {first}
            early = {tp: (c, before[tp]) for tp, c in committed_offsets(ours).items() if c > before.get(tp, 0)}
            assert not early, f"offsets committed past changes the read-only index never took: {early}"
            assert worker.process.alive, f"the worker died; see {worker.log_path}"
        finally:
            # What OpenSearch does itself once the disk is below the high watermark again.
            search.indices.put_settings(index=alias, body={block: None})
            search.cluster.put_settings(body={"transient": {DISK_MONITOR: None}})

        def resumed() -> bool:
            ok = all(health(port)[1]["status"] == "ok" for port in lanes.values())
            return ok and second in versions_indexed(search, alias)

        wait_for(resumed, timeout=120, what="every lane to resume and the change written meanwhile to land")
        for lane, port in lanes.items():
            assert metric(port, "ki_sync_lane_paused", lane=lane, reason="index_read_only") == 0
        assert sum(metric(port, "ki_sync_dlq_events_total") for port in lanes.values()) == 0
        # The grant the access lane held through the pause is on every row too.
        rows = dump(search, alias, documents)
        assert rows and all(f"user:bert-{w.tag}" in row["allowed_principals"] for row in rows.values()), rows
        wait_for(lambda: not any(p.lag for p in worker_lag(ours).values()), timeout=120, what="every change committed")
        assert_index_equals_rebuild(ours, engine, search, documents)
    finally:
        worker.stop()
        remove_world(engine, [project], [source])


# Shard indexing pressure set to reject every `_bulk` on a shard that already took one: the shard's limit is
# "breached" at any occupancy (upper operating factor 0), the node always "under strain" (soft limit 0), and
# the secondary check (time since the last success > 0 ms, outstanding requests > -1) always holds.
REJECT_EVERY_BULK = {
    "shard_indexing_pressure.enabled": True,
    "shard_indexing_pressure.enforced": True,
    "shard_indexing_pressure.operating_factor.upper": 0.0,
    "shard_indexing_pressure.primary_parameter.node.soft_limit": 0.0,
    "shard_indexing_pressure.secondary_parameter.successful_request.elapsed_timeout": "0ms",
    "shard_indexing_pressure.secondary_parameter.successful_request.max_outstanding_requests": -1,
}


def test_bulk_rejected_with_429_slows_the_lanes_dead_letters_nothing_and_every_change_lands(
    env: dict[str, str], engine: Engine, search: OpenSearch
) -> None:
    ours = load_settings(environ={**os.environ, **env})
    alias = ours.retrieval.index_name
    worker = SyncWorker(env)
    worker.start()
    lanes = dict(worker.ports)
    with engine.begin() as conn:
        w = World(conn)
        project, source = w.project("Gegendruck"), w.source("local_fs")
        obj = w.source_object(source)
        w.grant("project", project, f"user:anna-{w.tag}")
        first_doc = w.document(project, f"Vorher {w.tag}")
        first = w.version(first_doc, "Der Kaufvertrag wurde vor dem Gegendruck geschlossen.")
        w.observe(first, obj)
    documents = {first_doc}
    try:
        wait_for(lambda: first in versions_indexed(search, alias) or None, timeout=120, what="the first version")
        (physical,) = search.indices.get_alias(name=alias)
        search.cluster.put_settings(body={"transient": REJECT_EVERY_BULK})
        try:
            # The shard's first success under these settings is ours, a row of no version (removed below): the
            # two lanes' writes can arrive together, both count as the first, and then nothing is rejected.
            try:
                search.index(index=physical, id=PRIMER, body={"document_version_id": "-1"})
            except TransportError as exc:  # a lane's write came first: rejecting already
                if exc.status_code != 429:
                    raise
            throttled_before = sum(metric(port, "ki_sync_throttled_total") for port in lanes.values())
            with engine.begin() as conn:
                w = World(conn, tag=w.tag)
                w.grant("project", project, f"user:bert-{w.tag}")
                second_doc = w.document(project, f"Während {w.tag}")
                second = w.version(second_doc, "Diese Fassung entstand, als OpenSearch sich wehrte.")
                w.observe(second, obj)
            documents.add(second_doc)
            wait_for(
                lambda: sum(metric(port, "ki_sync_throttled_total") for port in lanes.values()) > throttled_before,
                timeout=120,
                what="a lane to be pushed back (429 after the writer's retries) and back off",
            )
            assert sum(metric(port, "ki_sync_dlq_events_total") for port in lanes.values()) == 0
            for port in lanes.values():  # slowed down, not paused, not stalled
                status, body = health(port)
                assert status == 200 and body["status"] == "ok", body
            assert worker.process.alive, f"the worker died; see {worker.log_path}"
        finally:
            search.cluster.put_settings(body={"transient": dict.fromkeys(REJECT_EVERY_BULK)})
            search.delete(index=physical, id=PRIMER, refresh=True, ignore=404)
        wait_for(lambda: second in versions_indexed(search, alias) or None, timeout=120, what="the change to land")
        wait_for(lambda: not any(p.lag for p in worker_lag(ours).values()), timeout=120, what="every change committed")
        assert sum(metric(port, "ki_sync_dlq_events_total") for port in lanes.values()) == 0
        rows = dump(search, alias, documents)
        assert rows and all(f"user:bert-{w.tag}" in row["allowed_principals"] for row in rows.values()), rows
        assert_index_equals_rebuild(ours, engine, search, documents)
    finally:
        worker.stop()
        remove_world(engine, [project], [source])
