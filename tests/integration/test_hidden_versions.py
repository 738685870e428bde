"""A hidden version of a visible document shows nowhere in a search answer.

Access is decided per version. The world: document D in project P has version 1 (final) and version 3
(a draft) observed at an object whose ACL is unknown (so the caller's project grant decides: visible), and
version 2 (final, the document's latest final pointer, in English, dated 2024-06-01) observed only at an
object with a known ACL the caller has no grant on: hidden, although the project grant reaches it, so its
principal projection names the caller. Another document of P, H, is hidden the same way. 30 more visible
documents make the caller's document list longer than a tight scope filter budget, so the second API
(`api.limits.max_scope_filter_bytes` 256) filters the legs by the principal projection instead of by ids.

Each test fails on the code before the per-version leg filter: v2's chunk took lexical rank 0 from the
caller's hits, v2's language and date made the empty answer's reason `no_credible_evidence`, v2 (in force
from 2024-06-01) pushed the caller's version 1 out of an `as_of` answer, version 3 showed as version 3, and
the tight API filtered by projects (a superset made exact by asking again).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ki.clients import make_async_engine, make_client
from ki.embedding import create_embedder
from ki.settings import Settings
from search.request import parse_search_request
from search.service import SearchService
from search.web.auth import mint_token
from tests.integration.search_harness import McpHttp, Server, remove_world, synced_api, wait_until_indexed
from tests.integration.test_mcp import call as call_tool
from tests.integration.world import World

pytestmark = pytest.mark.stack

TIGHT_BUDGET = 256


@dataclass
class Scene:
    tag: str
    project: int
    source: int
    doc: int
    v1: int
    v2: int
    v3: int
    other: int  # a visible document that says "Quittung" twice
    hidden_doc: int
    isolation: dict[str, str]
    mcp_url: str

    @property
    def alice(self) -> str:
        return f"alice-{self.tag}"


@pytest.fixture(scope="module")
def scene(engine: Engine, settings: Settings) -> Iterator[tuple[Scene, Server, Server]]:
    # The worker projects only what is written after it starts (its consumer group begins at the end).
    with synced_api(settings, "ki-hidden-versions", "hidden-versions-api") as (server, _worker, isolation):
        tight = Server("hidden-versions-tight", **isolation, KI_API__LIMITS__MAX_SCOPE_FILTER_BYTES=str(TIGHT_BUDGET))
        tight.start()
        mcp = McpHttp(**isolation)
        mcp.start()
        with engine.begin() as conn:
            w = World(conn)
            p = w.project("Versionen")
            src = w.source("local_fs")
            open_object = w.source_object(src)  # no ACL known: the project grant decides
            closed_object = w.source_object(src, acl_known=True)  # a known ACL without the caller
            doc = w.document(p, f"Mietvertrag {w.tag}")
            v1 = w.version(doc, "Die Kaution beträgt drei Monatsmieten. Quittung folgt.", doc_date=dt.date(2024, 1, 10))
            v2 = w.version(  # the latest final pointer
                doc, "Quittung " * 8 + "Nachtrag zur Kaution.", version_no=2, doc_date=dt.date(2024, 6, 1)
            )
            v3 = w.version(
                doc, "Entwurf einer Staffelmiete.", version_no=3, status="draft", doc_date=dt.date(2024, 9, 1)
            )
            conn.execute(text("UPDATE document_versions SET language = 'en' WHERE id = :v"), {"v": v2})
            w.observe(v1, open_object)
            w.observe(v2, closed_object)
            w.observe(v3, open_object)
            other = w.searchable(p, "Quittungsbuch", "Quittung und noch eine Quittung.", open_object, "q")
            hidden_doc = w.document(p, f"Geheim {w.tag}")
            w.observe(w.version(hidden_doc, "Geheimwort Geheimwort Geheimwort."), closed_object)
            filler = [
                w.searchable(p, f"Akte {i}", f"Aktenvermerk Nummer {i}.", open_object, f"f{i}") for i in range(45)
            ]
            w.grant("project", p, f"user:alice-{w.tag}")
        try:
            found = Scene(w.tag, p, src, doc, v1, v2, v3, other, hidden_doc, isolation, mcp.url)
            wait_until_indexed(server, settings, [p], {doc, other, hidden_doc, *filler}, "the hidden-versions world")
            yield found, server, tight
        finally:
            mcp.stop()
            tight.stop()
            remove_world(engine, [p], [src])


def search(server: Server, settings: Settings, who: str, query: str, **extra: Any) -> dict[str, Any]:
    status, body = server.call("/v1/search", {"query": query, "explain": True, **extra}, mint_token(settings.api, who))
    assert status == 200, body
    return body


def test_a_hidden_version_takes_no_rank_from_the_visible_ones(
    scene: tuple[Scene, Server, Server], settings: Settings
) -> None:
    data, server, tight = scene
    for api in (server, tight):
        body = search(api, settings, data.alice, "Quittung", mode="lexical")
        hits = body["hits"]
        assert [h["version_id"] for h in hits] == [hits[0]["version_id"], data.v1]
        assert hits[0]["document_id"] == data.other
        # The other document's profile and body rows take lexical ranks 0 and 1, v1's body row rank 2:
        # v2's eight "Quittung" (rank 0 before) never stand among them.
        assert [h["explain"]["ranks"]["lexical"] for h in hits] == [0, 2]
        r = settings.retrieval
        part = hits[1]["explain"]["rrf_parts"]["lexical"]
        if r.fusion_method == "rrf":
            assert part == pytest.approx(r.weight_lexical / (r.fusion_rrf_k + 2))
        else:  # normalised over the caller's own list: v1 is not its top (v2's rows are not in it)
            assert 0.0 <= part < r.weight_lexical


def test_the_empty_reason_counts_only_visible_versions(scene: tuple[Scene, Server, Server], settings: Settings) -> None:
    data, server, tight = scene
    for api in (server, tight):
        for filters in ({"language": ["en"]}, {"date_from": "2024-06-01", "date_to": "2024-06-01"}):
            body = search(api, settings, data.alice, "Xylophonquark", filters={"project_id": [data.project], **filters})
            assert body["hits"] == [] and body["reason"] == "filtered_out", filters
        body = search(api, settings, data.alice, "Geheimwort", mode="lexical", filters={"project_id": [data.project]})
        assert body["hits"] == [] and body["reason"] == "no_credible_evidence"


def test_as_of_and_version_numbers_are_the_callers_own(scene: tuple[Scene, Server, Server], settings: Settings) -> None:
    data, server, _ = scene
    # v2 came into force on 2024-06-01, but the caller cannot see it: their version 1 is still in force.
    body = search(server, settings, data.alice, "Kaution", mode="lexical", as_of="2024-07-01")
    assert [h["version_id"] for h in body["hits"]] == [data.v1]
    # Versions 1 and 3 are the caller's first and second.
    draft = search(server, settings, data.alice, "Staffelmiete", mode="lexical")["hits"]
    assert [(h["version_id"], h["version_no"]) for h in draft] == [(data.v3, 2)]


def test_a_date_or_comparison_in_the_query_words_uses_the_callers_own_versions(
    scene: tuple[Scene, Server, Server], settings: Settings
) -> None:
    data, server, _ = scene
    # "in der Fassung vom 1. Juli 2024" asks for the version in force that day: the caller's is v1 (v2 hidden).
    body = search(server, settings, data.alice, "Kaution in der Fassung vom 1. Juli 2024", mode="lexical")
    assert [h["version_id"] for h in body["hits"]] == [data.v1]
    assert body["plan"]["from_query_words"]["as_of"] == "2024-07-01"
    # A comparison with the previous version: the draft v3 against the caller's last final before it, v1 (their
    # version 1) -- never the hidden v2, though it is final and dated between them.
    hits = search(server, settings, data.alice, "Staffelmiete: Unterschied zur vorherigen Fassung", mode="lexical")
    assert [(h["version_id"], h["compare"]) for h in hits["hits"]] == [
        (
            data.v3,
            {
                "earlier": {"side": "previous", "version_id": data.v1, "version_no": 1, "doc_date": "2024-01-10"},
                "later": {"version_id": data.v3, "version_no": 2, "doc_date": "2024-09-01"},
            },
        )
    ]


def test_a_document_shows_the_callers_versions_only(scene: tuple[Scene, Server, Server], settings: Settings) -> None:
    """`GET /v1/documents/{id}` numbered v1 and v3 "1" and "3" and said the latest final
    version was null (the pointer names the hidden v2); now they are the caller's 1 and 2 and the latest
    final is the caller's own v1. A document with only hidden versions answers as one that does not exist."""
    data, server, _ = scene
    alice = mint_token(settings.api, data.alice)
    status, doc = server.call(f"/v1/documents/{data.doc}", token=alice)
    assert status == 200
    assert [(v["version_id"], v["version_no"], v["latest_final"]) for v in doc["versions"]] == [
        (data.v1, 1, True),
        (data.v3, 2, False),
    ]
    assert doc["latest_final_version_id"] == data.v1 and doc["citation"]["version_id"] == data.v1
    hidden = server.call(f"/v1/documents/{data.hidden_doc}", token=alice)
    assert hidden == server.call(f"/v1/documents/{data.hidden_doc + 10**9}", token=alice)
    assert hidden[0] == 404


