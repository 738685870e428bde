"""Promoted documents and expiry on the live stack (migration 0013).

The world, in project P (the caller alice holds a project grant), all at objects whose ACL is unknown (the
project grant decides):
* `plain` and `promoted`: the same body and a title differing in one letter; `promoted` was written second, so
  without the bonus it would rank below `plain` (equal scores fall to the lower chunk id);
* `expired`: `expires_at` an hour ago, related from `plain`, with an identifier: absent from search, read, lookup
  and related, and never in the index;
* `source_only`: observed only at an object of a source that expired; `both`: observed at it and at a live one;
* `doomed`: indexed, then given a past `expires_at` (a change the sync sees): its rows leave the index;
* `soon`: indexed, then promoted and given an expiry seconds ahead (a change the sync projects before it passes):
  it disappears from search when it passes, and the access lane's sweep (`streams.expiry_sweep_s` 1 s here)
  removes its rows although no change announced it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ki.clients import make_sync_client
from ki.settings import Settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import Server, SyncWorker, isolated, remove_world, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack


@dataclass
class Scene:
    tag: str
    project: int
    live_object: int
    expired_object: int
    plain: int
    promoted: int
    expired: int
    source_only: int
    both: int
    doomed: int
    soon: int
    index: str

    @property
    def alice(self) -> str:
        return f"alice-{self.tag}"


@pytest.fixture(scope="module")
def scene(engine: Engine, settings: Settings) -> Iterator[tuple[Scene, Server]]:
    with isolated(settings, prefix="ki-promoted") as env:
        worker = SyncWorker({**env, "KI_STREAMS__EXPIRY_SWEEP_S": "1"})
        worker.start()
        lanes = worker.lane_env
        server = Server("promoted-api", **env, **lanes)
        sources: list[int] = []
        projects: list[int] = []
        try:
            server.start()
            with engine.begin() as conn:
                w = World(conn)
                p = w.project("Befristung")
                live, gone = w.source("local_fs"), w.source("local_fs")
                sources, projects = [live, gone], [p]
                conn.execute(
                    text("UPDATE sources SET expires_at = now() - interval '1 hour' WHERE id = :s"), {"s": gone}
                )
                live_object, expired_object = w.source_object(live), w.source_object(gone)
                body = "Die Zaunpflicht des Nachbarn endet an der Grundstücksgrenze."
                plain = w.searchable(p, "Zaunordnung A", body, live_object, "a")
                promoted = w.searchable(p, "Zaunordnung B", body, live_object, "b")
                conn.execute(text("UPDATE documents SET promoted = true WHERE id = :d"), {"d": promoted})
                expired = w.searchable(p, "Abgelaufene Weisung", "Die Weisung zur Heckenhöhe gilt.", live_object, "e")
                conn.execute(
                    text("UPDATE documents SET expires_at = now() - interval '1 hour' WHERE id = :d"), {"d": expired}
                )
                w.relation("references", plain, expired)
                source_only = w.searchable(p, "Altquelle", "Der Gartenteich bleibt eingezäunt.", expired_object, "s")
                both = w.searchable(p, "Doppelquelle", "Die Gartenlaube bleibt stehen.", live_object, "d")
                w.observe(conn.execute(text("SELECT min(id) FROM document_versions WHERE document_id = :d"),
                                       {"d": both}).scalar_one(), expired_object)  # fmt: skip
                doomed = w.searchable(p, "Vergängliche Notiz", "Der Komposthaufen wird verlegt.", live_object, "x")
                soon = w.searchable(p, "Befristete Regel", "Die Regenrinne wird gereinigt.", live_object, "t")
                w.grant("project", p, f"user:alice-{w.tag}")
            index = env["KI_RETRIEVAL__INDEX_NAME"]
            found = Scene(w.tag, p, live_object, expired_object, plain, promoted, expired, source_only, both, doomed,
                          soon, index)  # fmt: skip
            wait_until_indexed(server, settings, [p], {plain, promoted, both, doomed, soon}, "the world")
            wait_for(lambda: rows_of(settings, index, source_only) > 0, timeout=120, what="source_only's rows")
            yield found, server
        finally:
            server.stop()
            worker.stop()
            remove_world(engine, projects, sources)


def rows_of(settings: Settings, index: str, document: int, *, promoted: bool = False) -> int:
    """How many rows of `document` the index holds (only those that say `promoted`: read from `_source`)."""
    client = make_sync_client(settings, timeout_s=30)
    try:
        client.indices.refresh(index=index)
        body = {"query": {"term": {"document_id": str(document)}}, "size": 100, "_source": ["promoted"]}
        hits = client.search(index=index, body=body)["hits"]["hits"]
        return sum(1 for h in hits if not promoted or h["_source"].get("promoted") is True)
    finally:
        client.close()


def search(server: Server, settings: Settings, who: str, query: str) -> list[dict[str, Any]]:
    body = {"query": query, "explain": True, "mode": "lexical", "limit": 20}
    status, answer = server.call("/v1/search", body, mint_token(settings.api, who))
    assert status == 200, answer
    return list(answer["hits"])


def test_a_promoted_document_ranks_above_its_twin_by_the_bonus(scene: tuple[Scene, Server], settings: Settings) -> None:
    data, server = scene
    hits = search(server, settings, data.alice, "Zaunpflicht Grundstücksgrenze")
    assert [h["document_id"] for h in hits[:2]] == [data.promoted, data.plain]
    bonus = settings.retrieval.promoted_bonus
    assert bonus > 0
    assert [h["explain"]["promoted_bonus"] for h in hits[:2]] == [bonus, 0.0]
    for h in hits[:2]:
        e = h["explain"]
        assert e["fused_score"] == pytest.approx(e["rrf_score"] * e["status_boost"] * e["decay"] + e["promoted_bonus"])


def test_an_expired_document_is_nowhere(scene: tuple[Scene, Server], settings: Settings) -> None:
    data, server = scene
    alice = mint_token(settings.api, data.alice)
    assert all(h["document_id"] != data.expired for h in search(server, settings, data.alice, "Heckenhöhe Weisung"))
    hidden = server.call(f"/v1/documents/{data.expired}", token=alice)
    assert hidden[0] == 404 and hidden == server.call(f"/v1/documents/{data.expired + 10**9}", token=alice)
    status, found = server.call("/v1/lookup", {"identifier": f"AZ-e-{data.tag}"}, alice)
    assert status == 200 and found["outcome"] == "not_found"
    status, related = server.call(f"/v1/documents/{data.plain}/related", token=alice)
    assert status == 200 and related["related"] == []
    # The control: the live document is found by its identifier.
    assert server.call("/v1/lookup", {"identifier": f"AZ-a-{data.tag}"}, alice)[1]["outcome"] == "found"
    assert rows_of(settings, data.index, data.expired) == 0  # the sync never wrote rows for it


def test_a_source_expiry_hides_versions_observed_only_there(scene: tuple[Scene, Server], settings: Settings) -> None:
    data, server = scene
    alice = mint_token(settings.api, data.alice)
    assert rows_of(settings, data.index, data.source_only) > 0  # in the index: excluded by the ACL alone
    assert all(h["document_id"] != data.source_only for h in search(server, settings, data.alice, "Gartenteich"))
    assert server.call(f"/v1/documents/{data.source_only}", token=alice)[0] == 404
    hits = search(server, settings, data.alice, "Gartenlaube")
    assert [h["document_id"] for h in hits] == [data.both]
    assert hits[0]["citation"]["source_object_ids"] == [data.live_object]  # never cited through the expired one


def test_a_document_given_a_past_expiry_leaves_the_index(
    scene: tuple[Scene, Server], settings: Settings, engine: Engine
) -> None:
    data, server = scene
    assert [h["document_id"] for h in search(server, settings, data.alice, "Komposthaufen")] == [data.doomed]
    with engine.begin() as conn:
        conn.execute(text("UPDATE documents SET expires_at = now() WHERE id = :d"), {"d": data.doomed})
    assert search(server, settings, data.alice, "Komposthaufen") == []  # at once, by the ACL
    wait_for(lambda: rows_of(settings, data.index, data.doomed) == 0, timeout=120, what="doomed's rows deleted")


def test_an_expiry_no_change_announces_is_swept(
    scene: tuple[Scene, Server], settings: Settings, engine: Engine
) -> None:
    """The change that sets the expiry (and promotes, which shows when the sync has seen it) is projected before
    the expiry passes; what removes the rows afterwards is the sweep alone."""
    data, server = scene
    assert [h["document_id"] for h in search(server, settings, data.alice, "Regenrinne")] == [data.soon]
    with engine.begin() as conn:
        expires_at = conn.execute(
            text(
                "UPDATE documents SET promoted = true, expires_at = now() + interval '8 seconds' WHERE id = :d"
                " RETURNING expires_at"
            ),
            {"d": data.soon},
        ).scalar_one()

    def database_clock() -> Any:
        with engine.connect() as conn:
            return conn.execute(text("SELECT now()")).scalar_one()

    seen = {"promoted": True}
    wait_for(lambda: rows_of(settings, data.index, data.soon, **seen) > 0, timeout=30, what="the change projected")
    assert database_clock() < expires_at, "the sync saw the change only after the expiry (a loaded machine)"
    wait_for(lambda: database_clock() >= expires_at, timeout=30, what="the expiry")
    assert search(server, settings, data.alice, "Regenrinne") == []  # at once, by the ACL
    wait_for(lambda: rows_of(settings, data.index, data.soon) == 0, timeout=60, what="the sweep deleting its rows")
