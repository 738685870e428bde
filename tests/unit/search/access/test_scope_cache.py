"""The scope cache (search.access.scope_cache): what each change event invalidates, LRU and id bounds, and the
generation check that keeps an entry computed before an invalidation out of the cache."""

from __future__ import annotations

import json

import pytest

from ki.acl import Caller
from projections.cdc import decode
from search.access.scope import CompiledScope
from search.access.scope_cache import EVERYTHING, NOTHING, Invalidation, ScopeCache, invalidation_for


def event(table: str, op: str, before: dict | None = None, after: dict | None = None):  # type: ignore[no-untyped-def]
    value = {"before": before, "after": after, "op": op, "ts_ms": 1, "source": {"ts_ms": 1, "lsn": 1}}
    return decode(f"ki.public.{table}", json.dumps({"id": 1}), json.dumps(value), known_tables=None)


def test_a_grant_names_the_scopes_of_its_principals_before_and_after() -> None:
    moved = event("grants", "u", {"principal": " User:Anna "}, {"principal": "group:Partner"})
    assert invalidation_for(moved) == Invalidation(scopes=frozenset({"user:anna", "group:partner"}))


def test_memberships_and_aliases_name_callers_not_scopes() -> None:
    joined = event("group_memberships", "c", None, {"group_principal": "group:P", "member_principal": "user:A"})
    assert invalidation_for(joined) == Invalidation(callers=frozenset({"group:p", "user:a"}))
    alias = event("principal_aliases", "d", {"alias": "sid:1", "principal": "user:a"}, None)
    assert invalidation_for(alias) == Invalidation(callers=frozenset({"sid:1", "user:a"}))


def test_a_malformed_principal_matches_nobody_and_invalidates_nothing() -> None:
    assert invalidation_for(event("grants", "c", None, {"principal": "no-kind"})).empty


@pytest.mark.parametrize("table", ["source_observations", "source_objects", "sources", "projects"])
def test_data_events_drop_every_scope(table: str) -> None:
    assert invalidation_for(event(table, "u", {"id": 1}, {"id": 1})) == Invalidation(scopes="all")


def test_documents_and_versions_only_when_membership_can_change() -> None:
    doc = {"id": 1, "project_id": 1, "deleted_at": None, "title": "A"}
    assert invalidation_for(event("documents", "u", doc, {**doc, "title": "B"})) == NOTHING
    assert invalidation_for(event("documents", "u", doc, {**doc, "deleted_at": 5})).scopes == "all"
    assert invalidation_for(event("documents", "u", doc, {**doc, "project_id": 2})).scopes == "all"
    assert invalidation_for(event("documents", "c", None, doc)).scopes == "all"
    version = {"id": 1, "document_id": 1, "status": "draft"}
    assert invalidation_for(event("document_versions", "u", version, {**version, "status": "final"})) == NOTHING
    assert invalidation_for(event("document_versions", "d", version, None)).scopes == "all"


def test_an_unavailable_column_or_a_truncate_drops_everything() -> None:
    toast = {"group_principal": "__debezium_unavailable_value", "member_principal": "user:a"}
    assert invalidation_for(event("group_memberships", "u", toast, toast)) == EVERYTHING
    assert invalidation_for(event("grants", "t")) == EVERYTHING


def test_content_only_tables_invalidate_nothing() -> None:
    for table in ("matters", "ontology_nodes", "decision_records", "relations", "debezium_heartbeat"):
        assert invalidation_for(event(table, "c", None, {"id": 1})) == NOTHING


ANNA = Caller(frozenset({"user:anna", "group:partner"}))
JONAS = Caller(frozenset({"user:jonas"}))


def filled(cache: ScopeCache) -> None:
    g = cache.generation
    cache.put_caller(("user:Anna",), ANNA, g)
    cache.put_caller(("user:jonas",), JONAS, g)
    cache.put_scope(cache.scope_key(ANNA, None), CompiledScope.of([1], [10, 11]), g)
    cache.put_scope(cache.scope_key(ANNA, [1]), CompiledScope.of([1], [10]), g)
    cache.put_scope(cache.scope_key(JONAS, None), CompiledScope.of([2], [20]), g)


