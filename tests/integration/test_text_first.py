"""Text first, end to end: with no content lane running (as when a backlog keeps the embedder busy), a new
document is found through `POST /v1/search` by its words and its file number as soon as the access lane has
written its rows; the answer says its hits wait for their vectors, and a caller without access learns
nothing, not even that."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from ki.settings import Settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import Server, SyncWorker, synced_api
from tests.integration.world import World

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def access_lane_only(settings: Settings) -> Iterator[Server]:
    with synced_api(settings, "ki-text-first", "text-first-api", lane="access") as (server, worker, _env):
        assert isinstance(worker, SyncWorker)
        yield server


def test_a_new_document_is_found_by_words_and_file_number_before_its_vectors_exist(
    engine: Engine, settings: Settings, access_lane_only: Server
) -> None:
    server = access_lane_only
    with engine.begin() as conn:
        w = World(conn)
        word, number = f"textzuerst{w.tag}", f"7 O {int(w.tag, 16) % 100_000}/26"
        project = w.project("Text zuerst")
        doc = w.document(project, f"Klageerwiderung {w.tag}", identifiers=[number])
        body = f"{word} Die Klage ist unbegründet. Der Beklagte bestreitet den Anspruch."
        w.observe(w.version(doc, body, status="final"), w.source_object(w.source()))
        w.grant("project", project, f"user:anna-{w.tag}")
    anna = mint_token(settings.api, f"anna-{w.tag}")
    bert = mint_token(settings.api, f"bert-{w.tag}")

    def found(query: str, mode: str) -> dict | None:
        status, body = server.call("/v1/search", {"query": query, "mode": mode}, anna)
        if status == 503:  # the access lane creates the index with its first batch
            return None
        assert status == 200, body
        return body if body["hits"] else None

    for query in (word, number):
        for mode in ("hybrid", "lexical"):
            body = wait_for(lambda q=query, m=mode: found(q, m), timeout=60, what=f"{query!r} ({mode}) found")
            assert body["hits"][0]["document_id"] == doc
            assert body["mode"]["vectors_pending"] == len(body["hits"]) >= 1
    # The semantic leg has no vector to match yet: nothing, and nothing pending among no hits.
    status, body = server.call("/v1/search", {"query": word, "mode": "semantic"}, anna)
    assert status == 200 and body["hits"] == [] and "vectors_pending" not in body["mode"]
    # A caller without access: the same empty answer as for a word nobody wrote.
    for query in (word, number):
        status, body = server.call("/v1/search", {"query": query}, bert)
        status_none, nothing = server.call("/v1/search", {"query": f"nichts{w.tag}"}, bert)
        assert (status, status_none) == (200, 200) and body["hits"] == [] == nothing["hits"]
        assert "vectors_pending" not in body["mode"] and body.get("reason") == nothing.get("reason")
