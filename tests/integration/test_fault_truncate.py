"""Faults: an upstream TRUNCATE (issue 51, item 3).

Debezium's own truncate event has no key and the CDC topics are compacted, which reject a record without one, so
Debezium keeps skipping truncates; a statement trigger (migration 0013) emits a keyed logical-decoding message
instead, which the access lane and the scope cache's feed read as that table's truncate (`projections.cdc`).

A TRUNCATE empties the whole table, so this world runs in a database of its own with its own connector, slot,
topics, consumer group, index, worker and API (the eval isolation's names, `apps.dev.eval.isolation`): nothing
another test wrote is touched. The tests run in order on one world: memberships, then grants, then versions.
Before this change the index kept naming the removed principals (and the versions' rows) until `ki reconcile`,
and a cached scope survived the truncate.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine, create_engine, text

from apps.dev.eval.isolation import drop, ensure_world, make_target
from apps.dev.stack.connector import Connector
from ki.settings import Settings, load_settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import Server, SyncWorker
from tests.integration.sync_harness import dump
from tests.integration.world import World

pytestmark = [pytest.mark.stack, pytest.mark.faults]

SYNC_TIMEOUT_S = 120


@dataclass
class Scene:
    settings: Settings
    engine: Engine
    server: Server
    connector: Connector
    tag: str
    word: str
    by_grant: int  # granted to `anna` directly (project grant)
    by_group: int  # granted to the group `bert` is a member of

    def user(self, name: str) -> str:
        return f"user:{name}-{self.tag}"


def _overrides(settings: Settings) -> dict[str, str]:
    """The world's names as environment overrides for the worker and the API."""
    return {
        "KI_DATABASE__NAME": settings.database.name,
        "KI_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "KI_CONNECT__CONNECTOR_NAME": settings.connect.connector_name,
        "KI_CONNECT__SLOT_NAME": settings.connect.slot_name,
        "KI_CONNECT__PUBLICATION_NAME": settings.connect.publication_name,
        "KI_RETRIEVAL__INDEX_NAME": settings.retrieval.index_name,
        "KI_STREAMS__APP_ID": settings.streams.app_id,
        "KI_STREAMS__DLQ_TOPIC": settings.streams.dlq_topic,
    }


@pytest.fixture(scope="module")
def scene(settings: Settings) -> Iterator[Scene]:
    target = make_target(
        settings,
        f"truncate_{uuid.uuid4().hex[:8]}",
        analyzer=settings.retrieval.text_analyzer,
        embedding_signature="truncate-test",
    )
    env = _overrides(target.settings)
    own = load_settings(environ={**os.environ, **env})
    engine = create_engine(own.database.url, pool_pre_ping=True)
    worker: SyncWorker | None = None
    server: Server | None = None
    try:
        ensure_world(target, progress=lambda line: None)
        worker = SyncWorker(env)
        worker.start()
        with engine.begin() as conn:
            w = World(conn)
            project, other = w.project("Truncate"), w.project("Truncate Gruppe")
            obj = w.source_object(w.source())
            word = f"trc{w.tag}"
            by_grant = w.searchable(project, "Mietvertrag", f"Der Mietvertrag {word} regelt die Miete.", obj, "g")
            by_group = w.searchable(other, "Kaufvertrag", f"Der Kaufvertrag {word} regelt den Kauf.", obj, "m")
            w.grant("project", project, f"user:anna-{w.tag}")
            w.grant("project", other, f"group:team-{w.tag}")
            w.member(f"group:team-{w.tag}", f"user:bert-{w.tag}")
        server = Server("truncate-api", **env)
        server.start()
        wait_for(lambda: server.call("/readyz")[1]["scope_cache"]["usable"], timeout=60, what="the scope cache feed")
        yield Scene(own, engine, server, Connector(own), w.tag, word, by_grant, by_group)
    finally:
        if server is not None:
            server.stop()
        if worker is not None:
            worker.stop()
        engine.dispose()
        drop(target, progress=lambda line: None)