def test_the_principal_projection_filters_the_legs_without_second_rounds(
    scene: tuple[Scene, Server, Server], settings: Settings
) -> None:
    """With a tight budget the legs carry the principal projection minus the hidden versions: exact, so a
    word found only in hidden versions costs no second round (whose time a caller could measure)."""
    data, _, _ = scene
    local = settings.model_copy(
        update={
            "retrieval": settings.retrieval.model_copy(
                update={"index_name": data.isolation["KI_RETRIEVAL__INDEX_NAME"]}
            )
        }
    )

    async def run() -> tuple[str, int, list[int]]:
        engine, client = make_async_engine(local), make_client(local)
        service = SearchService(local, engine, client, create_embedder(local), scope_cache=False)
        service.filter_budget = TIGHT_BUDGET
        try:
            scope = await service.compile_scope([f"user:{data.alice}"], None)
            request = parse_search_request({"query": "Geheimwort Quittung", "mode": "lexical"}, local.api)
            legs, rounds = await service.run_legs_in_scope(request, scope, None)
            versions = [int(h.source["document_version_id"]) for h in legs.hits["lexical"]]
            return legs.scope_filter, rounds, versions
        finally:
            await service.close()
            await client.close()
            await engine.dispose()

    kind, rounds, versions = asyncio.run(run())
    assert kind == "principals" and rounds == 1
    assert data.v2 not in versions and data.v1 in versions and len(versions) == 3  # and the other document's two rows


