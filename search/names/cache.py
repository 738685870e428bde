"""The identity preflight's look-up cache: per name key, which documents carry it.

Most keys a free-text query yields name nothing, and the words of a practice's queries recur. Without a
cache, every ranked query pays one SQL round trip for its keys (`search.names.sql.look_up_names`), which
competes with the legs for the cores. With it, a query whose keys are all known costs a dictionary
look-up. Only a query that names a document still goes to PostgreSQL, to choose and verify its version.

An entry belongs to one caller (the token's principals in canonical form): whether a query's keys are cached
must not depend on what another caller asked, or one caller could test a client's name against what colleagues
behind an ethical wall searched, by the time a search takes. It holds the documents carrying the key that the
caller may see (at most `per_name + 1`, as the look-up returns them), and an empty tuple when none does; so a
change of what decides visibility (grants, memberships, aliases, observations, versions...) invalidates every
entry, in O(1). The caller's scope is applied afterwards, as for an uncached look-up. An entry is correct as
long as no document carrying the key, or getting it, changes. `documents` has REPLICA IDENTITY FULL, so every
change event carries the old row and the new one. The keys of both rows' titles and identifiers are
invalidated (`NameCache.on_change`); a change whose rows are incomplete (a truncate, a placeholder for an
unchanged column, no old row) invalidates everything. An invalidated entry is answered once more while the
service looks it up again in the background (as the scope cache does, `ki.bounded_cache`): a miss would tell
the caller that some document carrying the name changed. Entries expire after `api.caches.name_ttl_s` whatever
happens, so no query text outlives it here.

Freshness: the cache is fed by the scope cache's invalidation feed (`search.access.invalidation`) and used only
while that feed is current. A gap in the feed empties it. A look-up's result is stored only if no
`documents` event arrived while it ran (`generation`), the protocol of `search.access.scope_cache`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ki.bounded_cache import BoundedCache, CacheStats
from ki.table_roles import SCOPE_TABLES
from projections.cdc import UNAVAILABLE, ChangeEvent, Tombstone
from search.names.keys import NamedDocument, NameKey, identity_key

Entry = tuple[NamedDocument, ...]
# Tables whose changes can make a carrier visible or hidden to some caller: those with a scope role
# (`ki.table_roles`), but `documents`, whose events invalidate only the names of its old and new rows.
_VISIBILITY_TABLES = frozenset(SCOPE_TABLES) - {"documents"}
CallerKey = tuple[str, ...]  # the token's principals, canonical (`ScopeCache.raw_key`)
FullKey = tuple[CallerKey, NameKey]


class NameCache:
    """(caller, name key) -> the documents carrying it; LRU-bounded by keys and by documents held, entries expire
    after `ttl_s`; thread-safe."""

    def __init__(self, max_keys: int, max_documents: int, ttl_s: float | None = None) -> None:
        self.max_keys, self.max_documents = max_keys, max_documents
        self._entries: BoundedCache[FullKey, Entry] = BoundedCache(
            max_keys, max_weight=max_documents, weigh=lambda _key, entry: len(entry), ttl_s=ttl_s
        )
        # name key -> the callers' entries of it, to invalidate a name without scanning every entry (pruned
        # of entries gone when it outgrows the cache).
        self._by_name: dict[NameKey, set[FullKey]] = {}
        self._indexed = 0

    @property
    def generation(self) -> int:
        """Bumped by every `documents` event; read before a look-up, handed back to `put`."""
        return self._entries.generation

    @property
    def stats(self) -> CacheStats:
        return self._entries.stats

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self, caller: CallerKey, keys: Iterable[NameKey], max_stale_s: float = 0.0
    ) -> tuple[dict[NameKey, Entry], list[NameKey], list[NameKey]]:
        """This caller's cached entries among `keys`, the keys still to look up (in the order given), and the
        stale ones among those cached (answered, to be looked up again in the background)."""
        found, missing, stale = self._entries.lookup_many([(caller, k) for k in keys], max_stale_s)
        return {k[1]: v for k, v in found.items()}, [k[1] for k in missing], [k[1] for k in stale]

    def put(self, caller: CallerKey, entries: Mapping[NameKey, Entry], generation: int) -> bool:
        """Store a look-up's result, unless a `documents` event arrived since `generation` was read."""
        full = {(caller, key): entry for key, entry in entries.items()}
        stored = self._entries.put_many(full, generation)
        if stored:
            with self._entries.lock:
                for key in full:
                    self._by_name.setdefault(key[1], set()).add(key)
                self._indexed += len(full)
                if self._indexed > 2 * max(self.max_keys, 1):
                    self._prune()
        return stored

    def _prune(self) -> None:
        live = set(self._entries.keys())
        self._by_name = {name: kept for name, keys in self._by_name.items() if (kept := keys & live)}
        self._indexed = sum(len(keys) for keys in self._by_name.values())

    def on_change(self, event: ChangeEvent | Tombstone) -> None:
        """Invalidate what a change can alter: a change of `documents`, every caller's entries of its old and new
        names; a change of what decides visibility, every entry (an entry holds the carriers its caller may see)."""
        if isinstance(event, Tombstone):
            return
        if event.table in _VISIBILITY_TABLES:
            self._entries.mark_all_stale()
            return
        if event.table != "documents":
            return
        rows = [row for row in (event.before, event.after) if row is not None]
        # An insert or snapshot read has no old row; an update or delete without one hides the old names.
        complete = event.op in ("c", "r") or (event.op in ("u", "d") and event.before is not None)
        names = _names(rows) if complete else None
        with self._entries.lock:
            if names is None:
                self._entries.mark_all_stale()
                return
            self._entries.mark_stale([key for name in names for key in self._by_name.get(name, ())])

    def clear(self) -> None:
        with self._entries.lock:
            self._entries.clear()
            self._by_name.clear()
            self._indexed = 0


def _names(rows: Iterable[Mapping[str, Any]]) -> set[NameKey] | None:
    """The title and identifier keys of `rows`; None if a row's title or identifiers are not there."""
    keys: set[NameKey] = set()
    for row in rows:
        title, identifiers = row.get("title", UNAVAILABLE), row.get("identifiers", UNAVAILABLE)
        if title is UNAVAILABLE or identifiers is UNAVAILABLE:
            return None
        if title is not None:
            keys.add(("title", identity_key(str(title))))
        keys.update(("identifier", identity_key(str(i))) for i in identifiers or ())
    return keys
