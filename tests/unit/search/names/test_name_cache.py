"""The identity look-up cache (search.names.cache): entries per caller, what each `documents` change
invalidates (answered as stale until looked up again), the generation guard against storing a look-up that
raced a change, expiry and bounds. No services."""

from __future__ import annotations

from typing import Any

from projections.cdc import UNAVAILABLE, ChangeEvent, SourceInfo, Tombstone
from search.names.cache import NameCache
from search.names.keys import NamedDocument, NameKey, carried, identity_key

TITLE: NameKey = ("title", identity_key("Mietvertrag Hauptstraße 5"))
AZ: NameKey = ("identifier", identity_key("5 O 1234/22"))
OTHER: NameKey = ("title", identity_key("Atlas Migration"))
ANNA = ("user:anna",)
BEN = ("user:ben",)


def doc(document_id: int, key: NameKey) -> NamedDocument:
    return NamedDocument(document_id, 1, "x", key[0], key[1])


def event(
    op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, table: str = "documents"
) -> ChangeEvent:
    return ChangeEvent(f"ki.public.{table}", table, op, {"id": 1}, before, after, SourceInfo(None, None, False))  # type: ignore[arg-type]


def row(document_id: int, title: str, identifiers: list[str] | None = None) -> dict[str, Any]:
    return {"id": document_id, "title": title, "identifiers": identifiers or [], "project_id": 1}


def filled() -> NameCache:
    cache = NameCache(max_keys=100, max_documents=100)
    assert cache.put(ANNA, {TITLE: (doc(7, TITLE),), AZ: (), OTHER: ()}, cache.generation)
    return cache


def test_get_returns_cached_entries_and_the_keys_to_look_up() -> None:
    cache = filled()
    found, missing, stale = cache.get(ANNA, [TITLE, AZ, ("title", "neu")])
    assert found == {TITLE: (doc(7, TITLE),), AZ: ()} and missing == [("title", "neu")] and stale == []
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)


def test_entries_belong_to_the_caller_who_asked() -> None:
    """Another caller's identical query is a miss: a hit must not tell Ben what Anna searched."""
    cache = filled()
    assert cache.get(BEN, [TITLE, AZ])[1] == [TITLE, AZ]
    assert cache.get(ANNA, [TITLE, AZ])[1] == []


def test_an_invalidated_entry_is_answered_as_stale_until_looked_up_again() -> None:
    cache = filled()
    cache.on_change(event("c", None, row(9, "Atlas Migration")))
    found, missing, stale = cache.get(ANNA, [OTHER, TITLE], max_stale_s=60)
    assert found == {OTHER: (), TITLE: (doc(7, TITLE),)} and missing == [] and stale == [OTHER]
    assert cache.put(ANNA, {OTHER: (doc(9, OTHER),)}, cache.generation)  # the refresh
    assert cache.get(ANNA, [OTHER], max_stale_s=60) == ({OTHER: (doc(9, OTHER),)}, [], [])


def test_entries_expire() -> None:
    cache = NameCache(max_keys=10, max_documents=10, ttl_s=1e-9)
    cache.put(ANNA, {OTHER: ()}, cache.generation)
    assert cache.get(ANNA, [OTHER])[1] == [OTHER]


def test_a_new_document_drops_the_keys_of_its_names_only() -> None:
    cache = filled()
    cache.on_change(event("c", None, row(9, "MIETVERTRAG  Hauptstrasse 5", ["5 O 1234-22"])))
    _, missing, _ = cache.get(ANNA, [TITLE, AZ, OTHER])
    assert missing == [TITLE, AZ]  # the new document carries both (other spellings, same keys)


