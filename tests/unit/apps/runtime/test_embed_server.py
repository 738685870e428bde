"""`ki embed serve`: the wire format and admission (pure), then the server on a free port of 127.0.0.1 with the
real e5 model, spoken to through the HTTP provider the content lane uses."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from apps.runtime.embed_server import ServerLimits, create_app
from ki.embedding import EmbeddingError
from ki.embedding.http import HttpEmbedder
from ki.embedding.local import LocalEmbedder
from ki.embedding.protocol import Admission, embeddings_reply, parse_embeddings_request
from ki.errors import RequestInvalid, SettingsError

MODEL = "multilingual-e5-small"


def parse(body: Any, **limits: Any) -> Any:
    options: dict[str, Any] = {"models": (MODEL, "intfloat/multilingual-e5-small"), "dimensions": 384, "max_inputs": 4,
               "max_chars": 50} | limits  # fmt: skip
    return parse_embeddings_request(body, **options)


def test_a_string_or_a_list_of_strings_is_what_gets_embedded() -> None:
    assert parse({"model": MODEL, "input": "eins"}).texts == ["eins"]
    request = parse({"model": "INTFLOAT/multilingual-e5-small", "input": ["a", "b"], "dimensions": 384,
                     "encoding_format": "base64", "user": "lane-1"})  # fmt: skip
    assert (request.texts, request.encoding_format) == (["a", "b"], "base64")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"input": "a"}, "model"),
        ({"model": "text-embedding-3-small", "input": "a"}, "model"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": ["a"] * 5}, "input"),
        ({"model": MODEL, "input": ["a", [1, 2]]}, "input[1]"),
        ({"model": MODEL, "input": ["a", "x" * 51]}, "input[1]"),
        ({"model": MODEL, "input": "a", "dimensions": 256}, "dimensions"),
        ({"model": MODEL, "input": "a", "dimensions": True}, "dimensions"),
        ({"model": MODEL, "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "a", "user": 7}, "user"),
        ({"model": MODEL, "input": "a", "temperature": 0}, "temperature"),
    ],
)
def test_bad_requests_name_their_field(body: Any, field: str) -> None:
    with pytest.raises(RequestInvalid) as info:
        parse(body)
    assert info.value.field == field


def test_the_reply_is_in_input_order_and_base64_is_little_endian_float32() -> None:
    vectors = [[1.0, 0.5], [0.25, -2.0]]
    reply = embeddings_reply(vectors, model=MODEL, tokens=7)
    assert [item["index"] for item in reply["data"]] == [0, 1]
    assert [item["embedding"] for item in reply["data"]] == vectors
    assert reply["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    packed = embeddings_reply(vectors, model=MODEL, tokens=7, encoding_format="base64")["data"][1]["embedding"]
    assert np.frombuffer(base64.b64decode(packed), dtype="<f4").tolist() == [0.25, -2.0]


def test_admission_refuses_beyond_running_plus_waiting_and_admits_again_after_a_leave() -> None:
    admission = Admission(running=1, waiting=1)
    assert [admission.try_enter() for _ in range(3)] == [True, True, False]
    admission.leave()
    assert admission.try_enter()
    assert (admission.admitted, admission.refused) == (2, 1)
    with pytest.raises(ValueError):
        Admission(running=0, waiting=0)


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(SettingsError, match="max-inputs"):
        ServerLimits(max_inputs=0)


# ----------------------------------------------------------------------------------------------------
# the server on a free port
# ----------------------------------------------------------------------------------------------------


@dataclass
class Running:
    url: str
    loop: asyncio.AbstractEventLoop


@contextmanager
def run_in_thread(app: web.Application) -> Iterator[Running]:
    """Serve `app` on a free port of 127.0.0.1 from a thread of its own until the generator is closed."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Running(f"http://127.0.0.1:{port}", loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


@pytest.fixture(scope="module")
def e5(e5_cache_dir: Path) -> LocalEmbedder:
    return LocalEmbedder(MODEL, max_tokens=512, threads=2, cache_dir=e5_cache_dir)


