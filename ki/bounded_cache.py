"""One bounded cache for every cache in the service (query vectors, callers and scopes, names).

Least recently used first out, bounded by entries and optionally by a weight (the ids a scope holds, the
documents a name carries); entries optionally expire after `ttl_s`; thread-safe (the invalidation feed
runs in a thread of its own).

Stores are guarded against racing invalidations: a caller reads `generation` before computing a value
(before its SQL runs) and hands it back to `put`. Every invalidation — `discard`, `discard_where`, `clear`
— bumps the generation, whether or not it found anything, so a value computed from the state before the
change is refused instead of outliving it. Caches that guard each other's stores (a caller's resolution and
the scopes compiled from it) share one `StoreGuard`: one lock, one generation.

Refresh instead of drop (`mark_stale`, `mark_stale_where`, `mark_all_stale`): an invalidated entry may stay and
be answered as stale (`lookup`), so that its owner serves it once more while it computes the value again in the
background. A miss costs a caller a round trip that a hit does not; dropping on another caller's change would
let the next request tell by its time that something changed (search.access.scope_cache). A stale entry
older than the owner's bound is a miss after all. For the same reason a value computed while an invalidation
arrived may be kept as stale instead of refused (`put(..., raced_since=...)`): stale since the computation began,
so it is answered no longer than a value stored then and invalidated at once would be. Under a stream of changes
(an import) every store races one, and refusing them all would leave the owner computing on every request.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
_EPOCHS_KEPT = 4096  # an entry older than the oldest epoch kept is stale since forever (a miss)
V = TypeVar("V")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    stale_stores: int = 0  # computed before an invalidation that arrived meanwhile: refused
    oversized: int = 0  # heavier alone than the weight bound: refused
    evictions: int = 0
    expired: int = 0
    discarded: int = 0  # dropped by invalidations


class StoreGuard:
    """The lock and the generation that one or more caches share."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.generation = 0


def _unit(_key: object, _value: object) -> int:
    return 1


