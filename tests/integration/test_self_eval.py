"""`ki eval --self` end to end: a German corpus whose semantic leg is useless ends keyword-only by
the deployment's own evidence, and every running API process follows without a restart; the same corpus
with the shipped embedder keeps hybrid.

The useless leg is real, not mocked: the OpenAI-compatible embedding provider pointed at a tiny HTTP server
that answers every text with almost the same vector, so the kNN leg ranks at random. The corpus is
`tests/data/gesetze-mini` (80 BGB sections), loaded by `ki eval` into a world of its own (database,
connector, worker, index); the self-evaluation then runs on that world as on a live deployment.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from apps.dev.checkout import REPO_ROOT
from ki.evidence_keys import make_keys
from ki.settings import load_settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import Server

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

DATA = REPO_ROOT / "tests" / "data" / "gesetze-mini"
DIMENSIONS = 16


class _NearConstant(BaseHTTPRequestHandler):
    """`POST /v1/embeddings`: every text gets (1, ..., 1) plus a 1e-4 nudge chosen by its hash."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = []
        for i, text in enumerate(body["input"]):
            vector = [1.0] * DIMENSIONS
            vector[int(hashlib.sha256(text.encode()).hexdigest(), 16) % DIMENSIONS] += 1e-4
            data.append({"index": i, "embedding": vector})
        payload = json.dumps({"data": data, "model": body.get("model")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def constant_embeddings() -> Iterator[dict[str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NearConstant)
    threading.Thread(target=server.serve_forever, name="near-constant-embeddings", daemon=True).start()
    try:
        yield {
            "KI_EMBEDDING__PROVIDER": "openai",
            "KI_EMBEDDING__URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
            "KI_EMBEDDING__MODEL": "near-constant",
            "KI_RETRIEVAL__EMBEDDING_DIMENSIONS": str(DIMENSIONS),
        }
    finally:
        server.shutdown()


def _ki(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "apps.cli", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )
    assert done.returncode == 0, f"ki {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return done


def _world(name: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """`ki eval` on gesetze-mini under `name`: its own world, loaded and indexed; the report."""
    _ki("eval", "--data", str(DATA), "--name", name, "--fresh", "--out", str(out), "--timeout", "400", env=env)
    return json.loads((out / f"{name}.json").read_text())


def _as_deployment(record: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """Settings that make the eval's world look like a live deployment to `ki serve` and `ki eval --self`."""
    iso = record["isolation"]
    return {
        **env,
        "KI_DATABASE__NAME": iso["database"],
        "KI_RETRIEVAL__INDEX_NAME": iso["index_alias"],
        "KI_KAFKA__TOPIC_PREFIX": iso["topic_prefix"],
        "KI_STREAMS__APP_ID": iso["consumer_group"],
    }


def _default_mode(server: Server) -> dict[str, Any]:
    api = load_settings(environ={**os.environ, **server.process.env}).api
    status, body = server.call("/v1/search", {"query": "Kündigung der Wohnung"}, token=mint_token(api, "ki-eval"))
    assert status == 200, body
    return body["mode"]


def test_a_useless_semantic_leg_ends_keyword_only_in_every_api_process(
    constant_embeddings: dict[str, str], tmp_path: Path
) -> None:
    record = _world("gesetze-mini-constant", tmp_path, constant_embeddings)
    # The deployment's own key: `ki eval --self` signs, the API trusts it (an unsigned report is no evidence).
    private, public = make_keys(tmp_path / "keys")
    deployment = _as_deployment(
        record,
        {
            **constant_embeddings,
            "KI_RETRIEVAL__MODE_GATE__SELF_EVAL_REFRESH_S": "1",
            "KI_RETRIEVAL__MODE_GATE__SIGNING_KEY_FILE": str(private),
            "KI_RETRIEVAL__MODE_GATE__TRUSTED_KEY_FILES": json.dumps([str(public)]),
        },
    )
    server = Server("self-eval-api", **deployment)
    server.start()
    try:
        before = _default_mode(server)
        assert "self-eval" not in before["reason"]
        done = _ki("eval", "--self", "--self-documents", "80", "--out", str(tmp_path / "self"), env=deployment)
        (report_path,) = (tmp_path / "self").glob("self-eval-*.json")  # outside benchmarks/
        report = json.loads(report_path.read_text())
        assert f"self-eval #{report['id']}: default mode lexical" in done.stdout
        assert report["decision"] == "lexical", report["summary"]
        assert report["signature"]["algorithm"] == "ed25519" and report["cost"]["latency_ms"]["hybrid"]["p99"] > 0
        confirming = report["halves"]["confirming"]["results"]
        assert confirming["semantic"]["ndcg@10"] < 0.25 * confirming["lexical"]["ndcg@10"], confirming
        assert all("sha256" in q and "text" not in q for q in report["queries"])  # texts hashed by default
        # The running API picks the new report up without a restart.
        name = f"self-eval #{report['id']}"

        def switched() -> dict[str, Any] | None:
            mode = _default_mode(server)
            return mode if name in mode["reason"] else None

        after = wait_for(switched, timeout=30, what="the API to read the self-eval report")
        assert after["used"] == "lexical" and after["reason"].endswith("keyword-only"), after
    finally:
        server.stop()
        _ki("eval", "--data", str(DATA), "--name", "gesetze-mini-constant", "--drop", env=constant_embeddings)


def test_the_same_corpus_with_the_shipped_embedder_keeps_hybrid(tmp_path: Path) -> None:
    try:
        record = _world("gesetze-mini", tmp_path, {})
        done = _ki("eval", "--self", "--self-documents", "80", "--out", str(tmp_path / "self"),
                   env=_as_deployment(record, {}))  # fmt: skip
        assert "default mode hybrid" in done.stdout, done.stdout
    finally:
        _ki("eval", "--data", str(DATA), "--name", "gesetze-mini", "--drop", env={})
