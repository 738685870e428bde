"""The scope cache: compiled scopes reused across requests, invalidated by the CDC events of the tables
that decide access. Pure: no I/O; `search.access.invalidation` feeds it.

Two maps, both LRU-bounded:

* **callers** -- a token's raw principals -> the resolved `Caller` (aliases, groups, admin flag). A group
  membership or alias event naming principal P drops every caller whose raw or resolved principals
  include P (exactly the callers whose resolution it can change).
* **scopes** -- (resolved principals, admin flag, project narrowing) -> `CompiledScope`. A scope is a
  function of the resolved principals and the data, so memberships and aliases never touch this map
  (a changed resolution is a different key). A grant event naming P drops the scopes whose principals
  include P; an event on observations, source objects, sources, projects, a document's deletion or
  project, or a version's existence drops every scope (any caller's scope can change).

Refreshed, not dropped: an invalidated entry stays, marked stale (`ki.bounded_cache`), and the next request
that finds it is answered from it while the service compiles the scope again in the background
(`SearchService.compile_scope`). Dropping it would make that request pay the SQL a hit does not: one search
would tell, by its time, that somebody somewhere changed a version, hidden or not. A stale entry is used at
most `api.caches.scope_max_feed_lag_s` after its invalidation (then it is a miss): no longer than the feed
itself may lag. A gap in the feed still drops everything (`clear`).

Why this cannot leak: the SQL re-verify of every hit runs on every request with the caller resolved
afresh in the same statement, so a scope that is too broad (a revocation not yet seen) only costs
candidates. A scope that is too narrow (a new grant not yet seen) hides a document until the event
arrives -- the same staleness the index itself has. The service uses the cache only while the
invalidation feed is healthy (`search.access.invalidation`), and keeps an entry computed while an invalidation
arrived only as stale since its computation began (`generation`, `raced_since`): never fresh, and answered no
longer than any stale entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ki.acl import Caller
from ki.bounded_cache import BoundedCache, StoreGuard
from ki.principals import canonical_principal
from ki.table_roles import scope_tables
from projections.cdc import UNAVAILABLE, ChangeEvent, Tombstone
from search.access.scope import CompiledScope

ScopeKey = tuple[frozenset[str], bool, tuple[int, ...] | None]
RawKey = tuple[str, ...]

# The tables' scope roles (`ki.table_roles`). Tables whose every row event can change somebody's scope:
_DATA_TABLES = frozenset(scope_tables("every_change"))
# Tables where a row appearing or going, or one of these columns changing, decides scope membership:
_SCOPE_COLUMNS = scope_tables("column_change")
# Tables whose rows name principals: a grant change drops the scopes of the principals it names, a membership
# or alias change their resolutions.
_GRANT_COLUMNS = scope_tables("grantee_scopes")
_PRINCIPAL_COLUMNS = {**_GRANT_COLUMNS, **scope_tables("caller_resolutions")}


@dataclass(frozen=True)
class Invalidation:
    """What one change event invalidates. `scopes`: "all", or the canonical principals whose scopes go;
    `callers`: the canonical principals whose resolutions go."""

    scopes: Literal["all"] | frozenset[str] = frozenset()
    callers: Literal["all"] | frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not self.scopes and not self.callers


NOTHING = Invalidation()
EVERYTHING = Invalidation("all", "all")


def _principals(rows: Iterable[Mapping[str, Any] | None], columns: Iterable[str]) -> frozenset[str] | None:
    """The canonical principals in `columns` of `rows`; None if one is unavailable (invalidate all)."""
    out: set[str] = set()
    for row in rows:
        if row is None:
            continue
        for column in columns:
            value = row.get(column)
            if value is UNAVAILABLE:
                return None
            canonical = canonical_principal(value)
            if canonical is not None:  # a malformed principal matches nobody
                out.add(canonical)
    return frozenset(out)


def invalidation_for(event: ChangeEvent | Tombstone) -> Invalidation:
    """What a captured change invalidates (pure; the rules of the module docstring)."""
    if isinstance(event, Tombstone):
        return NOTHING  # follows a delete that was already handled
    table, rows = event.table, (event.before, event.after)
    if event.op == "t":
        return EVERYTHING
    if table in _PRINCIPAL_COLUMNS:
        named = _principals(rows, _PRINCIPAL_COLUMNS[table])
        if named is None:
            return EVERYTHING
        return Invalidation(scopes=named) if table in _GRANT_COLUMNS else Invalidation(callers=named)
    if table in _DATA_TABLES:
        return Invalidation(scopes="all")
    if table in _SCOPE_COLUMNS:
        if event.op != "u" or event.before is None or event.after is None:
            return Invalidation(scopes="all")  # a row appeared or went
        for column in _SCOPE_COLUMNS[table]:
            old, new = event.before.get(column), event.after.get(column)
            if old is UNAVAILABLE or new is UNAVAILABLE or old != new:
                return Invalidation(scopes="all")
        return NOTHING  # a title, text or status change: the same documents are visible
    return NOTHING  # matters, type nodes, decision records, relations, heartbeats


class ScopeCache:
    """Callers and compiled scopes, LRU-bounded by entries (each), callers by the principals they resolve
    to and scopes by the ids they hold plus the principals in their key; thread-safe (the invalidation feed
    runs in a thread of its own). A caller of 25,000 groups holds ~7 MiB: an entry bound alone would let a
    few thousand such callers exhaust memory. A caller's resolution and the scopes compiled from it share
    one lock and one generation: any invalidation refuses both stores computed before it."""

    def __init__(
        self,
        max_entries: int,
        max_ids: int,
        max_principals: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries, self.max_ids = max_entries, max_ids
        self._guard = StoreGuard()
        self._callers: BoundedCache[RawKey, Caller] = BoundedCache(
            max_entries,
            max_weight=max_principals,
            weigh=lambda _raw, caller: max(1, len(caller.principals)),
            clock=clock,
            guard=self._guard,
        )
        self._scopes: BoundedCache[ScopeKey, CompiledScope] = BoundedCache(
            max_entries,
            max_weight=max_ids,
            weigh=lambda key, scope: scope.size + len(key[0]),
            clock=clock,
            guard=self._guard,
        )

    @staticmethod
    def raw_key(principals: Iterable[object]) -> RawKey:
        """The token's principals in canonical form (`ki.principals`, the definition SQL's `ki_principal`
        resolves with): "User:Anna" and "user:anna " are one caller; a malformed one matches nothing."""
        return tuple(sorted({c for c in (canonical_principal(p) for p in principals) if c is not None}))

    @staticmethod
    def scope_key(caller: Caller, project_ids: Iterable[int] | None) -> ScopeKey:
        narrowing = None if project_ids is None else tuple(sorted({int(p) for p in project_ids}))
        return (caller.principals, caller.is_admin, narrowing)

    @property
    def generation(self) -> int:
        """Read before the SQL runs; handed back to `put_caller` / `put_scope` (with `now()` read beside it)."""
        return self._guard.generation

    def now(self) -> float:
        return self._scopes.now()

    @property
    def ids_held(self) -> int:
        """Ids held across the scopes (with the principals of their keys)."""
        return self._scopes.weight

    @property
    def principals_held(self) -> int:
        return self._callers.weight

    def __len__(self) -> int:
        return len(self._callers) + len(self._scopes)

    def caller(self, key: RawKey, max_stale_s: float = 0.0) -> tuple[Caller | None, bool]:
        """The resolved caller and whether it is stale (to be refreshed); stale longer than `max_stale_s`: None."""
        return self._callers.lookup(key, max_stale_s)

    def scope(self, key: ScopeKey, max_stale_s: float = 0.0) -> tuple[CompiledScope | None, bool]:
        """The compiled scope and whether it is stale (to be refreshed), as `caller`."""
        return self._scopes.lookup(key, max_stale_s)

    def put_caller(self, key: RawKey, caller: Caller, generation: int, raced_since: float | None = None) -> bool:
        return self._callers.put(key, caller, generation, raced_since=raced_since)

    def put_scope(self, key: ScopeKey, scope: CompiledScope, generation: int, raced_since: float | None = None) -> bool:
        """Store unless the scope alone exceeds the id bound. One that raced an invalidation (arrived since
        `generation` was read, before the SQL ran) is refused, or with `raced_since` (`now()` read then) kept
        as stale since then: answered at most as long as any stale entry, refreshed like one."""
        return self._scopes.put(key, scope, generation, raced_since=raced_since)

    def apply(self, invalidation: Invalidation) -> None:
        if invalidation.empty:
            return
        with self._guard.lock:  # both caches at once: no store slips in between
            scopes, callers = invalidation.scopes, invalidation.callers
            if scopes == "all":
                self._scopes.mark_all_stale()
            else:
                named = scopes or frozenset()
                self._scopes.mark_stale_where(lambda key, _scope: not named.isdisjoint(key[0]))
            if callers == "all":
                self._callers.mark_all_stale()
            else:
                who = callers or frozenset()
                self._callers.mark_stale_where(
                    lambda raw, caller: not who.isdisjoint(caller.principals) or not who.isdisjoint(_canonical(raw))
                )

    def on_change(self, event: ChangeEvent | Tombstone) -> None:
        """The invalidation feed's call: drop what the change can alter."""
        self.apply(invalidation_for(event))

    def clear(self) -> None:
        """Drop everything (a gap in the feed: nothing cached before it is trusted again)."""
        with self._guard.lock:
            self._scopes.clear()
            self._callers.clear()


def _canonical(raw: RawKey) -> set[str]:
    return {c for c in (canonical_principal(r) for r in raw) if c is not None}