def _named(scene: Scene, search: OpenSearch, document: int, who: str) -> bool:
    """Whether any index row of `document` names `who` (any spelling) in its principal projection."""
    rows = dump(search, scene.settings.retrieval.index_name, [document]).values()
    return any(who.lower() in p.lower() for row in rows for p in row.get("allowed_principals") or ())


def _search(scene: Scene, user: str) -> set[int]:
    token = mint_token(scene.settings.api, user.removeprefix("user:"))
    status, body = scene.server.call("/v1/search", {"query": scene.word, "limit": 50, "mode": "lexical"}, token=token)
    assert status == 200, body
    return {h["document_id"] for h in body["hits"]}


def _not_hits(scene: Scene) -> float:
    metric = scene.server.metric
    return metric("ki_search_scope_cache_total", result="stale") + metric("ki_search_scope_cache_total", result="miss")


def _cached_then_invalidated(scene: Scene, user: str, expected: set[int], truncate: str, search: OpenSearch) -> None:
    """`user` sees `expected` from a cached scope; after `truncate` the worker rewrites the projection and the
    API's next search of `user` compiles the scope again (a miss, not a hit) and finds nothing."""

    def served_from_the_cache() -> bool:
        hits = scene.server.metric("ki_search_scope_cache_total", result="hit")
        seen = _search(scene, user)
        return seen == expected and scene.server.metric("ki_search_scope_cache_total", result="hit") > hits

    wait_for(served_from_the_cache, timeout=SYNC_TIMEOUT_S, what=f"{user}'s scope, cached")
    with scene.engine.begin() as conn:
        conn.execute(text(truncate))
    refreshed = _not_hits(scene)

    def dropped() -> bool:
        # An invalidated scope is refreshed: the next search is answered stale (or, past the feed's lag, a miss).
        seen = _search(scene, user)
        return _not_hits(scene) > refreshed and seen == set()

    wait_for(dropped, timeout=SYNC_TIMEOUT_S, what=f"the cached scope of {user} to be dropped by the feed")
    for document in expected:
        wait_for(
            lambda d=document: not _named(scene, search, d, user),
            timeout=SYNC_TIMEOUT_S,
            what=f"the index to stop naming {user} after `{truncate}`",
        )
    assert scene.connector.state()[:2] == ("RUNNING", ["RUNNING"]), scene.connector.state()


def test_a_truncated_group_memberships_table_is_projected_out(scene: Scene, search: OpenSearch) -> None:
    bert = scene.user("bert")
    wait_for(lambda: _named(scene, search, scene.by_group, bert), timeout=SYNC_TIMEOUT_S, what="bert's membership")
    _cached_then_invalidated(scene, bert, {scene.by_group}, "TRUNCATE group_memberships", search)
    assert _named(scene, search, scene.by_group, f"group:team-{scene.tag}")  # the grant itself stays


def test_a_truncated_grants_table_is_projected_out(scene: Scene, search: OpenSearch) -> None:
    anna = scene.user("anna")
    wait_for(lambda: _named(scene, search, scene.by_grant, anna), timeout=SYNC_TIMEOUT_S, what="anna's grant")
    _cached_then_invalidated(scene, anna, {scene.by_grant}, "TRUNCATE grants", search)
    assert not _named(scene, search, scene.by_group, f"group:team-{scene.tag}")
    # The rows themselves stay: only who may see them changed.
    assert dump(search, scene.settings.retrieval.index_name, [scene.by_grant, scene.by_group])


def test_a_truncated_versions_table_leaves_none_of_its_rows(scene: Scene, search: OpenSearch) -> None:
    index = scene.settings.retrieval.index_name
    documents = [scene.by_grant, scene.by_group]
    assert dump(search, index, documents)
    with scene.engine.begin() as conn:
        conn.execute(text("TRUNCATE document_versions CASCADE"))
    wait_for(lambda: not dump(search, index, documents), timeout=SYNC_TIMEOUT_S, what="the versions' rows to go")
    with scene.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM document_versions")).scalar() == 0
    assert scene.connector.state()[:2] == ("RUNNING", ["RUNNING"]), scene.connector.state()
