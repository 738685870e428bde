"""The semantic leg's query-vector cache: embedding a query costs ~20 ms, and callers repeat queries."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

from ki.bounded_cache import BoundedCache
from ki.principals import canonical_principal


class EmbeddingCache(BoundedCache[str, list[float]]):
    """Query vectors by sha256(embedder signature + caller + text), LRU-bounded, each entry living `ttl_s`.
    Per caller (the token's principal set): a hit is ~20 ms faster than a miss, so a shared entry would
    tell one caller that another asked the same text."""

    def __init__(self, size: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(size, ttl_s=ttl_s, clock=clock)

    @staticmethod
    def key(signature: str, query: str, caller: Sequence[str] = ()) -> str:
        who = "\x01".join(sorted({canonical_principal(p) or "" for p in caller}))
        return hashlib.sha256(f"{signature}\x00{who}\x00{query}".encode()).hexdigest()
