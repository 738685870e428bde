"""`ki dlq` against the real stack: a version whose text the embedder refuses is dead-lettered by the content lane,
`ki dlq list` shows it with its reason, a replay before the fix fails and leaves it waiting, the fix and a replay
index it through the projector (nothing else in the index moves), a drop needs a reason, and the operations log
holds every row. The lane's DLQ gauges follow.

Isolated: an index, a consumer group and a DLQ topic of its own, and an embedding endpoint (OpenAI-compatible,
in this process) that answers HTTP 400 for any text holding a refused word: the embedder's permanent refusal.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.cli import main
from ki import exposition
from ki.clients import make_kafka_admin
from ki.settings import Settings, load_settings
from streams.status import consumer_lag
from tests.conftest import wait_for
from tests.integration.search_harness import SyncWorker, isolated, remove_world
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.faults]

DIMENSIONS = 16


class Embeddings(BaseHTTPRequestHandler):
    """`POST /v1/embeddings`: a fixed vector per text, or HTTP 400 when a text holds one of `refused`."""

    refused: set[str] = set()

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        bad = [word for t in body["input"] for word in self.refused if word in t]
        if bad:
            status, payload = 400, {"error": {"message": f"input refused: contains {bad[0]}"}}
        else:
            data = [{"index": i, "embedding": [1.0 + (len(t) % 7) / 10] + [1.0] * (DIMENSIONS - 1)}
                    for i, t in enumerate(body["input"])]  # fmt: skip
            status, payload = 200, {"data": data, "model": body.get("model")}
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def env(settings: Settings) -> Iterator[dict[str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Embeddings)
    threading.Thread(target=server.serve_forever, name="dlq-test-embeddings", daemon=True).start()
    dlq_topic = f"ki_test_dlq_{uuid.uuid4().hex[:8]}"
    try:
        with isolated(settings, prefix="ki-dlq-test") as isolation:
            yield {
                **isolation,
                "KI_EMBEDDING__PROVIDER": "openai",
                "KI_EMBEDDING__URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
                "KI_EMBEDDING__MODEL": "dlq-test",
                "KI_EMBEDDING__RETRIES": "0",
                "KI_RETRIEVAL__EMBEDDING_DIMENSIONS": str(DIMENSIONS),
                "KI_STREAMS__DLQ_TOPIC": dlq_topic,
                "KI_STREAMS__MAX_ATTEMPTS": "2",
            }
    finally:
        server.shutdown()
        # The client held while its futures resolve (a discarded one may never resolve them), and a bound on the
        # wait: a test topic left behind is harmless, a hung teardown is not.
        admin = make_kafka_admin(settings)
        for future in admin.delete_topics([dlq_topic], request_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result(timeout=60)


@pytest.fixture(scope="module")
def worker(env: dict[str, str]) -> Iterator[SyncWorker]:
    w = SyncWorker(env, lane="content")
    w.start()
    yield w
    w.stop()


def ki(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    """`ki ...` in this process (as the operator runs it, with the test's environment): status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def waiting(env: dict[str, str]) -> list[dict[str, Any]]:
    status, out, err = ki(env, "dlq", "list", "--json")
    assert status == 0, err
    listed: list[dict[str, Any]] = json.loads(out)
    return listed


def rows(search: OpenSearch, env: dict[str, str]) -> dict[str, tuple[int, int, int]]:
    """Every row of the isolated index: id -> (version, seq_no, whether it has its vector)."""
    alias = env["KI_RETRIEVAL__INDEX_NAME"]
    if not search.indices.exists_alias(name=alias):
        return {}
    search.indices.refresh(index=alias)
    body = {"size": 1000, "seq_no_primary_term": True, "_source": ["document_version_id", "embedding"]}
    hits = search.search(index=alias, body=body)["hits"]["hits"]
    return {h["_id"]: (int(h["_source"]["document_version_id"]), h["_seq_no"], int("embedding" in h["_source"]))
            for h in hits}  # fmt: skip


def dlq_gauges(worker: SyncWorker) -> tuple[float, float]:
    samples = exposition.scrape(f"http://127.0.0.1:{worker.port}/metrics")
    return (exposition.total(samples, "ki_sync_dlq_waiting_records"),
            exposition.total(samples, "ki_sync_dlq_oldest_waiting_seconds"))  # fmt: skip


def log_rows(engine: Engine, env: dict[str, str]) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT operator, action, record_key, reason, outcome, detail FROM ki_dlq_operations "
                "WHERE dlq_topic = :t ORDER BY id"
            ),  # fmt: skip
            {"t": env["KI_STREAMS__DLQ_TOPIC"]},
        )
        return [dict(row._mapping) for row in found]


