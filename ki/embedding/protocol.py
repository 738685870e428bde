"""The OpenAI embeddings wire format, server side: a request body checked into what to embed, the vectors
turned into the reply, and the admission rule that bounds the work waiting. Pure (no I/O): the aiohttp
server (`apps.runtime.embed_server`) and its tests use it.

Request (``POST /v1/embeddings``): ``{"input": str | [str, ...], "model": str, "dimensions": int?,
"encoding_format": "float" | "base64"?, "user": str?}``. Token-id inputs (lists of integers), which the
OpenAI API also takes, are refused: this server has one tokenizer and its callers send text.

Reply: ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}, ...],
"model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}``; with ``encoding_format`` ``base64`` each
embedding is the base64 of its little-endian float32 values (what OpenAI's own client asks for by default).
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ki.errors import RequestInvalid

__all__ = ["Admission", "EmbeddingsRequest", "embeddings_reply", "parse_embeddings_request"]

_FORMATS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingsRequest:
    texts: list[str]
    model: str
    encoding_format: str


def parse_embeddings_request(
    body: Any, *, models: Collection[str], dimensions: int, max_inputs: int, max_chars: int
) -> EmbeddingsRequest:
    """The texts to embed, or :class:`RequestInvalid` naming the field. `models`: the names this server
    answers to (compared case-insensitively); `dimensions`: the only length it serves; `max_inputs`: texts
    per request; `max_chars`: characters per text (the model cuts to its window anyway; this bounds memory)."""
    if not isinstance(body, dict):
        raise RequestInvalid("body", "must be a JSON object")
    unknown = set(body) - {"input", "model", "dimensions", "encoding_format", "user"}
    if unknown:
        raise RequestInvalid(sorted(unknown)[0], "is not a field of an embeddings request")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestInvalid("model", "must name the model (a non-empty string)")
    if model.lower() not in {m.lower() for m in models}:
        raise RequestInvalid("model", f"this server embeds with {sorted(models)[0]!r}, not {model!r}")
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise RequestInvalid("input", "must be a string or a non-empty list of strings")
    if len(texts) > max_inputs:
        raise RequestInvalid("input", f"has {len(texts)} texts; at most {max_inputs} per request")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise RequestInvalid(f"input[{i}]", "must be a string (token ids are not accepted)")
        if len(text) > max_chars:
            raise RequestInvalid(f"input[{i}]", f"has {len(text)} characters; at most {max_chars}")
    if "dimensions" in body:
        wanted = body["dimensions"]
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted != dimensions:
            raise RequestInvalid("dimensions", f"this model's vectors have {dimensions} dimensions, got {wanted!r}")
    encoding = body.get("encoding_format", "float")
    if encoding not in _FORMATS:
        raise RequestInvalid("encoding_format", f"must be one of {', '.join(_FORMATS)}, got {encoding!r}")
    if "user" in body and not isinstance(body["user"], str):
        raise RequestInvalid("user", "must be a string")
    return EmbeddingsRequest(texts=texts, model=model, encoding_format=encoding)


def embeddings_reply(
    vectors: Sequence[Sequence[float]], *, model: str, tokens: int, encoding_format: str = "float"
) -> dict[str, Any]:
    """The reply body for `vectors` (in input order)."""

    def encoded(vector: Sequence[float]) -> list[float] | str:
        if encoding_format == "base64":
            return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        return [float(x) for x in vector]

    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class Admission:
    """Back-pressure: at most `running` requests embed at once and `waiting` more queue for a turn; a request
    beyond that is refused at once (503 with Retry-After) rather than queued without bound, so a client's
    time-out never expires on work the server still does, and the client backs off instead.

    Not thread-safe: the server calls it from its one event loop."""

    def __init__(self, *, running: int, waiting: int) -> None:
        if running < 1 or waiting < 0:
            raise ValueError(f"running must be >= 1 and waiting >= 0, got {running} and {waiting}")
        self.limit = running + waiting
        self.admitted = 0
        self.refused = 0

    def try_enter(self) -> bool:
        if self.admitted >= self.limit:
            self.refused += 1
            return False
        self.admitted += 1
        return True

    def leave(self) -> None:
        if self.admitted <= 0:
            raise RuntimeError("Admission.leave() without a matching try_enter()")
        self.admitted -= 1