@pytest.fixture(scope="module")
def server(e5: LocalEmbedder) -> Iterator[Running]:
    with run_in_thread(create_app(e5, model=MODEL, aliases=("intfloat/multilingual-e5-small",))) as running:
        yield running


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], Any]:
    request = urllib.request.Request(url + "/v1/embeddings", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


TEXTS = [
    "Der Mieter ist verpflichtet, die Mietsache pfleglich zu behandeln. " * 30,  # past the 512-token window
    "Die Kündigung bedarf der Schriftform.",
    "Eine Minderung der Miete nach § 536 BGB setzt einen erheblichen Mangel voraus.",
]


def test_the_http_provider_through_the_server_gives_the_local_vectors(server: Running, e5: LocalEmbedder) -> None:
    remote = HttpEmbedder(url=server.url + "/v1", model=MODEL, dimensions=384, batch_size=2, concurrency=2,
                          api_key_env="", query_prefix="query: ", passage_prefix="passage: ")  # fmt: skip
    assert remote.signature == e5.signature  # the same index serves both providers
    pairs = ((remote.embed(TEXTS), e5.embed(TEXTS)), (remote.embed_queries(TEXTS), e5.embed_queries(TEXTS)))
    for got, expected in pairs:
        cosines = (np.array(got) * np.array(expected)).sum(axis=1)
        assert cosines.min() >= 0.9999, cosines
    assert remote.stats.batches == 4  # 3 texts in requests of 2, twice


def test_bad_input_is_a_400_naming_the_field_and_health_answers(server: Running) -> None:
    status, _, body = post(server.url, json.dumps({"model": MODEL, "input": [3]}).encode())
    assert (status, body["error"]["param"], body["error"]["type"]) == (400, "input[0]", "invalid_request_error")
    status, _, body = post(server.url, b"{not json")
    assert (status, body["error"]["param"]) == (400, "body")
    status, _, body = post(server.url, json.dumps({"model": MODEL, "input": "x", "dimensions": 1536}).encode())
    assert (status, body["error"]["param"]) == (400, "dimensions")
    with urllib.request.urlopen(server.url + "/healthz", timeout=10) as response:
        health = json.loads(response.read())
    assert (health["status"], health["model"], health["dimensions"]) == ("ok", MODEL, 384)


def test_usage_counts_the_tokens_the_model_saw(server: Running, e5: LocalEmbedder) -> None:
    status, _, body = post(server.url, json.dumps({"model": MODEL, "input": TEXTS[:2]}).encode())
    assert status == 200
    assert body["usage"]["prompt_tokens"] == 512 + e5.count_verbatim_tokens(TEXTS[1])  # the first one cut


class GatedEmbedder:
    """An embedder whose runs wait for a gate: the test decides when the running request finishes."""

    dimensions = 3
    signature = "gated-3"
    max_tokens = 10

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()

    def embed_verbatim(self, texts: list[str]) -> list[list[float]]:
        self.started.set()
        if not self.gate.wait(timeout=30):
            raise EmbeddingError("the test never opened the gate")
        return [[1.0, 0.0, 0.0] for _ in texts]

    def count_verbatim_tokens(self, text: str) -> int:
        return len(text)


def test_a_saturated_server_answers_503_with_retry_after_and_the_key_is_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedder = GatedEmbedder()
    app = create_app(embedder, model="gated", limits=ServerLimits(running=1, waiting=0, retry_after_s=7),  # type: ignore[arg-type]
                     api_key="k-123")  # fmt: skip
    body = json.dumps({"model": "gated", "input": ["a"]}).encode()
    key = {"Authorization": "Bearer k-123"}
    with run_in_thread(app) as running:
        url = running.url
        assert post(url, body)[0] == 401
        assert post(url, body, {"Authorization": "Bearer wrong"})[0] == 401
        first: dict[str, Any] = {}

        def hold_the_turn() -> None:
            first["reply"] = post(url, body, key)

        thread = threading.Thread(target=hold_the_turn)
        thread.start()
        assert embedder.started.wait(timeout=30)  # the first request holds the one turn
        status, headers, reply = post(url, body, key)
        assert (status, headers.get("Retry-After"), reply["error"]["type"]) == (503, "7", "server_busy")
        embedder.gate.set()
        thread.join(timeout=30)
        assert first["reply"][0] == 200
        assert post(url, body, key)[0] == 200  # admitted again once the first left
        with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
            health = json.loads(response.read())
        assert (health["refused"], health["served_requests"], health["served_texts"]) == (1, 2, 2)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "0"], {}, "--port must be a port number"),
        (["--retry-after", "0"], {}, "--retry-after must be at least 1"),
        ([], {"KI_EMBEDDING__PROVIDER": "openai"}, "embedding.provider must be 'local'"),
        (["--host", "0.0.0.0"], {}, "not a loopback address and $KI_EMBEDDING_API_KEY is not set"),
    ],
)
def test_ki_embed_serve_refuses_with_one_line(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from apps.cli import main

    monkeypatch.delenv("KI_EMBEDDING_API_KEY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["embed", "serve", *argv]) == 2  # before any model is loaded
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