def test_a_refused_version_is_listed_replayed_after_the_fix_and_another_dropped_with_a_reason(
    worker: SyncWorker, env: dict[str, str], engine: Engine, search: OpenSearch
) -> None:
    refused = f"verweigert{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        w = World(conn)
        project, source = w.project("DLQ"), w.source("local_fs")
        obj = w.source_object(source)
        w.grant("project", project, f"user:anna-{w.tag}")
        good = w.version(w.document(project, f"Gut {w.tag}"), "Der Vertrag ist wirksam geschlossen.")
        w.observe(good, obj)
    try:
        # A version indexed as usual: the index before anything is dead-lettered, read once the lane has committed
        # it (rows read the moment the first one is searchable may be some of the version's only).
        wait_for(lambda: rows(search, env), timeout=90, what="the first version indexed")
        ours = load_settings(environ={**os.environ, **env})
        wait_for(lambda: all(p.lag == 0 for p in consumer_lag(ours, "content")), timeout=90, what="it committed")
        before = rows(search, env)
        assert {v for v, _, _ in before.values()} == {good}

        Embeddings.refused.add(refused)
        with engine.begin() as conn:
            w = World(conn, tag=w.tag)
            bad_doc = w.document(project, f"Abgelehnt {w.tag}")
            bad = w.version(bad_doc, f"Diese Fassung enthält {refused} und wird abgelehnt.")
        key = f"document_versions/{bad}"

        listed = wait_for(lambda: [d for d in waiting(env) if d["key"] == key], timeout=90, what="the dead letter")
        (letter,) = listed
        assert letter["error_class"] == "EmbeddingError" and "HTTP 400" in letter["reason"], letter
        assert letter["attempts"] == 2 and letter["table"] == "document_versions"
        status, table, _ = ki(env, "dlq", "list")
        assert status == 0 and key in table and "EmbeddingError" in table and "ago" in table
        every = {d["key"]: d["dead_letters"] for d in waiting(env)}
        assert f"documents/{bad_doc}" in every  # the failed batch's other records: dead-lettered alike
        letters = sum(every.values())
        _, oldest = wait_for(lambda: (g := dlq_gauges(worker))[0] == letters and g, timeout=30, what="DLQ gauges")
        assert oldest > 0

        # Replayed before the fix: it fails again, is logged as failed, and still waits.
        status, _, err = ki(env, "dlq", "replay", "--key", key, "--by", "ops-test")
        assert status == 1 and f"{key} still waits" in err and "HTTP 400" in err
        assert key in {d["key"] for d in waiting(env)} and rows(search, env).keys() == before.keys()

        # The cause is fixed; the replay indexes it through the projector, and nothing else moves.
        Embeddings.refused.discard(refused)
        status, out, err = ki(env, "dlq", "replay", "--all", "--by", "ops-test")
        assert status == 0, err
        assert out.startswith(f"replayed {letters} dead letters")
        assert waiting(env) == []
        after = rows(search, env)
        assert {k: v for k, v in after.items() if k in before} == before  # same rows, same seq_no: untouched
        added = {k: v for k, v in after.items() if k not in before}
        assert added and {v for v, _, _ in added.values()} == {bad} and all(vec for _, _, vec in added.values())
        wait_for(lambda: dlq_gauges(worker) == (0, 0), timeout=30, what="the DLQ gauges back at zero")

        # Another refused version, dropped: a reason is required, and it is kept.
        Embeddings.refused.add(refused)
        with engine.begin() as conn:
            dropped = World(conn, tag=w.tag).version(
                World(conn, tag=w.tag).document(project, f"Verworfen {w.tag}"), f"Noch einmal {refused}."
            )
        drop_key = f"document_versions/{dropped}"
        wait_for(lambda: drop_key in {d["key"] for d in waiting(env)}, timeout=90, what="the second dead letter")
        status, _, err = ki(env, "dlq", "drop", "--all")
        assert status == 2 and err.count("\n") == 1 and "--reason" in err
        status, _, err = ki(env, "dlq", "drop", "--key", "document_versions/0", "--reason", "x")
        assert status == 2 and err.count("\n") == 1 and "document_versions/0" in err
        status, out, _ = ki(env, "dlq", "drop", "--all", "--reason", "test data, never to be indexed", "--by", "ops")
        assert status == 0 and out.startswith("dropped ")
        assert waiting(env) == []
        status, _, err = ki(env, "dlq", "replay", "--all")
        assert status == 2 and "nothing to replay" in err and err.count("\n") == 1
        assert rows(search, env) == after  # a drop writes nothing to the index

        log = log_rows(engine, env)
        assert [r["outcome"] for r in log if r["record_key"] == key] == ["failed", "replayed"]
        assert all(r["operator"] == "ops-test" and r["action"] == "replay" for r in log if r["action"] == "replay")
        drops = [r for r in log if r["action"] == "drop"]
        assert drop_key in {r["record_key"] for r in drops}
        reason = "test data, never to be indexed"
        assert all((r["outcome"], r["reason"], r["operator"]) == ("dropped", reason, "ops") for r in drops)
        assert next(r for r in log if r["outcome"] == "failed")["detail"].startswith("EmbeddingError")
    finally:
        Embeddings.refused.clear()
        remove_world(engine, [project], [source])