def test_the_mcp_tools_answer_the_same(scene: tuple[Scene, Server, Server], settings: Settings) -> None:
    data, server, _ = scene
    token = mint_token(settings.api, data.alice)
    for query, as_of in (("Quittung", None), ("Kaution", "2024-07-01"), ("Staffelmiete", None)):
        body = {"query": query, "mode": "lexical", "explain": True, **({"as_of": as_of} if as_of else {})}
        error, found = call_tool(data.mcp_url, token, "search", body)
        status, http = server.call("/v1/search", body, token)
        assert not error and status == 200
        shown = [(h["version_id"], h["version_no"], h["score"], h["explain"]["ranks"]) for h in found["hits"]]
        assert shown == [(h["version_id"], h["version_no"], h["score"], h["explain"]["ranks"]) for h in http["hits"]]
        if query == "Quittung":
            assert [ranks["lexical"] for *_, ranks in shown] == [0, 2]


def test_a_hidden_versions_text_hash_length_and_existence_show_nowhere(
    scene: tuple[Scene, Server, Server], settings: Settings
) -> None:
    """Reading (issue 48): v2's text, its hash, its length and whether it exists are answered nowhere -- not by
    the text endpoint, a chunk id, `get_document`'s lengths, the MCP reader or the lookup of the document."""
    data, server, _ = scene
    alice = mint_token(settings.api, data.alice)
    missing_version = data.v3 + 10**9
    gone_text = server.call(f"/v1/documents/{data.doc}/versions/{missing_version}/text", token=alice)
    assert gone_text[0] == 404
    assert server.call(f"/v1/documents/{data.doc}/versions/{data.v2}/text", token=alice) == gone_text
    gone_chunk = server.call(f"/v1/chunks/{missing_version}:chunk:0", token=alice)
    assert gone_chunk[0] == 404 and server.call(f"/v1/chunks/{data.v2}:chunk:0", token=alice) == gone_chunk
    status, doc = server.call(f"/v1/documents/{data.doc}", token=alice)
    assert status == 200 and [v["chars"] for v in doc["versions"]] == [
        len("Die Kaution beträgt drei Monatsmieten. Quittung folgt."),
        len("Entwurf einer Staffelmiete."),
    ]
    # The version read by default is the caller's latest final, v1, with v1's own hash.
    error, read = call_tool(data.mcp_url, alice, "read_document", {"document_id": data.doc})
    assert not error and read["version_id"] == data.v1
    assert read["evidence"]["version_sha256"] == hashlib.sha256(read["text"].encode()).hexdigest()
    hidden = call_tool(data.mcp_url, alice, "read_document", {"document_id": data.doc, "version_id": data.v2})
    missing = call_tool(data.mcp_url, alice, "read_document", {"document_id": data.doc, "version_id": missing_version})
    assert hidden[0] and hidden == missing
    # The lookup answers the caller's version; v2 is named nowhere in it.
    status, found = server.call("/v1/lookup", {"title": f"Mietvertrag {data.tag}"}, alice)
    assert status == 200 and found["outcome"] == "found" and found["version"]["version_id"] == data.v1
    assert f'"version_id": {data.v2}' not in json.dumps(found)
