"""The identity preflight end to end: documents written to PostgreSQL, synced by a real worker, queried
over HTTP. The expected answers below are written by hand from the world (not computed by the matcher):
which document each name belongs to, which names are shared, shadowed or hidden from whom."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ki.settings import Settings, load_settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import RerankGateway, Server, SyncWorker, isolated, wait_until_vectored
from tests.integration.world import World

pytestmark = pytest.mark.stack

BODY = "Die Parteien vereinbaren Folgendes. Stichwort {word}. {extra}"


@dataclass
class Data:
    tag: str
    word: str
    docs: dict[str, int]
    versions: dict[str, int]
    projects: list[int]
    sources: list[int]

    def token(self, settings: Settings, who: str) -> str:
        return mint_token(settings.api, f"{who}-{self.tag}")


@pytest.fixture(scope="module")
def isolation(settings: Settings) -> Iterator[dict[str, str]]:
    with isolated(settings, prefix="ki-identity-test") as env:
        yield env


@pytest.fixture(scope="module")
def server(isolation: dict[str, str]) -> Iterator[Server]:
    worker = SyncWorker(isolation)
    worker.start()
    srv = Server("identity-api", **isolation)
    srv.start()
    yield srv
    srv.stop()
    worker.stop()


# anna sees every document of project P; ben only `gutachten_a`; nobody of ours sees project Q.
# "§ 573 BGB" is carried by six documents of P (a citation, more than retrieval.name_lookup.max_candidates = 5).
#   key            title                                                  identifiers
#   miete          Mietvertrag Hauptstraße 5, Berlin – Müller GmbH       V-2023-00417, § 573 BGB
#   urteil         Urteil Landgericht Berlin, Az. 5 O 1234/22 – …        5 O 1234/22, § 573 BGB   (2 versions)
#   berufung       Berufungsbegründung                                   12 U 77/23, § 573 BGB
#   bgh            Revisionsentscheidung Bundesgerichtshof               VII ZR 45/21, § 242 BGB, § 573 BGB
#   gutachten_a/b  Gutachten zur Mietpreisbremse (both)                  GA-2024-0001 / GA-2024-0002
#   atlas          Atlas Migration                                       § 573 BGB
#   atlas_plan     Atlas Migration Weekly Plan                           § 573 BGB
#   hidden (Q)     Vergleichsvereinbarung Nordhafen                      3 O 999/24
#   hidden_twin(Q) Berufungsbegründung                                   12 U 77/23
@pytest.fixture(scope="module")
def data(engine: Engine, server: Server, settings: Settings) -> Iterator[Data]:
    with engine.begin() as conn:
        w = World(conn)
        word = f"qzv{w.tag}"
        p, q = w.project("Identität"), w.project("Verborgen")
        source = w.source("local_fs")
        obj = w.source_object(source)
        docs: dict[str, int] = {}
        versions: dict[str, int] = {}

        def add(key: str, project: int, title: str, identifiers: list[str], extra: str = "") -> None:
            docs[key] = w.document(project, title, identifiers=identifiers)
            versions[key] = w.version(docs[key], BODY.format(word=word, extra=extra or title))
            w.observe(versions[key], obj)

        add("miete", p, "Mietvertrag Hauptstraße 5, Berlin – Müller GmbH", ["V-2023-00417", "§ 573 BGB"])
        docs["urteil"] = w.document(
            p, "Urteil Landgericht Berlin, Az. 5 O 1234/22 – Schulz ./. Weber", identifiers=["5 O 1234/22", "§ 573 BGB"]
        )
        early = w.version(docs["urteil"], BODY.format(word=word, extra="Erste Fassung."), doc_date=dt.date(2023, 1, 10))
        versions["urteil"] = w.version(
            docs["urteil"], BODY.format(word=word, extra="Zweite Fassung."), version_no=2, doc_date=dt.date(2024, 3, 1)
        )
        versions["urteil_early"] = early
        w.observe(early, obj)
        w.observe(versions["urteil"], obj)
        add("berufung", p, "Berufungsbegründung", ["12 U 77/23", "§ 573 BGB"])
        add("bgh", p, "Revisionsentscheidung Bundesgerichtshof", ["VII ZR 45/21", "§ 242 BGB", "§ 573 BGB"])
        add("gutachten_a", p, "Gutachten zur Mietpreisbremse", ["GA-2024-0001"], "Erstes Gutachten.")
        add("gutachten_b", p, "Gutachten zur Mietpreisbremse", ["GA-2024-0002"], "Zweites Gutachten.")
        add("atlas", p, "Atlas Migration", ["§ 573 BGB"])
        add("atlas_plan", p, "Atlas Migration Weekly Plan", ["§ 573 BGB"])
        # A long document (several body chunks) for chunk expansion; each paragraph carries a marker.
        long_body = " ".join(
            f"Absatz {n} Marker{n}x{w.tag}. " + "Der Mieter hat die Mietsache pfleglich zu behandeln. " * 22
            for n in range(6)
        )
        docs["lang"] = w.document(p, "Hausordnung Nordstadt Anlage", identifiers=[])
        versions["lang"] = w.version(docs["lang"], f"{word} {long_body}", doc_date=dt.date(2020, 1, 1))
        w.observe(versions["lang"], obj)
        add("kaution", p, "Mietvertrag Anlage Sicherheit", [], "Die Mietsicherheit beträgt drei Monatsmieten.")
        add("hidden", q, "Vergleichsvereinbarung Nordhafen", ["3 O 999/24"])
        add("hidden_twin", q, "Berufungsbegründung", ["12 U 77/23"])
        w.grant("project", p, f"user:anna-{w.tag}")
        w.grant("document", docs["gutachten_a"], f"user:ben-{w.tag}")
        w.grant("project", q, f"user:nobody-{w.tag}")
        d = Data(w.tag, word, docs, versions, [p, q], [source])
    admin = mint_token(settings.api, "root", roles=["admin"])

    def all_indexed() -> bool:  # metadata-only search lists every version (ranked search collapses them)
        status, body = server.call("/v1/search/filter", {"limit": 50, "filters": {"project_id": d.projects}}, admin)
        if status == 503:
            return False
        assert status == 200, body
        return {h["version_id"] for h in body["hits"]} >= set(versions.values())

    try:
        wait_for(all_indexed, timeout=120, what="the identity world in the index")
        index = load_settings(environ={**os.environ, **server.process.env}).retrieval.index_name
        wait_until_vectored(settings, index, {"terms": {"project_id": [str(p) for p in d.projects]}}, "the world")
        yield d
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM projects WHERE id = ANY(:p)"), {"p": d.projects})
            conn.execute(text("DELETE FROM sources WHERE id = ANY(:s)"), {"s": d.sources})


def ask(server: Server, data: Data, settings: Settings, who: str, query: str, **extra: Any) -> dict[str, Any]:
    status, body = server.call(
        "/v1/search", {"query": query, "limit": 10, "explain": True, **extra}, data.token(settings, who)
    )
    assert status == 200, body
    return body


# Each name of a document anna alone can name, in the spellings lawyers type.
UNAMBIGUOUS = {
    "miete": [
        "V-2023-00417",
        "v-2023-00417",
        "V 2023 00417",
        "Vertrag V2023-00417 kündigen",
        "Mietvertrag Hauptstraße 5, Berlin – Müller GmbH",
        "mietvertrag hauptstrasse 5 berlin müller gmbh",
        "MIETVERTRAG HAUPTSTRASSE 5 BERLIN - MÜLLER GMBH",
    ],
    "urteil": [
        "5 O 1234/22",
        "5 o 1234/22",
        "5O 1234/22",
        "5 O 1234-22",
        "Was sagt das Urteil Az. 5 O 1234 / 22 zur Kündigung?",
        "Urteil Landgericht Berlin, Az. 5 O 1234/22 – Schulz ./. Weber",
    ],
    "berufung": ["12 U 77/23", "12U 77/23", "Berufungsbegründung", " berufungsbegründung! "],
    "bgh": ["VII ZR 45/21", "vii zr 45-21", "§ 242 BGB", "§242 BGB", "§242BGB Treu und Glauben"],
    "gutachten_a": ["GA-2024-0001", "ga 2024 0001"],
    "atlas": ["Atlas Migration", "atlas migration status"],
    "atlas_plan": ["Atlas Migration Weekly Plan", "Stand des Atlas Migration Weekly Plan?"],
}


def test_a_named_document_is_the_top_hit_in_every_spelling(server: Server, data: Data, settings: Settings) -> None:
    misses = []
    for key, queries in UNAMBIGUOUS.items():
        for query in queries:
            body = ask(server, data, settings, "anna", query)
            first = body["hits"][0] if body["hits"] else {}
            if first.get("document_id") != data.docs[key] or first.get("match_reason") not in ("identifier", "title"):
                misses.append((query, key, body["identity"], first.get("document_id")))
            assert "ambiguous" not in body, (query, body["ambiguous"])
            assert [h["match_reason"] for h in body["hits"][1:]] == ["ranked"] * (len(body["hits"]) - 1)
            assert data.docs[key] not in [h["document_id"] for h in body["hits"][1:]]  # collapsed away
    assert not misses, misses


def test_the_reason_says_which_name_matched(server: Server, data: Data, settings: Settings) -> None:
    assert ask(server, data, settings, "anna", "12 U 77/23")["hits"][0]["match_reason"] == "identifier"
    body = ask(server, data, settings, "anna", "Berufungsbegründung")
    assert body["hits"][0]["match_reason"] == "title"
    assert body["identity"]["outcome"] == "unique"
    assert body["identity"]["subjects"][0]["matched"] == "berufungsbegründung"
    # A one-word title inside a longer query is a topic, not a name (retrieval.name_lookup.min_title_tokens = 2).
    assert ask(server, data, settings, "anna", "Berufungsbegründung Frist")["identity"]["outcome"] == "none"


def test_a_shared_title_is_reported_as_ambiguous_not_picked(server: Server, data: Data, settings: Settings) -> None:
    body = ask(server, data, settings, "anna", "Gutachten zur Mietpreisbremse")
    assert sorted(c["document_id"] for c in body["ambiguous"]) == sorted(
        [data.docs["gutachten_a"], data.docs["gutachten_b"]]
    )
    assert {c["why"] for c in body["ambiguous"]} == {"title"}
    assert all(h["match_reason"] == "ranked" for h in body["hits"])
    # Two different named titles are two subjects as well.
    body = ask(server, data, settings, "anna", "Atlas Migration und Mietvertrag Hauptstraße 5, Berlin – Müller GmbH")
    assert sorted(c["document_id"] for c in body["ambiguous"]) == sorted([data.docs["atlas"], data.docs["miete"]])


def test_shadowed_title_leaves_the_identity_group(server: Server, data: Data, settings: Settings) -> None:
    body = ask(server, data, settings, "anna", "Atlas Migration Weekly Plan")
    assert body["identity"]["shadowed"] == ["atlas migration"]
    assert body["hits"][0]["document_id"] == data.docs["atlas_plan"]
    # The shadowed document keeps its rank on merit: it is still among the ranked hits.
    assert data.docs["atlas"] in [h["document_id"] for h in body["hits"][1:]]


def test_a_citation_many_documents_carry_names_nothing(server: Server, data: Data, settings: Settings) -> None:
    body = ask(server, data, settings, "anna", "§ 573 BGB")
    assert body["identity"]["outcome"] == "none"
    assert body["identity"]["common"] == ["573 bgb"]
    assert "ambiguous" not in body
    assert all(h["match_reason"] == "ranked" for h in body["hits"])


def test_only_names_the_caller_may_see_take_part(server: Server, data: Data, settings: Settings) -> None:
    hidden = {data.docs["hidden"], data.docs["hidden_twin"]}
    for query in ("3 O 999/24", "Vergleichsvereinbarung Nordhafen"):
        body = ask(server, data, settings, "anna", query)
        assert body["identity"]["outcome"] == "none", body["identity"]
        assert not hidden & {h["document_id"] for h in body["hits"]}
    # The invisible twin of a title does not make anna's answer ambiguous.
    body = ask(server, data, settings, "anna", "12 U 77/23")
    assert body["identity"]["outcome"] == "unique" and "ambiguous" not in body
    # ben sees one of the two Gutachten: for him the title is unique, and the other is never mentioned.
    body = ask(server, data, settings, "ben", "Gutachten zur Mietpreisbremse")
    assert body["hits"][0]["document_id"] == data.docs["gutachten_a"]
    assert "ambiguous" not in body
    assert [s["document_id"] for s in body["identity"]["subjects"]] == [data.docs["gutachten_a"]]
    for query in ("GA-2024-0002", "Mietvertrag Hauptstraße 5, Berlin – Müller GmbH", "3 O 999/24"):
        body = ask(server, data, settings, "ben", query)
        assert body["identity"]["outcome"] == "none", (query, body["identity"])
        assert {h["document_id"] for h in body["hits"]} <= {data.docs["gutachten_a"]}
    # A stranger names nothing and finds nothing.
    body = ask(server, data, settings, "stranger", "5 O 1234/22")
    assert body["hits"] == [] and body["identity"]["outcome"] == "none"
    assert body["reason"] == "scope_empty"


def test_point_in_time_picks_the_version_in_force(server: Server, data: Data, settings: Settings) -> None:
    now = ask(server, data, settings, "anna", "5 O 1234/22")
    assert now["hits"][0]["version_id"] == data.versions["urteil"]
    then = ask(server, data, settings, "anna", "5 O 1234/22", as_of="2023-06-30")
    assert then["hits"][0]["version_id"] == data.versions["urteil_early"]
    assert then["hits"][0]["match_reason"] == "identifier"
    # Ranked hits on that day are the versions in force then: nothing dated later (all but two are 2024's).
    ranked = ask(server, data, settings, "anna", data.word, as_of="2023-06-30")
    assert {h["version_id"] for h in ranked["hits"]} == {data.versions["urteil_early"], data.versions["lang"]}
    before = ask(server, data, settings, "anna", "5 O 1234/22", as_of="2019-06-01")
    assert before["identity"]["outcome"] == "none" and before["hits"] == []
    assert before["reason"] == "filtered_out"


def test_paging_keeps_the_identity_hit_on_the_first_page_only(server: Server, data: Data, settings: Settings) -> None:
    whole = ask(server, data, settings, "anna", f"12 U 77/23 {data.word}")
    pages = [
        ask(server, data, settings, "anna", f"12 U 77/23 {data.word}", limit=3, offset=offset) for offset in (0, 3, 6)
    ]
    assert [h["chunk_id"] for p in pages for h in p["hits"]] == [h["chunk_id"] for h in whole["hits"]][:9]
    assert whole["hits"][0]["document_id"] == data.docs["berufung"]


def test_the_reranker_reorders_the_ranked_head_and_the_identity_hit_stays_first(
    server: Server, isolation: dict[str, str], data: Data, settings: Settings
) -> None:
    query = f"12 U 77/23 {data.word}"
    fused = ask(server, data, settings, "anna", query)
    gateway = RerankGateway()  # "reverse": scores the passages so that their order turns round
    gateway.start()
    srv = Server("identity-rerank-api", **isolation, KI_RETRIEVAL__RERANK_ENABLED="true",
                 KI_RETRIEVAL__RERANK__URL=gateway.url)  # fmt: skip
    srv.start()
    try:
        body = ask(srv, data, settings, "anna", query)
        first = body["hits"][0]
        assert first["document_id"] == data.docs["berufung"] and first["match_reason"] == "identifier", first
        assert gateway.requests, "the reranker was never asked"
        ranked = [h["chunk_id"] for h in body["hits"][1:]]
        assert ranked != [h["chunk_id"] for h in fused["hits"][1:]], "the ranked head was not reordered"
        assert any(h["explain"].get("rerank_score") is not None for h in body["hits"][1:])
    finally:
        srv.stop()
        gateway.stop()


def test_identity_can_be_switched_off(isolation: dict[str, str], data: Data, settings: Settings) -> None:
    srv = Server("identity-off-api", **isolation, KI_RETRIEVAL__NAME_LOOKUP_ENABLED="false")
    srv.start()
    try:
        body = ask(srv, data, settings, "anna", "Gutachten zur Mietpreisbremse")
        assert body["identity"]["outcome"] == "off" and "ambiguous" not in body
        assert all(h["match_reason"] == "ranked" for h in body["hits"])
    finally:
        srv.stop()


def test_bad_as_of_is_a_400_naming_the_field(server: Server, data: Data, settings: Settings) -> None:
    status, body = server.call("/v1/search", {"query": "x", "as_of": "gestern"}, data.token(settings, "anna"))
    assert status == 400 and body["field"] == "as_of", body
    status, doc = server.call("/openapi.json")
    assert "as_of" in doc["components"]["schemas"]["SearchRequest"]["properties"]


def test_expand_adds_the_neighbouring_chunks_of_the_same_version(
    server: Server, data: Data, settings: Settings
) -> None:
    body = ask(server, data, settings, "anna", f"Marker3x{data.tag}", mode="lexical", expand=True, limit=1)
    hit = body["hits"][0]
    assert hit["document_id"] == data.docs["lang"] and hit["chunk_id"].split(":")[1] == "chunk"
    version, _, ordinal = hit["chunk_id"].split(":")
    context = hit["context"]
    assert [c["position"] for c in context] == ["before", "after"]
    assert [c["chunk_id"] for c in context] == [
        f"{version}:chunk:{int(ordinal) - 1}",
        f"{version}:chunk:{int(ordinal) + 1}",
    ]
    assert f"Marker3x{data.tag}" in hit["text"]
    assert all(c["text"] and c["text"] != hit["text"] for c in context)
    assert "timings_ms" not in body  # operators only
    operator = mint_token(settings.api, f"anna-{data.tag}", roles=["operator"])
    request = {"query": f"Marker3x{data.tag}", "mode": "lexical", "expand": True, "limit": 1}
    assert "expand" in server.call("/v1/search", request, operator)[1]["timings_ms"]
    # Without expand: no context.
    assert "context" not in ask(server, data, settings, "anna", f"Marker3x{data.tag}", limit=1)["hits"][0]


def test_expand_cap_decay_and_synonyms(
    isolation: dict[str, str], data: Data, settings: Settings, server: Server
) -> None:
    srv = Server("shaping-api", **isolation, KI_RETRIEVAL__NEIGHBOURS_MAX_CHUNKS_PER_DOCUMENT="2",
                 KI_RETRIEVAL__DECAY_ENABLED="true", KI_RETRIEVAL__DECAY_MIN_WEIGHT="0.5",
                 KI_RETRIEVAL__SYNONYMS_ENABLED="true")  # fmt: skip
    srv.start()
    try:
        body = ask(srv, data, settings, "anna", f"Marker3x{data.tag}", mode="lexical", expand=True, limit=1)
        assert len(body["hits"][0]["context"]) == 1  # the hit and one neighbour: 2 chunks of the document
        # Decay: the 2020 document's score carries its age factor (as of the request's day).
        body = ask(srv, data, settings, "anna", f"Marker3x{data.tag}", mode="lexical", as_of="2024-01-01", limit=1)
        explain = body["hits"][0]["explain"]
        age_years = (dt.date(2024, 1, 1) - dt.date(2020, 1, 1)).days / 365.25
        assert explain["decay"] == pytest.approx(0.5 + 0.5 / (1 + age_years))
        assert explain["fused_score"] == pytest.approx(
            explain["rrf_score"] * explain["status_boost"] * explain["decay"]
        )
        # Synonyms (the shipped list): "Kaution" finds the document that says "Mietsicherheit"; off, it does not.
        found = ask(srv, data, settings, "anna", "Kaution", mode="lexical")
        assert found["synonyms_added"] == ["Mietsicherheit"]
        assert found["hits"][0]["document_id"] == data.docs["kaution"]
        plain = ask(server, data, settings, "anna", "Kaution", mode="lexical")
        assert plain["hits"] == [] and plain["synonyms_added"] == []
    finally:
        srv.stop()


def test_an_empty_answer_says_why(server: Server, data: Data, settings: Settings) -> None:
    drafts = ask(server, data, settings, "anna", data.word, filters={"version_status": "draft"})
    assert drafts["hits"] == [] and drafts["reason"] == "filtered_out"
    nothing = ask(server, data, settings, "anna", f"xylophon{data.tag}", mode="lexical")
    assert nothing["hits"] == [] and nothing["reason"] == "no_credible_evidence"
    assert "reason" not in ask(server, data, settings, "anna", data.word)
    # ben's project filter names a project he sees nothing of: his scope there is empty.
    narrowed = ask(server, data, settings, "ben", data.word, filters={"project_id": data.projects[1]})
    assert narrowed["hits"] == [] and narrowed["reason"] == "scope_empty"


def test_statistics_count_every_ranked_query_for_administrators_only(
    server: Server, data: Data, settings: Settings
) -> None:
    admin = mint_token(settings.api, "root", roles=["admin"])
    status, before = server.call("/v1/stats", token=admin)
    assert status == 200 and before["enabled"] is True
    zero_before = server.metric("ki_search_zero_results_total", reason="no_credible_evidence")
    ask(server, data, settings, "anna", "5 O 1234/22")  # unique
    ask(server, data, settings, "anna", f"xylophon{data.tag}", mode="lexical")  # empty
    status, after = server.call("/v1/stats", token=admin)  # written before it is read
    assert status == 200
    assert after["queries"] >= before["queries"] + 2
    assert after["zero_result"] >= before["zero_result"] + 1
    assert after["identity"].get("unique", 0) >= before["identity"].get("unique", 0) + 1
    assert after["reason"].get("no_credible_evidence", 0) >= before["reason"].get("no_credible_evidence", 0) + 1
    assert after["top_zero_result_queries"] == [] or all(q["query"] for q in after["top_zero_result_queries"])
    assert f"xylophon{data.tag}" not in json.dumps(after)  # no query text unless enabled
    assert server.metric("ki_search_zero_results_total", reason="no_credible_evidence") == zero_before + 1
    # Not an administrator: 403; bad input: 400 naming the field; no token: 401.
    status, body = server.call("/v1/stats", token=data.token(settings, "anna"))
    assert status == 403 and body["error"] == "forbidden"
    status, body = server.call("/v1/stats?hours=abc", token=admin)
    assert status == 400 and body["field"] == "hours"
    assert server.call("/v1/stats?hours=0", token=admin)[0] == 400
    assert server.call("/v1/stats")[0] == 401


def test_statistics_keep_query_text_only_when_enabled_and_stay_bounded(
    isolation: dict[str, str], data: Data, settings: Settings, engine: Engine
) -> None:
    srv = Server("stats-api", **isolation, KI_API__STATS__STORE_QUERY_TEXT="true", KI_API__STATS__MAX_ROWS="5")
    srv.start()
    try:
        for n in range(8):
            ask(srv, data, settings, "anna", f"nirgends{n}x{data.tag}", mode="lexical")
        admin = mint_token(settings.api, "root", roles=["admin"])
        status, body = srv.call("/v1/stats", token=admin)
        assert status == 200
        zero = {q["query"] for q in body["top_zero_result_queries"]}
        assert f"nirgends7x{data.tag}" in zero
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM ki_search_stats")).scalar_one()
        assert rows <= 5
    finally:
        srv.stop()


def test_semantic_floor_turns_a_least_bad_match_into_an_honest_empty_answer(
    isolation: dict[str, str], data: Data, settings: Settings, server: Server
) -> None:
    from ki.embedding import create_embedder

    signature = create_embedder(settings).signature
    off_topic = f"Quantenchromodynamik der Gluonen {data.tag}"
    shipped = ask(server, data, settings, "anna", off_topic, mode="semantic")  # the floor stored for the model
    assert shipped["semantic_floor"]["similarity"] == settings.retrieval.semantic_floor.get(signature)
    floors = json.dumps({signature: 0.9999, "another-model-384": -1.0})
    off = Server("floor-off-api", **isolation, KI_RETRIEVAL__SEMANTIC_FLOOR_ENABLED="false")
    srv = Server("floor-api", **isolation, KI_RETRIEVAL__SEMANTIC_FLOOR_ENABLED="true",
                 KI_RETRIEVAL__SEMANTIC_FLOOR=floors)  # fmt: skip
    off.start()
    srv.start()
    try:
        plain = ask(off, data, settings, "anna", off_topic, mode="semantic")
        assert plain["hits"], "without a floor the nearest chunks are returned, however far"
        assert plain["semantic_floor"] == {"similarity": None, "dropped": 0}
        floored = ask(srv, data, settings, "anna", off_topic, mode="semantic")
        assert floored["hits"] == [] and floored["reason"] == "no_credible_evidence"
        assert floored["semantic_floor"]["similarity"] == 0.9999 and floored["semantic_floor"]["dropped"] > 0
        # The lexical leg has no floor: a query that matches words still answers in hybrid mode.
        hybrid = ask(srv, data, settings, "anna", data.word, mode="hybrid")
        assert hybrid["hits"] and all("semantic" not in h["explain"]["ranks"] for h in hybrid["hits"])
    finally:
        srv.stop()
        off.stop()


def test_evidence_budget_stops_in_rank_order_and_pages_on_without_a_gap(
    server: Server, data: Data, settings: Settings
) -> None:
    whole = ask(server, data, settings, "anna", data.word, mode="lexical")
    texts = [len(h["text"]) for h in whole["hits"]]
    assert len(texts) >= 3 and "evidence" not in whole
    budget = texts[0] + texts[1] + 1  # two hits fit, the third does not
    first = ask(server, data, settings, "anna", data.word, mode="lexical", evidence_budget_chars=budget)
    assert [h["chunk_id"] for h in first["hits"]] == [h["chunk_id"] for h in whole["hits"][:2]]
    assert first["evidence"] == {
        "budget_chars": budget, "used_chars": texts[0] + texts[1], "hits_dropped": len(texts) - 2, "next_offset": 2,
    }  # fmt: skip
    assert first["has_more"] is True
    rest = ask(server, data, settings, "anna", data.word, mode="lexical", offset=first["evidence"]["next_offset"])
    assert rest["hits"][0]["chunk_id"] == whole["hits"][2]["chunk_id"]
    # A budget smaller than the best hit cuts that hit's text rather than answering with nothing.
    tiny = ask(server, data, settings, "anna", data.word, mode="lexical", evidence_budget_chars=10)
    assert len(tiny["hits"]) == 1 and tiny["hits"][0]["text"] == whole["hits"][0]["text"][:10]
    assert tiny["hits"][0]["text_truncated"] is True
    for bad in (0, -5, "viel", 10**9):
        status, body = server.call(
            "/v1/search", {"query": "x", "evidence_budget_chars": bad}, data.token(settings, "anna")
        )
        assert status == 400 and body["field"] == "evidence_budget_chars", body
    status, doc = server.call("/openapi.json")
    schemas = doc["components"]["schemas"]
    assert "evidence_budget_chars" in schemas["SearchRequest"]["properties"]
    assert {"evidence", "semantic_floor"} <= set(schemas["SearchResponse"]["properties"])


def test_the_chunk_cap_applies_to_the_fused_pool_before_the_cut(
    isolation: dict[str, str], data: Data, settings: Settings
) -> None:
    """retrieval.max_chunks_per_document (no second setting): a long document whose every chunk matches
    keeps that many hits, and the page goes on with the other documents instead of more of its chunks."""
    srv = Server("chunk-cap-api", **isolation, KI_RETRIEVAL__COLLAPSE_PER_DOCUMENT="false")
    srv.start()
    try:
        body = ask(srv, data, settings, "anna", f"{data.word} Mietsache pfleglich behandeln", mode="lexical", limit=20)
        per_document: dict[int, int] = {}
        for h in body["hits"]:
            per_document[h["document_id"]] = per_document.get(h["document_id"], 0) + 1
        assert per_document[data.docs["lang"]] == settings.retrieval.max_chunks_per_document  # it has 6+ chunks
        anna_sees = {data.docs[k] for k in data.docs if k not in ("hidden", "hidden_twin")}
        assert set(per_document) == anna_sees, body["hits"]  # every other document of hers is on the page
        assert max(per_document.values()) <= settings.retrieval.max_chunks_per_document
    finally:
        srv.stop()


def test_the_identity_cache_answers_repeats_and_follows_new_and_renamed_titles(
    engine: Engine, server: Server, data: Data, settings: Settings
) -> None:
    """A name looked up once is answered from the identity cache (no SQL) while the feed is current; a
    document that starts to carry a cached name, or stops, is named accordingly as soon as its change
    event arrives. A cache that missed either event would keep the stale answer until the deadline."""
    title, renamed = f"Pachtvertrag Seeblick {data.tag}", f"Pachtvertrag Uferweg {data.tag}"

    def hits() -> float:
        return server.metric("ki_search_identity_cache_total", result="hit")

    assert ask(server, data, settings, "anna", title)["identity"]["outcome"] == "none"

    def from_cache() -> bool:  # the feed may still be catching up with the fixture's own events
        before = hits()
        return ask(server, data, settings, "anna", title)["identity"]["outcome"] == "none" and hits() > before

    wait_for(from_cache, timeout=60, what="a repeated name answered from the identity cache")
    with engine.begin() as conn:
        w = World(conn)
        doc = w.document(data.projects[0], title, identifiers=[])
        w.observe(w.version(doc, "Die Pacht beträgt monatlich 400 Euro."), w.source_object(data.sources[0]))

    def named(query: str) -> bool:
        body = ask(server, data, settings, "anna", query)
        # SQL may name the document before its rows are indexed (a loaded machine): then no hit yet.
        hits = body["hits"]
        return body["identity"]["outcome"] == "unique" and bool(hits) and hits[0]["document_id"] == doc

    wait_for(lambda: named(title), timeout=120, what="the new document named by its cached title")
    with engine.begin() as conn:
        conn.execute(text("UPDATE documents SET title = :t WHERE id = :d"), {"t": renamed, "d": doc})
    wait_for(lambda: named(renamed), timeout=120, what="the renamed document named by its new title")
    # The new title was never cached; the old one was (naming the document) until the change event came.
    wait_for(
        lambda: ask(server, data, settings, "anna", title)["identity"]["outcome"] == "none",
        timeout=120,
        what="the old title naming nothing once the rename's event arrived",
    )
