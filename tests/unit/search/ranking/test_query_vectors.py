"""The query-embedding cache: keyed by hash, TTL, bounded."""

from __future__ import annotations

from search.ranking.query_vectors import EmbeddingCache


def test_ttl_and_lru_bound() -> None:
    now = [0.0]
    cache = EmbeddingCache(size=2, ttl_s=10, clock=lambda: now[0])
    a, b, c = (EmbeddingCache.key("sig", q) for q in "abc")
    assert a != EmbeddingCache.key("other-sig", "a")
    cache.put(a, [1.0])
    cache.put(b, [2.0])
    assert cache.get(a) == [1.0]
    cache.put(c, [3.0])  # evicts b, the least recently used
    assert cache.get(b) is None and cache.get(c) == [3.0]
    now[0] = 10.0
    assert cache.get(a) is None
    disabled = EmbeddingCache(size=0, ttl_s=10)
    disabled.put(a, [1.0])
    assert disabled.get(a) is None


class _QueryOnlyEmbedder:
    """Records how it was called; `embed` (documents) must not be used for queries."""

    def __init__(self, signature: str) -> None:
        self.signature = signature
        self.queries: list[str] = []

    def embed(self, texts: list[str]) -> list[list[float]]:
        raise AssertionError("queries must be embedded with embed_queries")

    def embed_queries(self, texts: list[str]) -> list[list[float]]:
        self.queries.extend(texts)
        return [[1.0, 0.0] for _ in texts]


def test_embed_query_uses_embed_queries_and_a_signature_bound_cache() -> None:
    import asyncio
    from typing import Any

    from ki.settings import load_settings
    from search.service import SearchService

    embedder = _QueryOnlyEmbedder("model-a-2")
    none: Any = None
    service = SearchService(load_settings(environ={}), none, none, embedder)  # type: ignore[arg-type]

    async def run() -> None:
        assert await service.embed_query("Kündigung") == [1.0, 0.0]
        assert await service.embed_query("Kündigung") == [1.0, 0.0]  # cached
        assert embedder.queries == ["Kündigung"]
        other = _QueryOnlyEmbedder("model-b-2")
        service.embedder = other  # type: ignore[assignment]
        await service.embed_query("Kündigung")  # same text, other signature: not served from the cache
        assert other.queries == ["Kündigung"]

    asyncio.run(run())
