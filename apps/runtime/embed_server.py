"""`ki embed serve`: the local embedder behind an OpenAI-compatible ``POST /v1/embeddings`` (aiohttp).

What for: another machine (a box with more cores, or a GPU build of onnxruntime) embeds for the content lanes
of many hosts, which point at it with ``embedding.provider = "openai"``; here, a second process on the same
machine measures what the protocol costs (`ki bench embedder --remote`). Wire format and admission:
:mod:`ki.embedding.protocol`.

* The model is the one the settings name (``embedding.model``, ``embedding.threads``, ...), embedded
  *verbatim*: clients add the model's prefixes themselves (``embedding.passage_prefix`` / ``query_prefix``,
  ``passage: `` / ``query: `` for e5), as they do for any e5 server.
* ``running`` requests embed at once (each on a thread; a request's texts run on the embedder's
  ``embedding.threads`` model runs), ``waiting`` more wait their turn; beyond that a request is answered
  503 with ``Retry-After`` at once (back-pressure: the client backs off, nothing queues without bound).
* Bad input: 400 JSON ``{"error": {"message", "type": "invalid_request_error", "param"}}`` naming the field,
  as OpenAI answers. The embedder failing on valid input: 500 with its one-line message.
* Auth: when the variable ``api_key_env`` names is set and non-empty, every request must carry
  ``Authorization: Bearer <it>`` (else 401). Off loopback the server refuses to start without one: the
  texts are a firm's documents.
* ``GET /healthz``: 200 ``{"status": "ok", "model", "dimensions", "admitted", "refused", "served_requests",
  "served_texts", "running", "waiting"}`` once the model is loaded (the server listens only then): requests in
  the server now, refused with 503 and answered since the start, and the limits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ki.embedding import Embedder, EmbeddingError
from ki.embedding.protocol import Admission, embeddings_reply, parse_embeddings_request
from ki.errors import RequestInvalid, SettingsError
from ki.exposure import is_loopback

__all__ = ["ServerLimits", "create_app", "serve"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    running: int = 1  # requests embedding at once
    waiting: int = 8  # requests queued for a turn; beyond: 503
    max_inputs: int = 256  # texts per request
    max_chars: int = 100_000  # characters per text
    retry_after_s: int = 1  # what a refused request is told to wait
    max_body_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        # named as `ki embed serve`'s flags where it has one
        for name, shown in (("running", "--running"), ("max_inputs", "--max-inputs"), ("max_chars", "max_chars"),
                            ("retry_after_s", "--retry-after"), ("max_body_bytes", "max_body_bytes")):  # fmt: skip
            if getattr(self, name) < 1:
                raise SettingsError(f"ki embed serve: {shown} must be at least 1")
        if self.waiting < 0:
            raise SettingsError("ki embed serve: --waiting must be at least 0")


def _error(status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error",
           headers: dict[str, str] | None = None) -> web.Response:  # fmt: skip
    body = {"error": {"message": message, "type": kind, "param": param}}
    return web.json_response(body, status=status, headers=headers)


def create_app(embedder: Embedder, *, model: str, aliases: tuple[str, ...] = (), limits: ServerLimits | None = None,
               api_key: str = "") -> web.Application:  # fmt: skip
    """The server's app over a loaded `embedder` that answers to `model` (and its `aliases`)."""
    limits = limits or ServerLimits()
    admission = Admission(running=limits.running, waiting=limits.waiting)
    served = {"requests": 0, "texts": 0}  # answered 200 since the start
    turns = asyncio.Semaphore(limits.running)
    names = (model, *aliases, embedder.signature)
    verbatim = getattr(embedder, "embed_verbatim", None)
    count = getattr(embedder, "count_verbatim_tokens", None)
    if verbatim is None or count is None:
        raise EmbeddingError(f"{type(embedder).__name__} cannot embed texts verbatim for a server")

    def embed(texts: list[str]) -> tuple[list[list[float]], int]:
        vectors = verbatim(texts)
        tokens = sum(min(count(text), embedder.max_tokens) for text in texts)
        return vectors, tokens

    async def embeddings(request: web.Request) -> web.Response:
        if api_key:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return _error(401, "missing or wrong API key (Authorization: Bearer ...)", kind="authentication_error")
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the body is not JSON", param="body")
        try:
            parsed = parse_embeddings_request(body, models=names, dimensions=embedder.dimensions,
                                              max_inputs=limits.max_inputs, max_chars=limits.max_chars)  # fmt: skip
        except RequestInvalid as exc:
            return _error(400, exc.message, param=exc.field)
        if not admission.try_enter():
            return _error(503, f"busy: {admission.limit} requests running or waiting; retry later",
                          kind="server_busy", headers={"Retry-After": str(limits.retry_after_s)})  # fmt: skip
        try:
            async with turns:
                vectors, tokens = await asyncio.to_thread(embed, parsed.texts)
        except EmbeddingError as exc:
            return _error(500, str(exc), kind="server_error")
        finally:
            admission.leave()
        served["requests"] += 1
        served["texts"] += len(vectors)
        reply = embeddings_reply(vectors, model=model, tokens=tokens, encoding_format=parsed.encoding_format)
        return web.json_response(reply)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": model, "dimensions": embedder.dimensions,
                                  "admitted": admission.admitted, "refused": admission.refused,
                                  "served_requests": served["requests"], "served_texts": served["texts"],
                                  "running": limits.running, "waiting": limits.waiting})  # fmt: skip

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/healthz", healthz)
    return app


def serve(settings: Any, *, host: str, port: int, limits: ServerLimits, api_key_env: str) -> int:
    """Load the model the settings name, then listen until stopped."""
    from ki.embedding.local import LocalEmbedder, resolve_local_model

    emb = settings.embedding
    if emb.provider != "local":
        raise SettingsError("ki embed serve serves the local model: embedding.provider must be 'local'")
    api_key = os.environ.get(api_key_env, "") if api_key_env else ""
    if not api_key and not is_loopback(host):
        raise SettingsError(
            f"ki embed serve: --host {host!r} is not a loopback address and ${api_key_env or 'KI_EMBEDDING_API_KEY'} "
            "is not set: refusing to take a firm's texts from anyone who can connect"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = resolve_local_model(emb.model)
    embedder = LocalEmbedder(emb.model, batch_size=emb.batch_size, max_tokens=emb.max_tokens, threads=emb.threads,
                             cache_dir=emb.model_cache_dir)  # fmt: skip
    embedder.embed_verbatim(["warm-up"])  # the first run allocates; /healthz answers once this is done
    app = create_app(embedder, model=spec.name, aliases=spec.aliases, limits=limits, api_key=api_key)
    log.info("ki embed serve: %s on http://%s:%d/v1/embeddings", spec.name, host, port)
    web.run_app(app, host=host, port=port, access_log=None, print=None)
    return 0
