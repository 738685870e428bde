"""The one bounded cache under the query-vector, scope and name caches (ki.bounded_cache)."""

from __future__ import annotations

import threading

from ki.bounded_cache import BoundedCache, StoreGuard


def test_least_recently_used_goes_first_when_over_the_entry_bound() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert cache.get_many(["a", "b", "c"]) == ({"a": 1, "c": 3}, ["b"])
    assert cache.stats.evictions == 1


def test_the_weight_bound_evicts_and_refuses_what_is_heavier_alone() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(10, max_weight=5, weigh=lambda _key, value: len(value))
    assert cache.put("three", [1, 2, 3])
    assert cache.put("two", [1, 2])
    assert cache.put("one", [1])  # six in all: the oldest goes
    assert cache.get("three") is None and cache.weight == 3
    assert not cache.put("six", list(range(6)))
    assert cache.stats.oversized == 1 and cache.get("two") == [1, 2]


def test_entries_expire_after_the_ttl() -> None:
    now = [0.0]
    cache: BoundedCache[str, int] = BoundedCache(5, ttl_s=10, clock=lambda: now[0])
    cache.put("a", 1)
    now[0] = 9.9
    assert cache.get("a") == 1
    now[0] = 10.0
    assert cache.get("a") is None and cache.stats.expired == 1 and len(cache) == 0


def test_a_zero_bound_or_ttl_stores_nothing() -> None:
    for cache in (BoundedCache[str, int](0), BoundedCache[str, int](5, ttl_s=0)):
        assert not cache.put("a", 1)
        assert cache.get("a") is None


def test_a_value_computed_before_an_invalidation_is_refused() -> None:
    cache: BoundedCache[str, int] = BoundedCache(5)
    for invalidate in (lambda: cache.discard(["absent"]), lambda: cache.discard_where(lambda k, v: False), cache.clear):
        generation = cache.generation  # read before the value was computed
        invalidate()  # arrives meanwhile, even one that finds nothing to drop
        assert not cache.put("a", 1, generation)
        assert not cache.put_many({"b": 2}, generation)
        assert cache.get_many(["a", "b"])[0] == {}
    assert cache.stats.stale_stores == 6
    assert cache.put("a", 1, cache.generation)


def test_a_value_that_raced_an_invalidation_is_kept_stale_since_its_computation_began() -> None:
    now = [100.0]
    cache: BoundedCache[str, int] = BoundedCache(5, clock=lambda: now[0])
    generation, began = cache.generation, cache.now()
    now[0] = 101.0
    cache.mark_all_stale()  # a change arrives while the value is computed
    now[0] = 102.0
    assert cache.put("a", 1, generation, raced_since=began)
    assert cache.lookup("a", max_stale_s=5.0) == (1, True)  # answered, as stale: the owner refreshes it
    assert cache.stats.stale_stores == 1
    now[0] = began + 5.0
    assert cache.lookup("a", max_stale_s=5.0) == (None, False)  # stale since it began: 5 s later, a miss


def test_a_raced_value_never_replaces_a_newer_one() -> None:
    now = [100.0]
    cache: BoundedCache[str, int] = BoundedCache(5, clock=lambda: now[0])
    old_generation, old_began = cache.generation, cache.now()
    cache.mark_all_stale()
    now[0] = 101.0
    assert cache.put("a", 2, cache.generation)  # a later computation stored fresh meanwhile
    assert not cache.put("a", 1, old_generation, raced_since=old_began)
    assert cache.lookup("a", max_stale_s=5.0) == (2, False)
    now[0] = 102.0
    cache.mark_stale(["a"])  # the newer one went stale at 102: a value begun at 100 is older still
    assert not cache.put("a", 1, old_generation, raced_since=old_began)
    assert cache.lookup("a", max_stale_s=5.0) == (2, True)
    newer_generation, newer_began = cache.generation, cache.now() + 0.5
    cache.mark_all_stale()
    assert cache.put("a", 3, newer_generation, raced_since=newer_began)  # begun after it went stale: newer
    assert cache.lookup("a", max_stale_s=5.0) == (3, True)


def test_discard_and_discard_where_drop_only_what_they_name() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(10, max_weight=100, weigh=lambda _key, value: len(value))
    cache.put_many({"a": [1], "b": [1, 2], "c": [1, 2, 3]})
    assert cache.discard(["a", "zzz"]) == 1
    assert cache.discard_where(lambda key, value: len(value) == 3) == 1
    assert cache.get_many(["a", "b", "c"]) == ({"b": [1, 2]}, ["a", "c"])
    assert cache.weight == 2 and cache.stats.discarded == 2


def test_caches_sharing_a_guard_refuse_each_others_stale_stores() -> None:
    guard = StoreGuard()
    callers: BoundedCache[str, str] = BoundedCache(5, guard=guard)
    scopes: BoundedCache[str, int] = BoundedCache(5, guard=guard)
    generation = callers.generation
    scopes.discard(["x"])  # an invalidation of the scopes only
    assert not callers.put("anna", "resolved", generation)
    assert callers.generation == scopes.generation == generation + 1


def test_concurrent_stores_and_invalidations_keep_the_bounds() -> None:
    cache: BoundedCache[int, list[int]] = BoundedCache(50, max_weight=200, weigh=lambda _key, value: len(value))

    def writer(offset: int) -> None:
        for n in range(2000):
            cache.put(offset + n % 97, [0] * (n % 7), cache.generation)
            if n % 50 == 0:
                cache.discard_where(lambda key, value: key % 3 == 0)

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) <= 50 and cache.weight <= 200
    assert cache.weight == sum(len(v) for v in cache.get_many(range(5000))[0].values())
