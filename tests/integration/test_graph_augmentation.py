"""Graph augmentation on the live stack: the top documents' `references` pull cited documents into the
answer -- only ones the caller may see, never dropping a ranked one -- and when its own query fails the
answer comes without it, flagged and counted, while the ranked legs still answer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ki.settings import Settings
from search.web.auth import mint_token
from tests.integration.search_harness import Server, SyncWorker, isolated, remove_world, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack


@dataclass
class Data:
    tag: str
    word: str
    docs: dict[str, int]
    projects: list[int]
    sources: list[int]


@pytest.fixture(scope="module")
def isolation(settings: Settings) -> Iterator[dict[str, str]]:
    with isolated(settings, prefix="ki-graph-test") as env:
        yield env


@pytest.fixture(scope="module")
def servers(isolation: dict[str, str]) -> Iterator[tuple[Server, Server]]:
    worker = SyncWorker(isolation)
    worker.start()
    plain = Server("graph-off-api", **isolation)
    graph = Server("graph-on-api", **isolation, KI_RETRIEVAL__GRAPH_RAG_ENABLED="true",
                   KI_RETRIEVAL__GRAPH_RAG__SEEDS="2")  # fmt: skip
    plain.start()
    graph.start()
    yield plain, graph
    graph.stop()
    plain.stop()
    worker.stop()


# In project P (anna): `urteil_a` and `urteil_b` contain the query word; `urteil_a` references `norm`
# (which does not) and `geheim` (project Q, hidden from anna); `rest_1..4` contain the word more weakly.
@pytest.fixture(scope="module")
def data(engine: Engine, servers: tuple[Server, Server], settings: Settings) -> Iterator[Data]:
    plain, _ = servers
    with engine.begin() as conn:
        w = World(conn)
        word = f"graphwort{w.tag}"
        p, q = w.project("Graph"), w.project("Graph geheim")
        source = w.source("local_fs")
        obj = w.source_object(source)
        docs: dict[str, int] = {}
        bodies = {
            "urteil_a": f"{word} {word} {word} Das Gericht stützt sich auf die Norm.",
            "urteil_b": f"{word} {word} Die Berufung wird zurückgewiesen.",
            "norm": "Der Vermieter kann das Mietverhältnis ordentlich kündigen.",
            "geheim": "Vertrauliche Vergleichsverhandlung.",
            **{f"rest_{n}": f"{word} {word} Randbemerkung {n} " + "Füllwort " * (20 * n) for n in range(1, 5)},
            # The weakest match (the word once, every other document has it twice): a statute, the
            # authoritative class of the last test.
            "paragraf": f"Gesetzestext Gesetzestext Gesetzestext Gesetzestext {word} " + "Gesetzestext " * 60,
        }
        for key, body in bodies.items():
            docs[key] = w.document(q if key == "geheim" else p, f"{key} {w.tag}")
            w.observe(w.version(docs[key], body), obj)
        parent = conn.execute(text("INSERT INTO ontology_nodes (kind, key, label) VALUES ('doc_type', :k, 'Gesetz') "
                                   "RETURNING id"), {"k": f"gesetz-{w.tag}"}).scalar_one()  # fmt: skip
        child = conn.execute(text("INSERT INTO ontology_nodes (kind, key, label, parent_id) VALUES ('doc_type', :k, "
                                  "'BGB', :p) RETURNING id"),
                             {"k": f"gesetz-{w.tag}.bgb", "p": parent}).scalar_one()  # fmt: skip
        conn.execute(text("UPDATE documents SET doc_type_id = :t WHERE id = :d"), {"t": child, "d": docs["paragraf"]})
        for cited in ("norm", "geheim"):
            conn.execute(
                text("INSERT INTO relations (kind, from_document_id, to_document_id) VALUES ('references', :a, :b)"),
                {"a": docs["urteil_a"], "b": docs[cited]},
            )
        w.grant("project", p, f"user:anna-{w.tag}")
        w.grant("project", q, f"user:nobody-{w.tag}")
        d = Data(w.tag, word, docs, [p, q], [source])
    try:
        wait_until_indexed(plain, settings, d.projects, set(docs.values()), "the graph world in the index")
        yield d
    finally:
        remove_world(engine, d.projects, d.sources)
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM ontology_nodes WHERE key LIKE :k"), {"k": f"gesetz-{d.tag}%"})


def ask(server: Server, data: Data, settings: Settings, **extra: Any) -> dict[str, Any]:
    body = {"query": data.word, "limit": 20, "mode": "lexical", "explain": True, **extra}
    status, answer = server.call("/v1/search", body, mint_token(settings.api, f"anna-{data.tag}"))
    assert status == 200, answer
    return answer


def test_cited_documents_join_without_dropping_a_ranked_one(servers: tuple[Server, Server], data: Data,
                                                            settings: Settings) -> None:  # fmt: skip
    plain, graph = servers
    off, on = ask(plain, data, settings), ask(graph, data, settings)
    ranked = [h["document_id"] for h in off["hits"]]
    assert data.docs["norm"] not in ranked and "graph" not in off
    got = [h["document_id"] for h in on["hits"]]
    assert data.docs["norm"] in got and data.docs["geheim"] not in got  # hidden: never pulled in
    assert [d for d in got if d in ranked] == ranked  # every ranked document, in its order
    added = next(h for h in on["hits"] if h["document_id"] == data.docs["norm"])
    assert added["match_reason"] == "graph"
    seed = next(h for h in on["hits"] if h["document_id"] == data.docs["urteil_a"])
    assert added["score"] == pytest.approx(seed["score"] * 0.5)
    assert on["graph"] == {"status": "ok", "seeds": 2, "cited": 1, "added": 1}  # `geheim` left out by the scope
    # A filter the cited document does not pass keeps it out too.
    narrowed = ask(graph, data, settings, filters={"version_status": "draft"})
    assert narrowed["hits"] == []


def test_a_failing_augmentation_answers_without_it_flagged_and_counted(
    servers: tuple[Server, Server], data: Data, settings: Settings, engine: Engine
) -> None:
    _, graph = servers
    before = graph.metric("ki_search_graph_augmentation_total", result="failed")
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE relations RENAME TO relations_moved_by_test"))
    try:
        answer = ask(graph, data, settings)
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE relations_moved_by_test RENAME TO relations"))
    assert answer["graph"]["status"] == "failed" and answer["hits"]
    assert data.docs["norm"] not in {h["document_id"] for h in answer["hits"]}
    assert graph.metric("ki_search_graph_augmentation_total", result="failed") == before + 1
    assert ask(graph, data, settings)["graph"]["status"] == "ok"  # back once the table is


def test_the_authoritative_class_is_always_on_the_first_page(
    isolation: dict[str, str], servers: tuple[Server, Server], data: Data, settings: Settings
) -> None:
    plain, _ = servers
    srv = Server("authoritative-api", **isolation, KI_RETRIEVAL__AUTHORITATIVE_DOC_TYPE=f"gesetz-{data.tag}")
    srv.start()
    try:
        ranked = [h["document_id"] for h in ask(plain, data, settings, limit=3)["hits"]]
        assert data.docs["paragraf"] not in ranked
        page = ask(srv, data, settings, limit=3)["hits"]
        assert [h["document_id"] for h in page] == [*ranked[:2], data.docs["paragraf"]]  # at the page's end
        assert page[-1]["match_reason"] == "authoritative"
        whole = [h["document_id"] for h in ask(srv, data, settings)["hits"]]
        assert whole.count(data.docs["paragraf"]) == 1 and set(whole) == set(
            h["document_id"] for h in ask(plain, data, settings)["hits"]
        )  # nothing dropped, nothing twice
        second = ask(srv, data, settings, limit=3, offset=3)["hits"]
        assert data.docs["paragraf"] not in [h["document_id"] for h in second]  # first page only
    finally:
        srv.stop()
