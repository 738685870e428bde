"""Documents and relations on the live stack: `GET /v1/documents/{id}`, `/related` and `POST /v1/traverse`
over HTTP, and a property test of the SQL traversal against the reference ACL evaluator on random worlds
with random relation graphs (written in a rolled-back transaction each)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from ki.clients import make_engine
from ki.db.models import RELATION_KINDS
from ki.settings import Settings
from search.documents.read import get_document, run_traversal
from search.web.auth import mint_token
from tests import acl_reference as ref
from tests.integration.acl_worlds import cases, write
from tests.integration.search_harness import Server
from tests.integration.world import World

pytestmark = pytest.mark.stack


@dataclass
class Data:
    tag: str
    docs: dict[str, int]
    versions: dict[str, int]
    projects: list[int]
    sources: list[int]

    def token(self, settings: Settings, who: str) -> str:
        return mint_token(settings.api, f"{who}-{self.tag}")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("relations-api", KI_API__LIMITS__MAX_TRAVERSE_DEPTH="3", KI_API__LIMITS__MAX_TRAVERSE_FANOUT="4")
    srv.start()
    yield srv
    srv.stop()


# anna sees every document of project P; ben sees `vertrag_2024`, `anlage` and `gutachten` (document grants);
# `geheim` lies in project Q, which neither sees.
#   vertrag_2024 --supersedes--> vertrag_2023        anlage --annex_of--> vertrag_2024
#   gutachten --references--> vertrag_2024           gutachten --references--> geheim
#   geheim --references--> vertrag_2023              mail_1 --thread--> mail_2 --thread--> mail_1 (a cycle)
@pytest.fixture(scope="module")
def data(engine: Engine) -> Iterator[Data]:
    with engine.begin() as conn:
        w = World(conn)
        p, q = w.project("Relationen"), w.project("Geheim")
        source = w.source("local_fs")
        obj = w.source_object(source)
        docs: dict[str, int] = {}
        versions: dict[str, int] = {}
        for key, project in (("vertrag_2023", p), ("vertrag_2024", p), ("anlage", p), ("gutachten", p),
                             ("geheim", q), ("mail_1", p), ("mail_2", p)):  # fmt: skip
            docs[key] = w.document(project, f"{key} {w.tag}", identifiers=[f"ID-{key}-{w.tag}"])
            versions[key] = w.version(docs[key], f"Text von {key}.")
            w.observe(versions[key], obj)
        draft = w.version(docs["vertrag_2024"], "Entwurf.", version_no=2, status="draft", latest=False)
        w.observe(draft, obj)
        versions["vertrag_2024_draft"] = draft
        for kind, a, b in (("supersedes", "vertrag_2024", "vertrag_2023"), ("annex_of", "anlage", "vertrag_2024"),
                           ("references", "gutachten", "vertrag_2024"), ("references", "gutachten", "geheim"),
                           ("references", "geheim", "vertrag_2023"), ("thread", "mail_1", "mail_2"),
                           ("thread", "mail_2", "mail_1")):  # fmt: skip
            conn.execute(
                text("INSERT INTO relations (kind, from_document_id, to_document_id) VALUES (:k, :a, :b)"),
                {"k": kind, "a": docs[a], "b": docs[b]},
            )
        w.grant("project", p, f"user:anna-{w.tag}")
        for key in ("vertrag_2024", "anlage", "gutachten"):
            w.grant("document", docs[key], f"user:ben-{w.tag}")
        w.grant("project", q, f"user:nobody-{w.tag}")
        d = Data(w.tag, docs, versions, [p, q], [source])
    try:
        yield d
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM projects WHERE id = ANY(:p)"), {"p": d.projects})
            conn.execute(text("DELETE FROM sources WHERE id = ANY(:s)"), {"s": d.sources})


def get(server: Server, data: Data, settings: Settings, who: str, path: str) -> tuple[int, Any]:
    return server.call(path, token=data.token(settings, who))


def test_a_document_lists_only_the_versions_the_caller_may_see(server: Server, data: Data, settings: Settings) -> None:
    status, doc = get(server, data, settings, "anna", f"/v1/documents/{data.docs['vertrag_2024']}")
    assert status == 200, doc
    assert doc["title"] == f"vertrag_2024 {data.tag}" and doc["identifiers"] == [f"ID-vertrag_2024-{data.tag}"]
    assert [v["version_id"] for v in doc["versions"]] == [
        data.versions["vertrag_2024"],
        data.versions["vertrag_2024_draft"],
    ]
    assert [v["status"] for v in doc["versions"]] == ["final", "draft"]
    assert doc["latest_final_version_id"] == data.versions["vertrag_2024"] == doc["citation"]["version_id"]
    assert doc["citation"]["source_object_ids"] and doc["versions"][0]["latest_final"] is True


def test_an_invisible_document_is_a_404_like_a_missing_one(server: Server, data: Data, settings: Settings) -> None:
    hidden = get(server, data, settings, "anna", f"/v1/documents/{data.docs['geheim']}")
    missing = get(server, data, settings, "anna", "/v1/documents/999999999999")
    assert hidden[0] == missing[0] == 404 and hidden[1] == missing[1]
    assert get(server, data, settings, "ben", f"/v1/documents/{data.docs['vertrag_2023']}")[0] == 404
    assert get(server, data, settings, "anna", f"/v1/documents/{data.docs['geheim']}/related")[0] == 404
    status, body = get(server, data, settings, "anna", "/v1/documents/abc")
    assert status == 400 and body["field"] == "document_id"
    status, body = server.call(f"/v1/documents/{data.docs['anlage']}")  # no token
    assert status == 401


def test_related_documents_are_those_whose_other_end_is_visible(server: Server, data: Data, settings: Settings) -> None:
    def related(who: str, key: str, query: str = "") -> set[tuple[str, str, int]]:
        status, body = get(server, data, settings, who, f"/v1/documents/{data.docs[key]}/related{query}")
        assert status == 200, body
        return {(r["kind"], r["direction"], r["document"]["document_id"]) for r in body["related"]}

    d = data.docs
    assert related("anna", "gutachten") == {("references", "outgoing", d["vertrag_2024"])}  # not `geheim`
    assert related("anna", "vertrag_2024") == {
        ("supersedes", "outgoing", d["vertrag_2023"]),
        ("annex_of", "incoming", d["anlage"]),
        ("references", "incoming", d["gutachten"]),
    }
    assert related("ben", "vertrag_2024") == {
        ("annex_of", "incoming", d["anlage"]),
        ("references", "incoming", d["gutachten"]),
    }
    assert related("anna", "vertrag_2024", "?kinds=supersedes&direction=incoming") == set()
    assert related("anna", "vertrag_2024", "?kinds=annex_of,references&direction=incoming") == {
        ("annex_of", "incoming", d["anlage"]), ("references", "incoming", d["gutachten"]),
    }  # fmt: skip
    for query, field in (("?kinds=cites", "kinds"), ("?direction=up", "direction"), ("?limit=x", "limit"),
                         ("?limit=0", "limit"), ("?limit=100000", "limit"), ("?color=red", "color")):  # fmt: skip
        status, body = get(server, data, settings, "anna", f"/v1/documents/{d['anlage']}/related{query}")
        assert status == 400 and body["field"] == field, (query, body)


def traverse(server: Server, data: Data, settings: Settings, who: str, **body: Any) -> tuple[int, Any]:
    return server.call("/v1/traverse", body, data.token(settings, who))


def test_traversal_cuts_what_the_caller_may_not_see_and_ends_cycles(
    server: Server, data: Data, settings: Settings
) -> None:
    d = data.docs
    status, body = traverse(server, data, settings, "anna", start=[d["gutachten"]], depth=3, direction="outgoing")
    assert status == 200, body
    depths = {n["document_id"]: n["depth"] for n in body["nodes"]}
    # gutachten -> vertrag_2024 -> vertrag_2023; `geheim` is cut (and so is its edge to vertrag_2023).
    assert depths == {d["gutachten"]: 0, d["vertrag_2024"]: 1, d["vertrag_2023"]: 2}
    assert all(d["geheim"] not in (e["from_document_id"], e["to_document_id"]) for e in body["edges"])
    assert all(n["citation"]["source_object_ids"] for n in body["nodes"])
    status, body = traverse(server, data, settings, "ben", start=[d["anlage"], d["vertrag_2023"]], depth=3,
                            direction="both")  # fmt: skip
    assert status == 200 and body["not_found"] == [d["vertrag_2023"]]  # invisible start: not told apart
    assert {n["document_id"] for n in body["nodes"]} == {d["anlage"], d["vertrag_2024"], d["gutachten"]}
    status, body = traverse(server, data, settings, "anna", start=[d["mail_1"]], depth=3, kinds=["thread"])
    assert {n["document_id"]: n["depth"] for n in body["nodes"]} == {d["mail_1"]: 0, d["mail_2"]: 1}
    assert len(body["edges"]) == 2  # both directions of the cycle, each once


def test_traversal_limits_are_400s_naming_the_field(server: Server, data: Data, settings: Settings) -> None:
    start = [data.docs["gutachten"]]
    for body, field in (({"start": start, "depth": 4}, "depth"), ({"start": start, "max_fanout": 5}, "max_fanout"),
                        ({"start": []}, "start"), ({"start": start, "kinds": ["cites"]}, "kinds"),
                        ({"start": start, "depth": 0}, "depth"), ({"depth": 1}, "start")):  # fmt: skip
        status, answer = traverse(server, data, settings, "anna", **body)
        assert status == 400 and answer["field"] == field, (body, answer)
    status, doc = server.call("/openapi.json")
    assert {"/v1/documents/{document_id}", "/v1/documents/{document_id}/related", "/v1/traverse"} <= set(doc["paths"])


# --- the SQL traversal against the reference evaluator --------------------------------------------------


def _bfs(starts: list[int], edges: set[tuple[str, int, int]], visible: set[int], depth: int) -> dict[int, int]:
    out = {s: 0 for s in starts if s in visible}
    queue = deque(out)
    while queue:
        at = queue.popleft()
        for _, a, b in sorted(edges):
            if a == at and b in visible and b not in out and out[at] < depth:
                out[b] = out[at] + 1
                queue.append(b)
    return out


@pytest.fixture(scope="module")
def props_engine(settings: Settings) -> Iterator[Engine]:
    eng = make_engine(settings, pool_size=2)
    yield eng
    eng.dispose()


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@PROPERTY
@given(data=st.data())
def test_sql_traversal_equals_a_bfs_over_the_reference_scope(props_engine: Engine, data: st.DataObject) -> None:
    case = data.draw(cases("sufficient"), label="case")
    world = case.world
    n = len(world.documents)
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(RELATION_KINDS), st.integers(1, n), st.integers(1, n)),
                               max_size=12), label="relations")  # fmt: skip
    relations = {(k, a, b) for k, a, b in pairs if a != b}
    caller = ref.resolve(world, case.caller, case.security)
    seen_versions = ref.visible(world, caller, case.security)
    visible_docs = {v.document_id for v in world.versions if v.id in seen_versions}
    starts = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=2), label="starts")
    depth = data.draw(st.integers(1, 3), label="depth")
    note(f"world {world}\nrelations {relations}\nvisible {visible_docs}")
    expected = _bfs(starts, relations, visible_docs, depth)
    with props_engine.connect() as conn:
        trans = conn.begin()
        try:
            ids = write(conn, world)
            local = {db: loc for loc, db in ids.documents.items()}
            for k, a, b in relations:
                conn.execute(
                    text("INSERT INTO relations (kind, from_document_id, to_document_id) VALUES (:k, :a, :b)"),
                    {"k": k, "a": ids.documents[a], "b": ids.documents[b]},
                )
            got = run_traversal(conn, list(case.caller), case.security, [ids.documents[s] for s in starts],
                                kinds=None, direction="outgoing", depth=depth, fanout=1000)  # fmt: skip
            assert {local[x["document_id"]]: x["depth"] for x in got["nodes"]} == expected
            assert sorted(local[x] for x in got["not_found"]) == sorted({s for s in starts if s not in visible_docs})
            for e in got["edges"]:
                assert local[e["from_document_id"]] in expected and local[e["to_document_id"]] in expected
            for doc in world.documents:  # GET /v1/documents/{id}: exactly the visible versions, or nothing
                found = get_document(conn, list(case.caller), case.security, ids.documents[doc.id])
                want = {ids.versions[v.id] for v in world.versions if v.document_id == doc.id and v.id in seen_versions}
                assert (found is None) == (not want)
                if found is not None:
                    assert {v["version_id"] for v in found["versions"]} == want
        finally:
            trans.rollback()
