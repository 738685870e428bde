"""The query-embedding cache: keyed by hash, TTL, bounded."""

from __future__ import annotations

from search.service import EmbeddingCache


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
