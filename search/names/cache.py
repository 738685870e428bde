"""The identity preflight's look-up cache: per name key, which documents carry it.

Most keys a free-text query yields name nothing, and the words of a practice's queries recur. Without a
cache, every ranked query pays one SQL round trip for its keys (`search.names.sql.look_up_names`), which
competes with the legs for the cores. With it, a query whose keys are all known costs a dictionary
look-up. Only a query that names a document still goes to PostgreSQL, to choose and verify its version.

An entry is caller-independent. It holds the documents carrying the key (at most `per_name + 1`, as the
look-up returns them), and an empty tuple when none does. The caller's scope is applied afterwards, as
for an uncached look-up. An entry is correct as long as no document carrying the key, or getting it,
changes. `documents` has REPLICA IDENTITY FULL, so every change event carries the old row and the new
one. The keys of both rows' titles and identifiers are dropped (`NameCache.apply`). A change whose rows
are incomplete (a truncate, a placeholder for an unchanged column, no old row) drops everything.

Freshness: the cache is fed by the scope cache's invalidation feed (`search.access.invalidation`) and used only
while that feed is current. A gap in the feed empties it. A look-up's result is stored only if no
`documents` event arrived while it ran (`generation`), the protocol of `search.access.scope_cache`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from projections.cdc import UNAVAILABLE, ChangeEvent, Tombstone
from search.names.keys import NamedDocument, NameKey, identity_key

Entry = tuple[NamedDocument, ...]


@dataclass
class NameCacheStats:
    hits: int = 0
    misses: int = 0
    stale_stores: int = 0


class NameCache:
    """Name key -> the documents carrying it; LRU-bounded by keys and by documents held; thread-safe."""

    def __init__(self, max_keys: int, max_documents: int) -> None:
        self.max_keys, self.max_documents = max_keys, max_documents
        self._lock = threading.Lock()
        self._entries: OrderedDict[NameKey, Entry] = OrderedDict()
        self._held = 0  # documents held across all entries
        self.generation = 0  # bumped by every `documents` event
        self.stats = NameCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, keys: Iterable[NameKey]) -> tuple[dict[NameKey, Entry], list[NameKey]]:
        """The cached entries among `keys`, and the keys still to look up (in the order given)."""
        found: dict[NameKey, Entry] = {}
        missing: list[NameKey] = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    missing.append(key)
                else:
                    self._entries.move_to_end(key)
                    found[key] = entry
            self.stats.hits += len(found)
            self.stats.misses += len(missing)
        return found, missing

    def put(self, entries: Mapping[NameKey, Entry], generation: int) -> bool:
        """Store a look-up's result, unless a `documents` event arrived since `generation` was read."""
        with self._lock:
            if generation != self.generation:
                self.stats.stale_stores += 1
                return False
            for key, entry in entries.items():
                if len(entry) > self.max_documents:
                    continue
                self._held += len(entry) - len(self._entries.pop(key, ()))
                self._entries[key] = entry
            while self._entries and (len(self._entries) > self.max_keys or self._held > self.max_documents):
                _, evicted = self._entries.popitem(last=False)
                self._held -= len(evicted)
            return True

    def on_change(self, event: ChangeEvent | Tombstone) -> None:
        """Drop what a change of `documents` can alter: the keys of its old and new names."""
        if isinstance(event, Tombstone) or event.table != "documents":
            return
        rows = [row for row in (event.before, event.after) if row is not None]
        # An insert or snapshot read has no old row; an update or delete without one hides the old names.
        complete = event.op in ("c", "r") or (event.op in ("u", "d") and event.before is not None)
        names = _names(rows) if complete else None
        with self._lock:
            self.generation += 1
            if names is None:
                self._entries.clear()
                self._held = 0
                return
            for key in names:
                self._held -= len(self._entries.pop(key, ()))

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()
            self._held = 0


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
