"""The identity preflight's look-up cache: per name key, which documents carry it.

Most keys a free-text query yields name nothing, and the words of a practice's queries recur. Without a
cache, every ranked query pays one SQL round trip for its keys (`search.names.sql.look_up_names`), which
competes with the legs for the cores. With it, a query whose keys are all known costs a dictionary
look-up. Only a query that names a document still goes to PostgreSQL, to choose and verify its version.

An entry is caller-independent. It holds the documents carrying the key (at most `per_name + 1`, as the
look-up returns them), and an empty tuple when none does. The caller's scope is applied afterwards, as
for an uncached look-up. An entry is correct as long as no document carrying the key, or getting it,
changes. `documents` has REPLICA IDENTITY FULL, so every change event carries the old row and the new
one. The keys of both rows' titles and identifiers are dropped (`NameCache.on_change`). A change whose rows
are incomplete (a truncate, a placeholder for an unchanged column, no old row) drops everything.

Freshness: the cache is fed by the scope cache's invalidation feed (`search.access.invalidation`) and used only
while that feed is current. A gap in the feed empties it. A look-up's result is stored only if no
`documents` event arrived while it ran (`generation`), the protocol of `search.access.scope_cache`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ki.bounded_cache import BoundedCache, CacheStats
from projections.cdc import UNAVAILABLE, ChangeEvent, Tombstone
from search.names.keys import NamedDocument, NameKey, identity_key

Entry = tuple[NamedDocument, ...]


class NameCache:
    """Name key -> the documents carrying it; LRU-bounded by keys and by documents held; thread-safe."""

    def __init__(self, max_keys: int, max_documents: int) -> None:
        self.max_keys, self.max_documents = max_keys, max_documents
        self._entries: BoundedCache[NameKey, Entry] = BoundedCache(
            max_keys, max_weight=max_documents, weigh=lambda _key, entry: len(entry)
        )

    @property
    def generation(self) -> int:
        """Bumped by every `documents` event; read before a look-up, handed back to `put`."""
        return self._entries.generation

    @property
    def stats(self) -> CacheStats:
        return self._entries.stats

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, keys: Iterable[NameKey]) -> tuple[dict[NameKey, Entry], list[NameKey]]:
        """The cached entries among `keys`, and the keys still to look up (in the order given)."""
        return self._entries.get_many(keys)

    def put(self, entries: Mapping[NameKey, Entry], generation: int) -> bool:
        """Store a look-up's result, unless a `documents` event arrived since `generation` was read."""
        return self._entries.put_many(entries, generation)

    def on_change(self, event: ChangeEvent | Tombstone) -> None:
        """Drop what a change of `documents` can alter: the keys of its old and new names."""
        if isinstance(event, Tombstone) or event.table != "documents":
            return
        rows = [row for row in (event.before, event.after) if row is not None]
        # An insert or snapshot read has no old row; an update or delete without one hides the old names.
        complete = event.op in ("c", "r") or (event.op in ("u", "d") and event.before is not None)
        names = _names(rows) if complete else None
        if names is None:
            self._entries.clear()
        else:
            self._entries.discard(names)

    def clear(self) -> None:
        self._entries.clear()


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
