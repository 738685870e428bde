"""`POST /v1/decisions/search` end to end: decision records in the real PostgreSQL, queried over real HTTP
against a real `ki serve`. Decision search reads SQL only, so no sync worker is involved."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from ki.clients import make_engine
from ki.settings import Settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server
from tests.integration.world import World

pytestmark = pytest.mark.stack


def decision(
    conn: Connection,
    project: int,
    *,
    document: int | None = None,
    evidence: list[int] | None = None,
    locus: str = "",
    summary: str = "",
    rationale: str = "",
) -> int:
    return int(
        conn.execute(
            text(
                "INSERT INTO decision_records (project_id, document_id, locus, change_summary, rationale, "
                "evidence_source_object_ids) VALUES (:p, :d, :l, :s, :r, :e) RETURNING id"
            ),
            {"p": project, "d": document, "l": locus, "s": summary, "r": rationale, "e": evidence or []},
        ).scalar_one()
    )


@dataclass
class Decisions:
    tag: str
    word: str
    projects: dict[str, int]
    documents: dict[str, int]
    ids: dict[str, int]

    def user(self, name: str) -> str:
        return f"{name}-{self.tag}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server("search-api-decisions")
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[Decisions]:
    engine: Engine = make_engine(settings)
    with engine.begin() as conn:
        w = World(conn)
        word = f"zqd{w.tag}"
        p, q = w.project("Entscheidungen"), w.project("Fremd")
        local = w.source("local_fs")
        external = w.source("sharepoint")
        o_local = w.source_object(local)  # no object ACL: delegates to the project boundary
        e_ok = w.source_object(external, acl_known=True)  # mirrored allow for alice below
        e_closed = w.source_object(external)  # external, no mirrored grants: fails closed
        e_multi = w.source_object(external)  # only observed by a version that is also observed elsewhere

        def doc(name: str, *objects: int) -> int:
            d = w.document(p, f"{name} {w.tag}")
            v = w.version(d, f"Text {name}")
            for o in objects:
                w.observe(v, o)
            return d

        documents = {
            "local": doc("Lokal", o_local),
            "shared": doc("Geteilt", e_ok),
            "closed": doc("Geschlossen", e_closed),
            "multi": doc("Mehrfach", o_local, e_multi),
            "denied": doc("Verweigert", o_local),
        }
        team = f"group:team-{w.tag}"
        w.grant("project", p, team)
        w.grant("source_object", e_ok, f"user:alice-{w.tag}")
        w.grant("document", documents["denied"], f"user:alice-{w.tag}", "deny")
        member = w.member(team, f"user:alice-{w.tag}")
        why = f"{word} Kaution"
        ids = {
            "doc": decision(
                conn, p, document=documents["local"], locus="§ 3 Abs. 2", summary=f"{why} erhöht", rationale="Markt"
            ),
            "evidence": decision(conn, p, evidence=[e_ok], summary=word, rationale="Der RÜCKTRITT bleibt möglich"),
            "one_closed": decision(conn, p, document=documents["local"], evidence=[e_ok, e_closed], summary=word),
            "multi": decision(conn, p, evidence=[e_multi], summary=word),
            "nothing": decision(conn, p, summary=word),
            "denied": decision(conn, p, document=documents["denied"], summary=word),
            "other_project": decision(conn, q, evidence=[e_ok], summary=word),
        }
        data = Decisions(w.tag, word, {"p": p, "q": q}, documents, ids)
    try:
        yield data
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM group_memberships WHERE id = :m"), {"m": member})
            conn.execute(text("DELETE FROM projects WHERE id = ANY(:p)"), {"p": [p, q]})
            conn.execute(text("DELETE FROM sources WHERE id = ANY(:s)"), {"s": [local, external]})
        engine.dispose()


def search(server: Server, settings: Settings, subject: str, body: dict[str, Any], **claims: Any) -> dict[str, Any]:
    status, payload = server.call("/v1/decisions/search", body, mint_token(settings.api, subject, **claims))
    assert status == 200, payload
    return payload


def names(world: Decisions, payload: dict[str, Any]) -> set[str]:
    by_id = {v: k for k, v in world.ids.items()}
    return {by_id.get(h["decision_id"], f"foreign:{h['decision_id']}") for h in payload["hits"]}


def test_only_decisions_whose_document_and_evidence_the_caller_may_see(
    server: Server, settings: Settings, world: Decisions
) -> None:
    payload = search(server, settings, world.user("alice"), {"query": world.word, "limit": 50})
    # not: one_closed (one evidence object fails closed), multi (unconfirmable evidence), nothing (no
    # anchor), denied (document deny wins), other_project (no anchor in its own project)
    assert names(world, payload) == {"doc", "evidence"}
    hit = next(h for h in payload["hits"] if h["decision_id"] == world.ids["doc"])
    assert hit["document_id"] == world.documents["local"] and hit["project_id"] == world.projects["p"]
    assert hit["locus"] == "§ 3 Abs. 2" and hit["matched_tokens"] == [world.word]


def test_caller_without_grants_sees_no_decision(server: Server, settings: Settings, world: Decisions) -> None:
    assert search(server, settings, world.user("mallory"), {"query": world.word})["hits"] == []


def test_admin_bypasses_grants_but_not_the_evidence_rules(server: Server, settings: Settings, world: Decisions) -> None:
    payload = search(server, settings, "root", {"query": world.word, "limit": 50}, roles=["admin"])
    assert names(world, payload) == {"doc", "evidence", "one_closed", "denied"}


def test_token_overlap_orders_and_scores(server: Server, settings: Settings, world: Decisions) -> None:
    payload = search(server, settings, world.user("alice"), {"query": f"kaution {world.word.upper()} miete"})
    assert [h["decision_id"] for h in payload["hits"]] == [world.ids["doc"], world.ids["evidence"]]
    first, second = payload["hits"]
    assert first["matched_tokens"] == ["kaution", world.word] and first["score"] == pytest.approx(2 / 3)
    assert second["matched_tokens"] == [world.word] and second["score"] == pytest.approx(1 / 3)
    # case-insensitive beyond ASCII: the rationale says RÜCKTRITT
    payload = search(server, settings, world.user("alice"), {"query": f"rücktritt {world.word}"})
    assert payload["hits"][0]["decision_id"] == world.ids["evidence"]
    assert payload["hits"][0]["matched_tokens"] == ["rücktritt", world.word]


def test_paging_and_filters(server: Server, settings: Settings, world: Decisions) -> None:
    alice = world.user("alice")
    whole = search(server, settings, alice, {"query": world.word, "limit": 2})
    page1 = search(server, settings, alice, {"query": world.word, "limit": 1})
    page2 = search(server, settings, alice, {"query": world.word, "limit": 1, "offset": 1})
    assert [h["decision_id"] for h in page1["hits"] + page2["hits"]] == [h["decision_id"] for h in whole["hits"]]
    assert page1["has_more"] is True and page2["has_more"] is False
    only_doc = {"document_id": world.documents["local"]}
    assert names(world, search(server, settings, alice, {"query": world.word, "filters": only_doc})) == {"doc"}
    other = {"project_id": [world.projects["q"]]}
    admin = search(server, settings, "root", {"query": world.word, "filters": other}, roles=["admin"])
    assert admin["hits"] == []


def test_bad_input_and_hostile_queries(server: Server, settings: Settings, world: Decisions) -> None:
    alice = mint_token(settings.api, world.user("alice"))
    assert server.call("/v1/decisions/search", {"query": world.word})[0] == 401
    for body, field in [
        ({"query": "  "}, "query"),
        ({}, "query"),
        ({"query": "a", "filters": {"project_id": ["x"]}}, "filters.project_id"),
        ({"query": "a", "filters": {"document_id": [2**63]}}, "filters.document_id"),
        ({"query": "a", "filters": {"matter_id": [1]}}, "filters.matter_id"),
        ({"query": "a\u0000b"}, "query"),
        ({"query": "a", "limit": 10_000}, "limit"),
    ]:
        status, payload = server.call("/v1/decisions/search", body, alice)
        assert (status, payload.get("field")) == (400, field), (body, payload)
    status, payload = server.call("/v1/decisions/search", {"query": "a", "offset": 495, "limit": 10}, alice)
    assert status == 422 and payload["error"] == "window_too_deep"
    for hostile in [f"{world.word}'; DROP TABLE decision_records; --", f"{world.word} OR 1=1", "%_\\"]:
        status, payload = server.call("/v1/decisions/search", {"query": hostile}, alice)
        assert status == 200, payload
    status, payload = server.call("/v1/decisions/search", {"query": f"{world.word}' OR '1'='1"}, alice)
    assert status == 200 and names(world, payload) == {"doc", "evidence"}  # plain text, nothing more
    status, doc = server.call("/openapi.json")
    assert "/v1/decisions/search" in doc["paths"] and "DecisionSearchRequest" in doc["components"]["schemas"]
