"""OpenAI-compatible embedding endpoint (``POST {url}/embeddings``), stdlib HTTP only.

Request: ``{"model": ..., "input": [...], "encoding_format": "float"}`` plus ``"dimensions"`` when
``send_dimensions`` is on (models with a fixed length, and many compatible servers, reject it).
Auth: ``Authorization: Bearer $<api_key_env>`` when that variable is set and non-empty.
Retries: up to ``retries`` more attempts, with exponential backoff (honouring a numeric
``Retry-After``), on 408/425/429/5xx, connection errors and time-outs, then :class:`EmbeddingUnavailable`
(transient). Any other status, or a reply that is not the expected JSON, raises :class:`EmbeddingError`
(permanent) at once.

Concurrency: one ``embed`` call's texts go out in requests of ``batch_size`` texts, ``concurrency`` of them in
flight at once (``embedding.concurrency``; the content lane's micro-batch, ``streams.embed_micro_batch_rows``,
is one call, so it should hold ``batch_size * concurrency`` texts to fill them). Back-pressure: a server that
answers 429/503 with ``Retry-After`` holds back *every* request of this embedder, not only the refused one,
until that time has passed; then the refused request is sent again (its retries count as above).

Prefixes: none by default; ``query_prefix`` / ``passage_prefix`` (settings ``embedding.query_prefix`` /
``embedding.passage_prefix``) are prepended to queries / documents for remote models that expect them
(e.g. ``query: `` / ``passage: `` for an e5 model behind the endpoint).

Token counts: for a model the local provider knows (``multilingual-e5-small``, ``all-MiniLM-L6-v2``, e.g.
behind ``ki embed serve``) its shipped tokenizer counts, so chunks are cut as the local provider cuts them
(and, when ``query_prefix`` and ``passage_prefix`` are both left empty, its prefixes are used): the two
providers share one embedding signature, so they must give one index the same rows and vectors. For any
other model there is no tokenizer on this side, so :meth:`HttpEmbedder.count_tokens` is an estimate,
deliberately on the high side for chunking: ``ceil(utf8_bytes(passage_prefix + text) / 3) + 2``.
Subword tokenizers of current embedding models average 3.5-4.5 characters per token on German and
English prose (a byte or two more for umlauts), so real counts stay below the estimate except for
unusual text (long digit runs, rare scripts). ``stats.truncated`` counts texts whose estimate exceeds
``max_tokens`` (the server may cut them, or reject them with HTTP 400).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ki.backoff import Backoff
from ki.embedding import BaseEmbedder, EmbeddingError, EmbeddingUnavailable, make_signature

__all__ = ["HttpEmbedder", "RETRY_STATUSES"]

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_BODY_SNIPPET = 300


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff
    return max(seconds, 0.0)


class HttpEmbedder(BaseEmbedder):
    def __init__(
        self,
        *,
        url: str,
        model: str,
        dimensions: int,
        batch_size: int = 32,
        api_key_env: str = "KI_EMBEDDING_API_KEY",
        timeout_s: float = 30.0,
        retries: int = 3,
        send_dimensions: bool = False,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 20.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        concurrency: int = 1,
        token_counter: Callable[[str], int] | None = None,
        signature_model: str | None = None,
        max_tokens: int = 512,
        query_prefix: str = "",
        passage_prefix: str = "",
    ) -> None:
        super().__init__(
            batch_size=batch_size, max_tokens=max_tokens, query_prefix=query_prefix, passage_prefix=passage_prefix
        )
        if not url:
            raise EmbeddingError("embedding.url must be set when embedding.provider is 'openai'")
        if not url.startswith(("http://", "https://")):
            raise EmbeddingError(f"embedding.url must start with http:// or https://, got {url!r}")
        if not model:
            raise EmbeddingError("embedding.model must name the remote model")
        if dimensions < 1:
            raise EmbeddingError(f"embedding dimensions must be >= 1, got {dimensions}")
        if retries < 0:
            raise EmbeddingError(f"embedding.retries must be >= 0, got {retries}")
        if concurrency < 1:
            raise EmbeddingError(f"embedding.concurrency must be >= 1, got {concurrency}")
        self.endpoint = url.rstrip("/") + "/embeddings"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.retries = retries
        self.send_dimensions = send_dimensions
        self.backoff = Backoff(base_s=backoff_base_s, max_s=backoff_max_s, jitter=0.25)
        self._sleep = sleep
        self._clock = clock
        self.concurrency = concurrency
        self._token_counter = token_counter
        # Until when (on `clock`) no request goes out: the latest Retry-After a server asked of us.
        self._hold_until = 0.0
        self._hold_lock = threading.Lock()
        pool = ThreadPoolExecutor(concurrency, thread_name_prefix="ki-embed-http") if concurrency > 1 else None
        self._requests = pool
        self._dimensions = dimensions
        # `signature_model`: the name the signature is made of, when `model` is one of its aliases
        self._signature = make_signature(signature_model or model, dimensions)
        # Own opener: proxy settings are read from the environment once, here.
        self._opener = urllib.request.build_opener()

    # -- one request ---------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(self.endpoint, data=body, headers=self._headers(), method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:_BODY_SNIPPET].decode("utf-8", "replace").strip()
            message = f"{self.endpoint} answered HTTP {exc.code}: {detail or exc.reason}"
            if exc.code in RETRY_STATUSES:
                raise EmbeddingUnavailable(message, _parse_retry_after(exc.headers.get("Retry-After"))) from exc
            if exc.code in (401, 403):
                message += f" (is ${self.api_key_env} set to a valid key?)"
            raise EmbeddingError(message) from exc
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EmbeddingUnavailable(f"cannot reach {self.endpoint}: {reason}") from exc
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            snippet = raw[:_BODY_SNIPPET].decode("utf-8", "replace")
            raise EmbeddingError(f"{self.endpoint} returned invalid JSON: {snippet!r}") from exc

    def _hold_back(self, seconds: float) -> None:
        """No request of this embedder goes out for `seconds` (a server's Retry-After)."""
        with self._hold_lock:
            self._hold_until = max(self._hold_until, self._clock() + seconds)

    def _wait_for_turn(self) -> None:
        wait = self._hold_until - self._clock()
        if wait > 0:
            self._sleep(wait)

    def _request(self, payload: dict[str, Any]) -> Any:
        body = json.dumps(payload).encode("utf-8")
        attempt = 0
        while True:
            self._wait_for_turn()
            try:
                return self._post(body)
            except EmbeddingUnavailable as exc:
                if attempt >= self.retries:
                    raise EmbeddingUnavailable(f"{exc} (gave up after {attempt + 1} attempts)") from exc
                delay = self.backoff.delay(attempt, exc.retry_after)
                if exc.retry_after is not None:
                    self._hold_back(delay)  # the server is saturated: the other requests wait too
                else:
                    self._sleep(delay)
                attempt += 1

    # -- BaseEmbedder hooks --------------------------------------------------------------------

    def _count_prefixed(self, text: str) -> int:
        """The model's tokenizer's count if we have it, else an estimate (see the module docstring): 2 special
        tokens + one token per 3 UTF-8 bytes."""
        if self._token_counter is not None:
            return self._token_counter(text)
        return math.ceil(len(text.encode("utf-8")) / 3) + 2

    def _run_batches(self, batches: list[list[str]]) -> Iterable[Sequence[Sequence[float]]]:
        if self._requests is None or len(batches) < 2:
            return map(self._embed_batch, batches)
        return self._requests.map(self._embed_batch, batches)

    def _embed_batch(self, texts: list[str]) -> list[Sequence[float]]:
        self._stats.record_truncated(sum(self._count_prefixed(t) > self.max_tokens for t in texts))
        payload: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": "float"}
        if self.send_dimensions:
            payload["dimensions"] = self._dimensions
        reply = self._request(payload)
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list):
            raise EmbeddingError(f"{self.endpoint}: reply has no 'data' list")
        by_index: dict[int, Sequence[float]] = {}
        for position, item in enumerate(data):
            if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
                raise EmbeddingError(f"{self.endpoint}: data[{position}] has no 'embedding' list")
            index = item.get("index", position)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(texts):
                raise EmbeddingError(f"{self.endpoint}: data[{position}] has invalid index {index!r}")
            if index in by_index:
                raise EmbeddingError(f"{self.endpoint}: index {index} appears twice in the reply")
            by_index[index] = item["embedding"]
        if len(by_index) != len(texts):
            raise EmbeddingError(f"{self.endpoint}: sent {len(texts)} texts, got {len(by_index)} embeddings")
        vectors = [by_index[i] for i in range(len(texts))]
        for i, vector in enumerate(vectors):
            if len(vector) != self._dimensions:
                raise EmbeddingError(
                    f"{self.endpoint}: model {self.model!r} returned a {len(vector)}-dimensional vector "
                    f"for input {i}, expected {self._dimensions} (retrieval.embedding_dimensions); fix "
                    "the setting and rebuild the index, or enable embedding.send_dimensions if the model "
                    "supports it"
                )
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector):
                raise EmbeddingError(f"{self.endpoint}: vector {i} contains non-numeric values")
        return vectors