def test_a_renamed_or_deleted_document_drops_its_old_and_new_names() -> None:
    cache = filled()
    cache.on_change(event("u", row(7, "Mietvertrag Hauptstraße 5"), row(7, "Atlas Migration")))
    assert cache.get(ANNA, [TITLE, OTHER])[1] == [TITLE, OTHER]
    cache = filled()
    cache.on_change(event("d", row(7, "Mietvertrag Hauptstraße 5"), None))
    assert cache.get(ANNA, [TITLE, AZ, OTHER])[1] == [TITLE]


def test_incomplete_changes_drop_everything_and_other_tables_nothing() -> None:
    for incomplete in (
        event("u", None, row(7, "Atlas Migration")),  # no old row: its old names are unknown
        event("d", None, None),
        event("t", None, None),
        event("u", row(7, "x") | {"identifiers": UNAVAILABLE}, row(7, "x")),
    ):
        cache = filled()
        cache.on_change(incomplete)
        assert cache.get(ANNA, [TITLE, AZ, OTHER])[1] == [TITLE, AZ, OTHER], incomplete
    cache = filled()
    cache.on_change(event("u", {"id": 1}, {"id": 1}, table="matters"))
    cache.on_change(Tombstone("ki.public.documents", "documents", {"id": 7}))
    assert len(cache) == 3 and cache.generation == 0


def test_a_change_of_visibility_makes_every_entry_stale_and_later_entries_are_fresh() -> None:
    """An entry holds the carriers its caller may see: a grant (or version, observation...) may change them."""
    for table in ("grants", "document_versions", "source_observations", "group_memberships"):
        cache = filled()
        cache.on_change(event("c", None, {"id": 1}, table=table))
        assert cache.get(ANNA, [TITLE, AZ], max_stale_s=60)[2] == [TITLE, AZ], table
        assert cache.get(ANNA, [TITLE, AZ])[1] == [TITLE, AZ], table  # stale beyond 0 s: missed
        cache.put(ANNA, {OTHER: ()}, cache.generation)  # stored after the change: fresh
        assert cache.get(ANNA, [OTHER], max_stale_s=60) == ({OTHER: ()}, [], []), table


def test_a_look_up_that_raced_a_change_is_not_stored() -> None:
    cache = NameCache(max_keys=100, max_documents=100)
    generation = cache.generation  # read before the SQL ran
    cache.on_change(event("c", None, row(9, "Atlas Migration")))  # arrives while it runs
    assert not cache.put(ANNA, {OTHER: ()}, generation)  # the look-up may predate the new carrier
    assert cache.get(ANNA, [OTHER])[1] == [OTHER] and cache.stats.stale_stores == 1
    cache.clear()
    assert cache.put(ANNA, {OTHER: (doc(9, OTHER),)}, cache.generation)


def test_bounds_evict_the_least_recently_used_keys() -> None:
    cache = NameCache(max_keys=2, max_documents=3)
    cache.put(ANNA, {TITLE: (doc(1, TITLE), doc(2, TITLE))}, 0)
    cache.put(ANNA, {AZ: ()}, 0)
    cache.get(ANNA, [TITLE])  # TITLE is now the most recently used
    cache.put(ANNA, {OTHER: ()}, 0)
    assert cache.get(ANNA, [TITLE, AZ, OTHER])[1] == [AZ]  # over two keys: the oldest went
    cache.put(ANNA, {AZ: (doc(3, AZ), doc(4, AZ))}, 0)  # four documents held: over three
    assert len(cache) <= 2
    cache.put(ANNA, {("title", "riesig"): tuple(doc(i, OTHER) for i in range(4))}, 0)  # alone over the bound
    assert cache.get(ANNA, [("title", "riesig")])[1] == [("title", "riesig")]


def test_carried_leaves_out_the_carriers_of_saturated_keys() -> None:
    entries = {TITLE: (doc(1, TITLE),), AZ: (doc(2, AZ), doc(3, AZ), doc(4, AZ)), OTHER: ()}
    named, saturated = carried(entries, per_name=2)
    assert named == [doc(1, TITLE)] and saturated == {AZ[1]}