class BoundedCache(Generic[K, V]):
    def __init__(
        self,
        max_entries: int,
        *,
        max_weight: int | None = None,
        weigh: Callable[[K, V], int] = _unit,  # an entry's weight, from its key and value
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        guard: StoreGuard | None = None,
    ) -> None:
        self.max_entries, self.max_weight, self.ttl_s = max_entries, max_weight, ttl_s
        self._weigh, self._clock = weigh, clock
        self._guard = guard or StoreGuard()
        # expiry, weight, value, the epoch it was stored in
        self._entries: OrderedDict[K, tuple[float, int, V, int]] = OrderedDict()
        self._stale: dict[K, float] = {}  # invalidated entries kept for a refresh -> when they went stale
        # `mark_all_stale` in O(1): an entry stored before the current epoch is stale since the next epoch began.
        self._epoch = 0
        self._epochs: list[tuple[int, float]] = []  # (epoch, when it began), the newest _EPOCHS_KEPT
        self._weight = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and (self.ttl_s is None or self.ttl_s > 0)

    @property
    def generation(self) -> int:
        return self._guard.generation

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """The lock this cache's reads and writes take (an owner's index beside it can share it)."""
        return self._guard.lock

    def keys(self) -> list[K]:
        with self._guard.lock:
            return list(self._entries)

    @property
    def weight(self) -> int:
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    # --- lookups -------------------------------------------------------------------------------

    def get(self, key: K) -> V | None:
        with self._guard.lock:
            return self._get(key)

    def get_many(self, keys: Iterable[K]) -> tuple[dict[K, V], list[K]]:
        """The cached values among `keys`, and the keys not cached (in the order given)."""
        found: dict[K, V] = {}
        missing: list[K] = []
        with self._guard.lock:
            for key in keys:
                value = self._get(key)
                if value is None:
                    missing.append(key)
                else:
                    found[key] = value
        return found, missing

    def lookup(self, key: K, max_stale_s: float) -> tuple[V | None, bool]:
        """The value and whether it is stale (invalidated, kept for a refresh); a value stale for longer than
        `max_stale_s` is dropped and missed."""
        found, _, stale = self.lookup_many([key], max_stale_s)
        return found.get(key), bool(stale)

    def lookup_many(self, keys: Iterable[K], max_stale_s: float) -> tuple[dict[K, V], list[K], list[K]]:
        """`get_many` with the stale keys among those found (see `lookup`)."""
        found: dict[K, V] = {}
        missing: list[K] = []
        stale: list[K] = []
        with self._guard.lock:
            now = self._clock()
            for key in keys:
                entry = self._entries.get(key)
                since = None if entry is None else self._stale_since(key, entry[3])
                if since is not None and now - since >= max_stale_s:
                    self._drop(key)
                value = self._get(key)
                if value is None:
                    missing.append(key)
                    continue
                found[key] = value
                if since is not None:
                    stale.append(key)
        return found, missing, stale

    def _get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is not None and entry[0] <= self._clock():
            self._drop(key)
            self.stats.expired += 1
            entry = None
        if entry is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return entry[2]

    # --- stores --------------------------------------------------------------------------------

    def now(self) -> float:
        """This cache's clock (a `raced_since` reading)."""
        return self._clock()

    def put(self, key: K, value: V, generation: int | None = None, *, raced_since: float | None = None) -> bool:
        """Store, unless an invalidation arrived since `generation` was read (None: no race to guard
        against) or the value alone is heavier than the weight bound; True if stored. With `raced_since`
        (`now()` when `generation` was read) a value that raced an invalidation is kept as stale since then,
        unless the entry held is newer (not stale, or stale since later)."""
        with self._guard.lock:
            if raced_since is None or generation is None or generation == self._guard.generation:
                return self._store({key: value}, generation) == 1
            self.stats.stale_stores += 1
            held = self._entries.get(key)
            since = None if held is None else self._stale_since(key, held[3])
            if held is not None and (since is None or since >= raced_since):
                return False
            if self._store({key: value}, None) != 1:
                return False
            self._stale[key] = raced_since
            return True

    def put_many(self, entries: Mapping[K, V], generation: int | None = None) -> bool:
        """Store every entry that fits; False (and nothing stored) if the generation is stale."""
        return self._store(entries, generation) is not None

    def _store(self, entries: Mapping[K, V], generation: int | None) -> int | None:
        with self._guard.lock:
            if generation is not None and generation != self._guard.generation:
                self.stats.stale_stores += 1
                return None
            if not self.enabled:
                return 0
            expiry = float("inf") if self.ttl_s is None else self._clock() + self.ttl_s
            stored = 0
            for key, value in entries.items():
                weight = self._weigh(key, value)
                if self.max_weight is not None and weight > self.max_weight:
                    self.stats.oversized += 1
                    continue
                self._drop(key)
                self._entries[key] = (expiry, weight, value, self._epoch)
                self._weight += weight
                stored += 1
            self.stats.stores += stored
            self._evict()
            return stored

    def _evict(self) -> None:
        while self._entries and (
            len(self._entries) > self.max_entries or (self.max_weight is not None and self._weight > self.max_weight)
        ):
            key, (_, weight, _, _) = self._entries.popitem(last=False)
            self._stale.pop(key, None)
            self._weight -= weight
            self.stats.evictions += 1

    # --- invalidation --------------------------------------------------------------------------

    def discard(self, keys: Iterable[K]) -> int:
        with self._guard.lock:
            self._guard.generation += 1
            return self._count_discarded(sum(self._drop(key) for key in keys))

    def discard_where(self, stale: Callable[[K, V], bool]) -> int:
        with self._guard.lock:
            self._guard.generation += 1
            gone = [key for key, (_, _, value, _) in self._entries.items() if stale(key, value)]
            return self._count_discarded(sum(self._drop(key) for key in gone))

    def clear(self) -> int:
        with self._guard.lock:
            self._guard.generation += 1
            count = len(self._entries)
            self._entries.clear()
            self._stale.clear()
            self._weight = 0
            return self._count_discarded(count)

    def mark_stale(self, keys: Iterable[K]) -> int:
        """Invalidate `keys` but keep their values for a refresh (see the module docstring)."""
        with self._guard.lock:
            self._guard.generation += 1
            return self._mark([key for key in keys if key in self._entries])

    def mark_stale_where(self, stale: Callable[[K, V], bool]) -> int:
        with self._guard.lock:
            self._guard.generation += 1
            return self._mark([key for key, (_, _, value, _) in self._entries.items() if stale(key, value)])

    def mark_all_stale(self) -> int:
        """Every entry stale, without visiting them (a new epoch: what was stored before it is stale)."""
        with self._guard.lock:
            self._guard.generation += 1
            self._epoch += 1
            self._epochs.append((self._epoch, self._clock()))
            del self._epochs[:-_EPOCHS_KEPT]
            self.stats.discarded += len(self._entries)
            return len(self._entries)

    def _stale_since(self, key: K, stored_in: int) -> float | None:
        """When the entry went stale (None: it is not)."""
        since = self._stale.get(key)
        if stored_in < self._epoch:
            i = bisect.bisect_left(self._epochs, (stored_in + 1, -math.inf))
            began = self._epochs[i][1] if i < len(self._epochs) and self._epochs[i][0] == stored_in + 1 else -math.inf
            since = began if since is None else min(since, began)
        return since

    def _mark(self, keys: Iterable[K]) -> int:
        now, count = self._clock(), 0
        for key in keys:
            self._stale.setdefault(key, now)
            count += 1
        self.stats.discarded += count
        return count

    def _count_discarded(self, count: int) -> int:
        self.stats.discarded += count
        return count

    def _drop(self, key: K) -> int:
        self._stale.pop(key, None)
        entry = self._entries.pop(key, None)
        if entry is None:
            return 0
        self._weight -= entry[1]
        return 1