def test_a_grant_drops_only_scopes_holding_its_principal() -> None:
    cache = ScopeCache(100, 1000)
    filled(cache)
    cache.apply(Invalidation(scopes=frozenset({"group:partner"})))
    assert cache.scope(cache.scope_key(ANNA, None))[0] is None
    assert cache.scope(cache.scope_key(ANNA, [1]))[0] is None
    assert cache.scope(cache.scope_key(JONAS, None))[0] == CompiledScope.of([2], [20])
    assert cache.caller(("user:Anna",))[0] == ANNA  # the resolution is unchanged by a grant
    assert cache.ids_held == 2 + 1  # Jonas's scope: its ids and the one principal of its key


def test_a_membership_drops_callers_by_raw_or_resolved_principal() -> None:
    cache = ScopeCache(100, 1000)
    filled(cache)
    cache.apply(Invalidation(callers=frozenset({"user:anna"})))  # raw "user:Anna" canonicalises to it
    assert cache.caller(("user:Anna",))[0] is None
    assert cache.caller(("user:jonas",))[0] == JONAS
    cache.apply(Invalidation(callers=frozenset({"group:partner"})))  # only in a resolution
    assert len(cache) == 4  # 1 caller + 3 scopes


def test_an_entry_computed_before_an_invalidation_is_not_stored() -> None:
    cache = ScopeCache(100, 1000)
    generation = cache.generation  # read before the SQL ran
    cache.apply(Invalidation(scopes=frozenset({"user:nobody"})))  # arrives while it runs
    assert not cache.put_scope(cache.scope_key(JONAS, None), CompiledScope.of([2], [20]), generation)
    assert not cache.put_caller(("user:jonas",), JONAS, generation)
    assert cache.put_scope(cache.scope_key(JONAS, None), CompiledScope.of([2], [20]), cache.generation)


def test_bounded_by_entries_and_by_ids_oldest_scope_first() -> None:
    cache = ScopeCache(max_entries=3, max_ids=10)
    g = cache.generation
    for n in range(3):
        cache.put_scope(cache.scope_key(Caller(frozenset({f"user:{n}"})), None), CompiledScope.of([1], [n]), g)
    cache.scope(cache.scope_key(Caller(frozenset({"user:0"})), None))[0]  # touched: now the newest
    cache.put_scope(cache.scope_key(JONAS, None), CompiledScope.of([2], [20]), g)
    assert cache.scope(cache.scope_key(Caller(frozenset({"user:1"})), None))[0] is None  # the oldest went
    assert cache.scope(cache.scope_key(Caller(frozenset({"user:0"})), None))[0] is not None
    big = CompiledScope.of([1], range(6))  # 7 ids and Anna's 2 principals: the others must make room
    assert cache.put_scope(cache.scope_key(ANNA, None), big, g)
    assert cache.ids_held <= 10
    assert not cache.put_scope(cache.scope_key(ANNA, [1]), CompiledScope.of([1], range(20)), g)  # alone too big


def test_callers_are_bounded_by_the_principals_they_resolve_to() -> None:
    """A caller of very many groups weighs by its principals: it pushes out older callers, and one heavier
    than the whole bound is not cached at all (it is resolved in SQL on every request instead)."""
    cache = ScopeCache(max_entries=100, max_ids=10**6, max_principals=1000)
    g = cache.generation
    for n in range(5):
        assert cache.put_caller((f"user:{n}",), Caller(frozenset({f"user:{n}", "group:all"})), g)
    many = Caller(frozenset({"user:many"} | {f"group:g{i}" for i in range(995)}))
    assert cache.put_caller(("user:many",), many, g)
    assert cache.principals_held <= 1000
    assert cache.caller(("user:many",))[0] == many
    assert cache.caller(("user:0",))[0] is None and cache.caller(("user:4",))[0] is not None  # oldest out first
    too_many = Caller(frozenset({f"group:h{i}" for i in range(1001)}))
    assert not cache.put_caller(("user:huge",), too_many, g)
    assert cache.caller(("user:huge",))[0] is None


def test_clear_drops_everything() -> None:
    cache = ScopeCache(100, 1000)
    filled(cache)
    cache.clear()
    assert len(cache) == 0 and cache.ids_held == 0


def test_raw_keys_are_canonical_so_spelling_variants_share_an_entry() -> None:
    assert ScopeCache.raw_key([" User:Anna ", "user:anna", "GROUP:Strasse", "no-kind", "", 7]) == (
        "group:strasse",
        "user:anna",
    )
