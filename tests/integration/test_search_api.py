"""The search API end to end: rows written to PostgreSQL, synced by a real `ki sync run` worker through
Debezium and Kafka into OpenSearch, queried over real HTTP against a real `ki serve` process."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jwt as pyjwt
import pytest
from sqlalchemy import Engine, text

from apps.runtime.processes import free_port
from ki import exposition
from ki.clients import make_sync_client
from ki.settings import Settings, load_settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import RerankGateway, Server, SyncWorker, isolated, wait_until_vectored
from tests.integration.world import World

pytestmark = pytest.mark.stack


@dataclass
class Data:
    tag: str
    word: str
    identifier: str
    project: int
    project2: int
    empty_project: int
    docs: dict[str, int]
    versions: dict[str, int]
    observations: dict[str, int]
    carol_grant: int
    member_ids: list[int]
    sources: list[int]

    def user(self, name: str) -> str:
        return f"{name}-{self.tag}"


TEXT = (
    "Der Verkäufer übergibt dem Käufer die Sache frei von Sach- und Rechtsmängeln. Stichwort {word}. "
    "Die Gewährleistung richtet sich nach den gesetzlichen Vorschriften, {extra}."
)


@pytest.fixture(scope="module")
def isolation(settings: Settings) -> Iterator[dict[str, str]]:
    with isolated(settings) as env:
        yield env


@pytest.fixture(scope="module")
def iso_settings(isolation: dict[str, str]) -> Settings:
    return load_settings(environ={**os.environ, **isolation})


@pytest.fixture(scope="module")
def worker(isolation: dict[str, str]) -> Iterator[SyncWorker]:
    w = SyncWorker(isolation)
    w.start()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def server(isolation: dict[str, str]) -> Iterator[Server]:
    s = Server(**isolation, KI_API__OPS__METRICS_TOKEN=METRICS_TOKEN)
    s.start()
    yield s
    s.stop()


# Who may see what in the `data` world (all documents carry the module's unique word):
#   bob      a b c        via group team (document allows)
#   alice    a b          team, but a document deny on c
#   carol    d            document allow (revoked by a test)
#   erin     e f          document allows; e executed (boost 1.2), f draft (0.7)
#   eve      g i          document allows (g in project2, i on object o_deny)
#   dan      j            same allows as eve plus j, but a project deny on project2 and an object deny on o_deny
#   ivan     k l          mirrored source-object allows on external objects; in intersect mode only l, which
#                         also has a local allow; never m (known ACL without a grant for ivan, local allow
#                         cannot override) nor n (external object without mirrored grants, fails closed)
#   admin    everything with an active observation; o loses its observation in a test
@pytest.fixture(scope="module")
def data(engine: Engine, worker: SyncWorker, server: Server, settings: Settings) -> Iterator[Data]:
    with engine.begin() as conn:
        w = World(conn)
        word = f"zqx{w.tag}"
        identifier = f"4 AZR {int(w.tag, 16) % 90000 + 10000}/23"
        project, project2, empty_project = w.project("Suche"), w.project("Zweit"), w.project("Leer")
        source, sharepoint = w.source("local_fs"), w.source("sharepoint")
        obj = w.source_object(source)  # local_fs, no object ACL: delegates to the project boundary
        o_deny = w.source_object(source)
        docs: dict[str, int] = {}
        versions: dict[str, int] = {}
        observations: dict[str, int] = {}

        def add(key: str, extra: str, *, in_project: int = project, at: int = obj, status: str = "final") -> None:
            ids = [identifier] if key == "b" else [f"HRB {key.upper()} {w.tag}"]
            docs[key] = w.document(in_project, f"Kaufvertrag {key.upper()} {w.tag}", identifiers=ids)
            versions[key] = w.version(docs[key], TEXT.format(word=word, extra=extra), status=status)
            observations[key] = w.observe(versions[key], at)

        add("a", "Lieferung erfolgt am Monatsende")
        add("b", "Rücktritt ist ausgeschlossen")
        add("c", "Abnahme durch den Käufer")
        add("d", "Zahlung binnen vierzehn Tagen")
        add("e", "Vertrag ist unterzeichnet", status="executed")
        add("f", "Entwurf zur Abstimmung", status="draft")
        add("g", "Mietsache im zweiten Projekt", in_project=project2)
        add("i", "Objekt mit Sperre", at=o_deny)
        add("j", "Ohne Sperre")
        for key in "klmn":
            known = key != "n"  # n: an external object without a known ACL and without any grant
            add(key, f"Extern {key}", at=w.source_object(sharepoint, acl_known=known))
        add("o", "Beobachtung wird entfernt")

        team = f"group:team-{w.tag}"
        for key in "abc":
            w.grant("document", docs[key], team)
        w.grant("document", docs["c"], f"user:alice-{w.tag}", "deny")  # deny wins over the group allow
        carol_grant = w.grant("document", docs["d"], f"user:carol-{w.tag}")
        for key in "ef":
            w.grant("document", docs[key], f"user:erin-{w.tag}")
        for who, keys in (("eve", "gi"), ("dan", "gij")):
            for key in keys:
                w.grant("document", docs[key], f"user:{who}-{w.tag}")
        w.grant("project", project2, f"user:dan-{w.tag}", "deny")
        w.grant("source_object", o_deny, f"user:dan-{w.tag}", "deny")
        ext = {
            key: conn.execute(
                text("SELECT source_object_id FROM source_observations WHERE id = :o"), {"o": observations[key]}
            ).scalar_one()
            for key in "klmn"
        }
        w.grant("source_object", ext["k"], f"user:ivan-{w.tag}")
        w.grant("source_object", ext["l"], f"user:ivan-{w.tag}")
        w.grant("source_object", ext["m"], f"user:zed-{w.tag}")
        for key in "lmn":
            w.grant("document", docs[key], f"user:ivan-{w.tag}")
        members = [w.member(team, f"user:alice-{w.tag}"), w.member(team, f"user:bob-{w.tag}")]
        d = Data(
            w.tag,
            word,
            identifier,
            project,
            project2,
            empty_project,
            docs,
            versions,
            observations,
            carol_grant,
            members,
            [source, sharepoint],
        )
    admin = mint_token(settings.api, "root", roles=["admin"])

    def all_indexed() -> bool:
        status, body = server.call("/v1/search", {"query": word, "limit": 50}, admin)
        if status == 503:  # the worker creates the index alias with its first write
            return False
        assert status == 200, body
        return {h["document_id"] for h in body["hits"]} >= set(docs.values())

    try:
        wait_for(all_indexed, timeout=120, what="the new documents in the index")
        index = load_settings(environ={**os.environ, **server.process.env}).retrieval.index_name
        documents = {"terms": {"document_id": [str(doc) for doc in docs.values()]}}
        wait_until_vectored(settings, index, documents, "the new documents")
        yield d
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM group_memberships WHERE id = ANY(:ids)"), {"ids": members})
            conn.execute(text("DELETE FROM projects WHERE id = ANY(:p)"), {"p": [project, project2, empty_project]})
            conn.execute(text("DELETE FROM sources WHERE id = ANY(:s)"), {"s": d.sources})


def token(settings: Settings, data: Data, name: str) -> str:
    return mint_token(settings.api, data.user(name))


def doc_ids(body: dict[str, Any]) -> list[int]:
    return [h["document_id"] for h in body["hits"]]


def test_unauthorised_caller_gets_nothing(server: Server, data: Data, settings: Settings) -> None:
    status, body = server.call("/v1/search", {"query": data.word, "limit": 20}, token(settings, data, "mallory"))
    assert status == 200 and body["hits"] == []
    status, body = server.call("/v1/search/filter", {"limit": 20}, token(settings, data, "mallory"))
    assert status == 200 and body["hits"] == []


def test_granted_caller_finds_documents_with_citations_and_deny_wins(
    server: Server, data: Data, settings: Settings
) -> None:
    status, body = server.call("/v1/search", {"query": data.word, "limit": 20}, token(settings, data, "bob"))
    assert status == 200
    assert set(doc_ids(body)) == {data.docs["a"], data.docs["b"], data.docs["c"]}
    assert len(doc_ids(body)) == 3  # collapsed: one hit per document
    hit = body["hits"][0]
    assert hit["citation"]["project_id"] == data.project
    assert hit["citation"]["version_id"] == hit["version_id"] and hit["citation"]["source_object_ids"]
    assert hit["citation"]["chunk_id"] == hit["chunk_id"]
    assert "embedding" not in json.dumps(body)

    status, body = server.call("/v1/search", {"query": data.word, "limit": 20}, token(settings, data, "alice"))
    assert status == 200
    assert set(doc_ids(body)) == {data.docs["a"], data.docs["b"]}  # the document deny beats the group allow


def test_pages_equal_one_larger_window(server: Server, data: Data, settings: Settings) -> None:
    bob = token(settings, data, "bob")
    _, whole = server.call("/v1/search", {"query": data.word, "limit": 2}, bob)
    _, page1 = server.call("/v1/search", {"query": data.word, "limit": 1}, bob)
    _, page2 = server.call("/v1/search", {"query": data.word, "limit": 1, "offset": 1}, bob)
    assert doc_ids(page1) + doc_ids(page2) == doc_ids(whole)
    assert page1["has_more"] is True


def test_pasted_identifier_puts_its_document_first(server: Server, data: Data, settings: Settings) -> None:
    query = f"Was gilt nach {data.identifier.lower()} für {data.word}?"
    status, body = server.call(
        "/v1/search", {"query": query, "limit": 5, "explain": True}, token(settings, data, "bob")
    )
    assert status == 200
    first = body["hits"][0]
    assert first["document_id"] == data.docs["b"]
    assert first["matched_identifiers"] == [data.identifier]
    assert "identifier" in first["explain"]["ranks"]
    assert all(h["matched_identifiers"] == [] for h in body["hits"][1:])


def test_metadata_only_search(server: Server, data: Data, settings: Settings) -> None:
    status, body = server.call(
        "/v1/search/filter", {"limit": 50, "filters": {"project_id": data.project}}, token(settings, data, "bob")
    )
    assert status == 200
    assert sorted(doc_ids(body)) == sorted([data.docs["a"], data.docs["b"], data.docs["c"]])
    assert {h["score"] for h in body["hits"]} == {0.0}
    assert len({h["version_id"] for h in body["hits"]}) == len(body["hits"])


def test_auth_and_validation_errors(server: Server, data: Data, settings: Settings) -> None:
    status, body = server.call("/v1/search", {"query": data.word})
    assert status == 401 and body["error"] == "unauthorized"
    expired = mint_token(settings.api, "bob", ttl_s=1, now=0)
    assert server.call("/v1/search", {"query": data.word}, expired)[0] == 401
    bob = token(settings, data, "bob")
    status, body = server.call("/v1/search", {"query": data.word, "filters": {"doc_type": ["x"]}}, bob)
    assert status == 400 and body["field"] == "filters.doc_type"
    status, body = server.call("/v1/search", {"query": data.word, "principals": ["role:admin"]}, bob)
    assert status == 400 and body["field"] == "principals"
    assert server.call("/v1/search", raw=b"{not json", token=bob)[0] == 400
    status, body = server.call("/v1/search", {"query": data.word, "offset": 495, "limit": 10}, bob)
    assert status == 422 and body["error"] == "window_too_deep"
    status, body = server.call("/v1/search", {"query": "x" * (settings.api.limits.max_body_bytes + 10)}, bob)
    assert status == 413
    status, doc = server.call("/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.") and "/v1/search" in doc["paths"]
    assert "SearchFilters" in doc["components"]["schemas"]
    status, ready = server.call("/readyz")
    assert status == 200 and ready["checks"] == {"postgresql": "ok", "opensearch": "ok", "index": "ok"}


def test_a_token_cannot_forge_an_administrator_or_another_users_name(
    server: Server, data: Data, settings: Settings
) -> None:
    """A subject or group claim `role:admin` is a user and a group of that name, never an
    administrator; a name that full case folding merges with another user (long s, the Kelvin sign) is
    refused, not taken for that user; a `crit` header and a string `exp` are refused."""
    forged = mint_token(settings.api, "role:admin", groups=["role:admin", "system:admin"])
    status, me = server.call("/v1/me", token=forged)
    assert status == 200 and me["admin"] is False
    assert me["principals"] == ["user:role:admin", "group:role:admin", "group:system:admin"]
    assert server.call("/v1/search", {"query": data.word, "limit": 20}, forged)[1]["hits"] == []
    assert server.call("/v1/ops/overview", token=forged)[0] == 403
    for look_alike in (data.user("\u212aai"), data.user("anna.\u017fchmidt"), data.user("stra\u00dfe")):
        status, body = server.call("/v1/search", {"query": data.word}, mint_token(settings.api, look_alike))
        assert (status, body["error"]) == (401, "unauthorized"), look_alike
    now = int(time.time())
    claims = {"sub": data.user("bob"), "iss": settings.api.jwt.issuer, "aud": settings.api.jwt.audience}
    secret = settings.api.jwt.secret
    crit = pyjwt.encode({**claims, "exp": now + 60}, secret, algorithm="HS256", headers={"crit": ["x-policy"]})
    string_exp = pyjwt.encode({**claims, "exp": str(now + 60)}, secret, algorithm="HS256")
    for refused in (crit, string_exp):
        assert server.call("/v1/search", {"query": data.word}, refused)[0] == 401


def test_revoked_grant_disappears_at_once_while_the_index_is_stale(
    server: Server, worker: SyncWorker, data: Data, iso_settings: Settings, engine: Engine
) -> None:
    settings = iso_settings
    carol = token(settings, data, "carol")
    status, body = server.call("/v1/search", {"query": data.word}, carol)
    assert status == 200 and doc_ids(body) == [data.docs["d"]]
    client = make_sync_client(settings, timeout_s=30)
    worker.stop()  # nothing updates the index's principal projection from here on
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": data.carol_grant})
        status, body = server.call("/v1/search", {"query": data.word}, carol)
        assert status == 200 and body["hits"] == []
        client.indices.refresh(index=settings.retrieval.index_name)
        rows = client.search(
            index=settings.retrieval.index_name,
            body={"query": {"term": {"document_id": str(data.docs["d"])}}, "_source": ["allowed_principals"]},
        )["hits"]["hits"]
        assert rows and all(f"user:carol-{data.tag}" in r["_source"]["allowed_principals"] for r in rows)
    finally:
        worker.start()


def test_reverify_drops_a_candidate_revoked_after_scope_compilation(
    data: Data, iso_settings: Settings, engine: Engine
) -> None:
    """The SQL backstop on its own: a scope compiled before the revoke still lets the row through
    OpenSearch, and the re-verify must drop it."""
    settings = iso_settings
    import asyncio

    from ki.clients import make_async_engine, make_client
    from ki.embedding import create_embedder
    from search.request import parse_search_request
    from search.service import SearchService

    with engine.begin() as conn:
        grant = World(conn, tag=data.tag).grant("document", data.docs["a"], f"user:dave-{data.tag}")

    async def run() -> tuple[list[int], list[int]]:
        aengine, client = make_async_engine(settings), make_client(settings)
        try:
            service = SearchService(settings, aengine, client, create_embedder(settings))
            principals = [f"user:dave-{data.tag}"]
            request = parse_search_request({"query": data.word}, settings.api)
            scope = await service.compile_scope(principals, None)
            before = await service.search_in_scope(principals, request, scope)
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM grants WHERE id = :g"), {"g": grant})
            after = await service.search_in_scope(principals, request, scope)
            return [h["document_id"] for h in before.hits], [h["document_id"] for h in after.hits]
        finally:
            await client.close()
            await aengine.dispose()

    before, after = asyncio.run(run())
    assert before == [data.docs["a"]]
    assert after == []


def test_opensearch_unreachable_is_503() -> None:
    dead = Server("search-api-dead-opensearch", KI_OPENSEARCH__URL=f"http://127.0.0.1:{free_port()}")
    dead.start()
    try:
        admin = mint_token(load_settings().api, "root", roles=["admin"])
        status, body = dead.call("/v1/search", {"query": "Kaufvertrag"}, admin)
        assert status == 503 and body["error"] == "search_unavailable"
        status, body = dead.call("/readyz")
        assert status == 503 and body["checks"]["opensearch"].startswith("error")
    finally:
        dead.stop()


def test_an_index_with_a_primary_on_no_node_is_not_ready(settings: Settings) -> None:
    """Red (a primary shard on no node: rows would be missing from answers) fails /readyz; the cluster
    profile's node kills never reach it, since a replica is promoted. Here the index's only shard may be
    allocated to no node that exists."""
    search = make_sync_client(settings)
    alias = f"ki-test-red-{uuid.uuid4().hex[:8]}"
    nowhere = {"number_of_replicas": 0, "routing.allocation.require._name": "no-such-node"}
    search.indices.create(
        index=f"{alias}-v1",
        body={"settings": {"index": nowhere}, "aliases": {alias: {}}},
        params={"wait_for_active_shards": "0"},
    )
    red = Server("search-api-red-index", KI_RETRIEVAL__INDEX_NAME=alias)
    try:
        red.start()
        status, body = red.call("/readyz")
        assert status == 503 and body["checks"]["index"].startswith("red"), body
        assert body["checks"]["opensearch"] == "ok" and body["checks"]["postgresql"] == "ok"
    finally:
        red.stop()
        search.indices.delete(index=f"{alias}-v1")


METRICS_TOKEN = uuid.uuid4().hex  # what Prometheus would send (api.ops.metrics_token)


def test_metrics_are_for_operators_only(server: Server, data: Data, settings: Settings) -> None:
    """/metrics carries every tenant's index and access-change counts."""
    assert server.call("/metrics")[0] == 401
    assert server.call("/metrics", token=token(settings, data, "bob"))[0] == 403
    assert server.request("/metrics", headers={"Authorization": "Bearer not-the-static-token"})[0] == 401
    assert server.request("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})[0] == 200
    assert server.request("/metrics", token=server.operator_token())[0] == 200
    assert server.request("/metrics", token=mint_token(settings.api, "root", roles=["admin"]))[0] == 200


def test_a_caller_cannot_tell_whether_another_caller_sent_a_query(
    server: Server, data: Data, settings: Settings
) -> None:
    """No `timings_ms` for callers (an embedding-cache hit was 20x faster than a miss), the
    embedding cache is per caller, and no counter a caller can read moves: the answer to a query asked
    before by someone else has the same fields as to a query nobody asked."""
    bob, alice = token(settings, data, "bob"), token(settings, data, "alice")
    asked, fresh = (f"{data.word} {uuid.uuid4().hex[:8]}" for _ in range(2))
    assert server.call("/v1/search", {"query": asked, "mode": "hybrid"}, alice)[0] == 200
    misses = server.metric("ki_search_embed_cache_total", result="miss")
    answers = [server.call("/v1/search", {"query": q, "mode": "hybrid"}, bob)[1] for q in (asked, fresh)]
    assert [sorted(a) for a in answers] == [sorted(answers[1])] * 2
    assert all("timings_ms" not in a for a in answers)
    assert server.metric("ki_search_embed_cache_total", result="miss") == misses + 2  # alice's vector is hers
    assert server.call("/metrics", token=bob)[0] == 403
    operator = server.call("/v1/search", {"query": fresh, "mode": "hybrid"}, server.operator_token())[1]
    assert operator["timings_ms"]["total"] > 0


def test_every_request_is_in_the_access_audit_for_administrators_only(
    server: Server, data: Data, settings: Settings
) -> None:
    """An audit row per request -- who, which endpoint, status, the documents the answer named."""
    bob, admin = token(settings, data, "bob"), mint_token(settings.api, "root", roles=["admin"])
    _, found = server.call("/v1/search", {"query": data.word, "limit": 20}, bob)
    assert server.call(f"/v1/documents/{data.docs['a']}", token=bob)[0] == 200
    assert server.call("/v1/documents/999999999", token=bob)[0] == 404
    assert server.call("/v1/audit", token=bob)[0] == 403
    status, audit = server.call(f"/v1/audit?principal=user:{data.user('bob')}&limit=10", token=admin)
    assert status == 200 and audit["enabled"] is True
    rows = [(r["endpoint"], r["status"], r["document_ids"]) for r in audit["rows"]][::-1]  # oldest first
    assert rows[-4:] == [
        ("/v1/search", 200, sorted(h["document_id"] for h in found["hits"])),
        ("/v1/documents/{document_id}", 200, [data.docs["a"]]),
        ("/v1/documents/{document_id}", 404, []),
        ("/v1/audit", 403, []),
    ]
    assert server.call("/v1/audit?limit=0", token=admin)[1]["field"] == "limit"


def test_the_audit_reads_only_the_hours_asked_and_refuses_bad_hours(
    server: Server, engine: Engine, settings: Settings
) -> None:
    """`hours` filters the audit by age (a row written three hours ago is in the last 4 hours, not in the
    last 2); a value that is not a whole number from 1 to a year's hours is a 400 naming the field."""
    admin = mint_token(settings.api, "root", roles=["admin"])
    who = f"user:aged-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ki_access_audit (at, principals, endpoint, status, document_ids, version_ids) "
                "VALUES (now() - interval '3 hours', ARRAY[:who], '/v1/search', 200, '{}', '{}')"
            ),
            {"who": who},
        )
    for hours, rows in ((2, 0), (4, 1)):
        status, audit = server.call(f"/v1/audit?hours={hours}&principal={who}", token=admin)
        assert status == 200 and len(audit["rows"]) == rows, (hours, audit)
    for bad in ("0", "-1", "abc", "1.5", "9000", "99999999999999999999"):
        status, content_type, payload = server.request(f"/v1/audit?hours={bad}", token=admin)
        assert status == 400 and content_type.startswith("application/json"), (bad, status, payload)
        assert json.loads(payload)["field"] == "hours", (bad, payload)


def test_a_caller_over_the_rate_limit_waits_and_others_do_not(
    isolation: dict[str, str], data: Data, settings: Settings
) -> None:
    """Against bisection: a token bucket per principal set, 429 with Retry-After."""
    # One request per 100 s after a burst of two: the third is refused however slowly the first two ran.
    limited = Server("search-api-rate-limited", **isolation, KI_API__LIMITS__RATE_PER_S="0.01",
                     KI_API__LIMITS__RATE_BURST="2")  # fmt: skip
    limited.start()
    try:
        bob, carol = token(settings, data, "bob"), token(settings, data, "carol")
        assert [limited.call("/v1/me", token=bob)[0] for _ in range(2)] == [200, 200]
        request = urllib.request.Request(f"{limited.base}/v1/me", headers={"Authorization": f"Bearer {bob}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        # The time until the bucket holds one request again: under 100 s by what the first two took.
        assert refused.value.code == 429 and 1 <= int(refused.value.headers["Retry-After"]) <= 100
        assert json.loads(refused.value.read())["error"] == "rate_limited"
        assert limited.call("/v1/me", token=carol)[0] == 200  # another caller, another bucket
    finally:
        limited.stop()


def scrape(server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, content_type, payload = server.request("/metrics", token=server.operator_token())
    assert status == 200 and content_type.startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value for sample in exposition.parse(payload.decode())
    }


def test_metrics(server: Server, data: Data, settings: Settings) -> None:
    bob = token(settings, data, "bob")
    query = f"{data.word} Metriken {uuid.uuid4().hex[:6]}"  # a query vector nobody has cached yet
    before = scrape(server)
    for _ in range(2):
        assert server.call("/v1/search", {"query": query, "mode": "hybrid"}, bob)[0] == 200
    assert server.call("/v1/search", {"query": query})[0] == 401
    assert server.call("/v1/search", {"query": query, "limit": 0}, bob)[0] == 400
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        assert key in after, f"no sample {name}{labels}"
        return after[key] - before.get(key, 0.0)

    ok = {"route": "/v1/search", "method": "POST", "status": "200"}
    assert delta("ki_api_requests_total", **ok) == 2
    assert delta("ki_api_request_duration_seconds_count", **ok) == 2
    assert delta("ki_api_request_duration_seconds_sum", **ok) > 0
    assert delta("ki_api_requests_total", route="/v1/search", method="POST", status="401") == 1
    assert delta("ki_api_requests_total", route="/v1/search", method="POST", status="400") == 1
    for leg in ("lexical", "semantic", "identifier"):
        assert delta("ki_search_leg_duration_seconds_count", leg=leg) == 2
    assert delta("ki_search_msearch_duration_seconds_count") == 2
    assert delta("ki_search_scope_compile_duration_seconds_count") == 2
    assert delta("ki_search_scope_documents_count") == 2
    assert delta("ki_search_scope_documents_sum") == 2 * 3  # bob's scope: documents a, b and c
    assert delta("ki_search_scope_projects_sum") == 2 * 1
    assert delta("ki_search_embed_cache_total", result="miss") == 1
    assert delta("ki_search_embed_cache_total", result="hit") == 1
    status, content_type, _ = server.request("/no/such/path")
    assert status == 404 and content_type.startswith("application/json")
    assert (
        scrape(server)[
            ("ki_api_requests_total", frozenset({"route": "unmatched", "method": "GET", "status": "404"}.items()))
        ]
        >= 1
    )


# Long enough for a gateway on this machine that answers at once, short enough to wait out once in a test.
RERANK_TIMEOUT_S = 5


def test_rerank_reorders_never_drops_and_fails_loudly(
    server: Server, data: Data, settings: Settings, isolation: dict[str, str]
) -> None:
    bob = token(settings, data, "bob")
    request = {"query": data.word, "limit": 10, "explain": True}
    status, fused = server.call("/v1/search", request, bob)
    assert status == 200 and len(fused["hits"]) == 3
    order = doc_ids(fused)
    gateway = RerankGateway()
    gateway.start()
    reranking = Server(
        "search-api-rerank",
        **isolation,
        KI_RETRIEVAL__RERANK_ENABLED="true",
        KI_RETRIEVAL__RERANK__URL=gateway.url,
        KI_RETRIEVAL__RERANK_MODEL="test-reranker",
        KI_RETRIEVAL__RERANK__TIMEOUT_S=str(RERANK_TIMEOUT_S),
        KI_RERANK_API_KEY="k-123",
    )
    reranking.start()
    try:
        status, body = reranking.call("/v1/search", request, bob)
        assert status == 200, body
        # passage 0 (the fused leader) unscored -> last; the others by their scores 2 and 1
        assert doc_ids(body) == [order[2], order[1], order[0]]
        assert [h["score"] for h in body["hits"]] == [2.0, 1.0, fused["hits"][0]["score"]]
        assert [h["explain"]["rerank_score"] for h in body["hits"]] == [2.0, 1.0, None]
        assert body["hits"][2]["explain"]["fused_score"] == fused["hits"][0]["score"]
        sent = gateway.requests[-1]
        assert sent["headers"]["Authorization"] == "Bearer k-123" and sent["body"]["model"] == "test-reranker"
        user = json.loads(sent["body"]["messages"][1]["content"])
        assert user["query"] == data.word and len(user["passages"]) == 3
        # paging happens after the rerank: page 2 of size 1 is the second reranked hit
        status, page = reranking.call("/v1/search", {"query": data.word, "limit": 1, "offset": 1}, bob)
        assert status == 200 and doc_ids(page) == [order[1]] and page["has_more"] is True
        # A gateway slower than retrieval.rerank.timeout_s: the search fails with 503, not an unreranked order.
        asked = len(gateway.requests)
        gateway.hold()
        status, body = reranking.call("/v1/search", request, bob)
        assert status == 503 and body["error"] == "rerank_unavailable", body
        assert len(gateway.requests) == asked + 1  # it did reach the gateway, which never answered in time
        gateway.release()
        for mode in ("error", "garbage"):
            gateway.mode = mode
            status, body = reranking.call("/v1/search", request, bob)
            assert status == 503 and body["error"] == "rerank_unavailable", (mode, body)
        gateway.stop()
        status, body = reranking.call("/v1/search", request, bob)
        assert status == 503 and body["error"] == "rerank_unavailable"
        status, body = reranking.call("/v1/search/filter", {"limit": 5}, bob)
        assert status == 200  # metadata-only search has no ranking to rerank
    finally:
        reranking.stop()
        gateway.stop()


def visible(server: Server, data: Data, who: str, path: str = "/v1/search", **extra: Any) -> set[str]:
    """Keys of the `data` documents a caller finds; `who` is a user name or "admin"."""
    if who == "admin":
        bearer = mint_token(load_settings().api, "root", roles=["admin"])
    else:
        bearer = mint_token(load_settings().api, data.user(who))
    body: dict[str, Any] = {"limit": 50, **extra}
    if path == "/v1/search":
        body["query"] = data.word
    status, payload = server.call(path, body, bearer)
    assert status == 200, payload
    keys = {v: k for k, v in data.docs.items()}
    found = [keys.get(h["document_id"], f"foreign:{h['document_id']}") for h in payload["hits"]]
    assert len(found) == len(set(found)) or path != "/v1/search", found  # ranked search collapses documents
    return set(found)


def test_explain_parts_add_up_to_the_score(server: Server, data: Data, settings: Settings) -> None:
    request = {"query": data.word, "limit": 10, "explain": True, "mode": "hybrid"}
    status, body = server.call("/v1/search", request, token(settings, data, "erin"))
    assert status == 200 and {h["document_id"] for h in body["hits"]} == {data.docs["e"], data.docs["f"]}
    r = settings.retrieval
    weights = {"lexical": r.weight_lexical, "semantic": r.weight_semantic, "identifier": r.weight_identifier}
    boosts = {data.docs["e"]: r.version_status_boost["executed"], data.docs["f"]: r.version_status_boost["draft"]}
    assert boosts[data.docs["e"]] != boosts[data.docs["f"]] != 1.0
    for hit in body["hits"]:
        ex = hit["explain"]
        assert ex["rrf_k"] == r.fusion_rrf_k and ex["rerank_score"] is None
        assert "lexical" in ex["ranks"] and set(ex["rrf_parts"]) == set(ex["ranks"])
        # A made-up word may sit below the semantic floor: then the leg is gone and the answer says so.
        assert "semantic" in ex["ranks"] or body["semantic_floor"]["dropped"] > 0, body["semantic_floor"]
        assert ex["fusion"] == r.fusion_method
        for leg, rank in ex["ranks"].items():
            assert ex["weights"][leg] == weights[leg]
            if r.fusion_method == "rrf":
                assert ex["rrf_parts"][leg] == pytest.approx(weights[leg] / (r.fusion_rrf_k + rank), rel=1e-12)
            else:  # a normalised score in [0, 1] times the weight; a leg's first hit scores 1
                assert 0.0 <= ex["rrf_parts"][leg] <= weights[leg] * (1 + 1e-12)
                if rank == 0:
                    assert ex["rrf_parts"][leg] == pytest.approx(weights[leg], rel=1e-12)
        assert sum(ex["rrf_parts"].values()) == pytest.approx(ex["rrf_score"], rel=1e-12)
        assert ex["status_boost"] == boosts[hit["document_id"]]
        assert ex["rrf_score"] * ex["status_boost"] == pytest.approx(hit["score"], rel=1e-12)
        assert ex["fused_score"] == hit["score"]
    assert [h["score"] for h in body["hits"]] == sorted((h["score"] for h in body["hits"]), reverse=True)
    for leg in ("lexical", "semantic"):  # ranks are positions within one leg: distinct
        ranks = [h["explain"]["ranks"][leg] for h in body["hits"] if leg in h["explain"]["ranks"]]
        assert len(set(ranks)) == len(ranks)


def test_deny_wins_at_project_document_and_source_object_scope(server: Server, data: Data) -> None:
    assert visible(server, data, "eve") == {"g", "i"}  # the control: the same allows, no deny
    assert visible(server, data, "dan") == {"j"}  # project deny hides g, object deny hides i
    assert visible(server, data, "alice") == {"a", "b"}  # document deny hides c
    assert visible(server, data, "dan", "/v1/search/filter") == {"j"}
    assert visible(server, data, "alice", "/v1/search/filter", filters={"project_id": data.project}) == {"a", "b"}


def test_intersect_mode_needs_a_local_allow_too(server: Server, data: Data, isolation: dict[str, str]) -> None:
    assert visible(server, data, "ivan") == {"k", "l"}  # sufficient: the mirrored source allow is enough
    intersect = Server("search-api-intersect", **isolation, KI_SECURITY__SOURCE_ACL_MODE="intersect")
    intersect.start()
    try:
        assert visible(intersect, data, "ivan") == {"l"}
        assert visible(intersect, data, "ivan", "/v1/search/filter") == {"l"}
        assert visible(intersect, data, "bob") == {"a", "b", "c"}  # local allows on a local_fs object
        assert visible(intersect, data, "dan") == {"j"}
    finally:
        intersect.stop()


def test_external_source_without_mirrored_grants_fails_closed(server: Server, data: Data) -> None:
    admin = visible(server, data, "admin")
    assert {"m", "n"} <= admin  # indexed and reachable: only the ACL keeps them from ivan
    ivan = visible(server, data, "ivan")
    assert "n" not in ivan  # a local document allow, but the external object has no mirrored grant
    assert "m" not in ivan  # a known object ACL that grants somebody else; the local allow cannot override


def citation_objects(server: Server, data: Data, bearer: str, key: str) -> list[int]:
    status, body = server.call("/v1/search", {"query": data.word, "limit": 50}, bearer)
    assert status == 200, body
    hits = [h for h in body["hits"] if h["document_id"] == data.docs[key]]
    assert len(hits) == 1, body
    return list(hits[0]["citation"]["source_object_ids"])


def test_citation_omits_an_object_the_caller_cannot_access(
    server: Server, data: Data, settings: Settings, engine: Engine
) -> None:
    """k stays visible to ivan through its mirrored allow on one sharepoint object; a second, inaccessible
    object observing the same version (no mirrored grant) must not appear in ivan's citation."""
    with engine.begin() as conn:
        granted = conn.execute(
            text("SELECT source_object_id FROM source_observations WHERE id = :o"), {"o": data.observations["k"]}
        ).scalar_one()
        hidden = World(conn).source_object(data.sources[1], acl_known=True)
        observation = World(conn).observe(data.versions["k"], hidden)
    try:
        ivan = mint_token(settings.api, data.user("ivan"))
        admin = mint_token(settings.api, "root", roles=["admin"])
        assert citation_objects(server, data, ivan, "k") == [granted]
        assert sorted(citation_objects(server, data, admin, "k")) == sorted([granted, hidden])  # admins: all
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM source_observations WHERE id = :o"), {"o": observation})
            conn.execute(text("DELETE FROM source_objects WHERE id = :s"), {"s": hidden})


def test_admin_without_an_active_observation_sees_nothing(
    server: Server, worker: SyncWorker, data: Data, iso_settings: Settings, engine: Engine
) -> None:
    assert "o" in visible(server, data, "admin")
    client = make_sync_client(iso_settings, timeout_s=30)
    worker.stop()  # the index keeps o's rows from here on
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE source_observations SET deleted_at = now() WHERE id = :o"), {"o": data.observations["o"]}
            )
        assert "o" not in visible(server, data, "admin")
        assert "o" not in visible(server, data, "admin", "/v1/search/filter")
        client.indices.refresh(index=iso_settings.retrieval.index_name)
        rows = client.count(
            index=iso_settings.retrieval.index_name, body={"query": {"term": {"document_id": str(data.docs["o"])}}}
        )
        assert rows["count"] > 0  # the index still holds it: SQL alone kept it out
    finally:
        worker.start()


def test_project_filter_intersects_the_scope(server: Server, data: Data) -> None:
    for path in ("/v1/search", "/v1/search/filter"):
        assert visible(server, data, "eve", path, filters={"project_id": [data.project2]}) == {"g"}
        assert visible(server, data, "eve", path, filters={"project_id": [data.project]}) == {"i"}
        assert visible(server, data, "eve", path, filters={"project_id": [data.project, data.project2]}) == {"g", "i"}
        assert visible(server, data, "eve", path, filters={"project_id": [data.empty_project]}) == set()
        assert visible(server, data, "dan", path, filters={"project_id": [data.project2]}) == set()
        assert visible(server, data, "admin", path, filters={"project_id": [data.project2]}) == {"g"}


def test_window_over_500_is_422_on_every_paged_endpoint(server: Server, data: Data, settings: Settings) -> None:
    bob = token(settings, data, "bob")
    for path, body in [
        ("/v1/search", {"query": data.word}),
        ("/v1/search/filter", {}),
        ("/v1/decisions/search", {"query": data.word}),
    ]:
        status, payload = server.call(path, {**body, "offset": 401, "limit": 100}, bob)
        assert status == 422 and payload["error"] == "window_too_deep" and payload["max_window"] == 500, path
        status, payload = server.call(path, {**body, "offset": 400, "limit": 100}, bob)
        assert status == 200, (path, payload)


HOSTILE_QUERIES = [
    '{"query": {"match_all": {}}}',
    '{"bool": {"should": [{"match_all": {}}], "filter": []}}',
    '"}}, "query": {"match_all": {}}, "x": {"y": "',
    "*:*",
    "document_id:* OR project_id:* OR allowed_principals:*",
    "title:(Kauf* OR Miete~2) AND NOT x^5 [* TO *]",
    "/.*/",
    "\\",
    '"unterminated (a AND OR NOT',
    "_id:1 || _index:* && !x",
    "' OR '1'='1",
    "'; DROP TABLE grants; --",
    "1; SELECT pg_sleep(30); --",
    "%' OR 1=1 --",
    "$(id) `id` ${jndi:ldap://127.0.0.1/x} <script>alert(1)</script>",
]


def test_hostile_queries_are_plain_text(server: Server, data: Data, settings: Settings, engine: Engine) -> None:
    bob, mallory = token(settings, data, "bob"), token(settings, data, "mallory")
    mine = {data.docs[k] for k in "abc"}
    for hostile in HOSTILE_QUERIES:
        for query in (hostile, f"{hostile} {data.word}"):
            status, body = server.call("/v1/search", {"query": query, "limit": 50}, bob)
            assert status == 200, (query, body)
            assert set(doc_ids(body)) <= mine, query  # never wider than the caller's scope
            status, body = server.call("/v1/search", {"query": query, "limit": 50}, mallory)
            assert status == 200 and body["hits"] == [], query
            status, body = server.call("/v1/decisions/search", {"query": query}, bob)
            assert status == 200, (query, body)
            status, body = server.call("/v1/search/filter", {"filters": {"language": [query[:64]]}, "limit": 5}, bob)
            assert status == 200 and body["hits"] == [], query
    at_limit = f"{data.word} " + "x" * (settings.api.limits.max_query_chars - len(data.word) - 1)
    status, body = server.call("/v1/search", {"query": at_limit}, bob)
    assert status == 200 and len(at_limit) == settings.api.limits.max_query_chars, body
    status, body = server.call("/v1/search", {"query": "x" * (settings.api.limits.max_query_chars + 1)}, bob)
    assert status == 400 and body["field"] == "query"
    with engine.connect() as conn:  # and the tables are all still there
        assert conn.execute(text("SELECT count(*) FROM grants WHERE document_id = :d"), {"d": data.docs["a"]}).scalar()


def test_overload_is_refused_at_once_instead_of_queueing(
    data: Data, settings: Settings, isolation: dict[str, str]
) -> None:
    """One slot, one queue place: a search held at the (real) rerank gateway fills the slot, a second one
    waits, a third is refused with 429 at once; health and metrics stay available."""
    bob = token(settings, data, "bob")
    gateway = RerankGateway()
    gateway.start()
    gateway.hold()
    srv = Server(
        "search-api-overload",
        **isolation,
        KI_RETRIEVAL__RERANK_ENABLED="true",
        KI_RETRIEVAL__RERANK__URL=gateway.url,
        KI_API__LIMITS__MAX_CONCURRENT_REQUESTS="1",
        KI_API__LIMITS__MAX_QUEUED_REQUESTS="1",
        KI_API__LIMITS__QUEUE_TIMEOUT_S="300",
    )
    srv.start()

    def gauge(name: str) -> float:
        return scrape(srv)[(name, frozenset())]

    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(srv.call, "/v1/search", {"query": data.word}, bob)
            wait_for(lambda: gateway.requests, timeout=120, what="the first search at the gateway")
            second = pool.submit(srv.call, "/v1/search", {"query": data.word, "limit": 2}, bob)
            wait_for(lambda: gauge("ki_api_requests_waiting") == 1, timeout=60, what="the second search queued")
            status, content_type, payload = srv.request("/v1/search", {"query": data.word}, bob)
            assert status == 429 and content_type.startswith("application/json"), payload
            assert json.loads(payload)["error"] == "overloaded"
            assert srv.call("/v1/decisions/search", {"query": data.word}, bob)[0] == 429
            assert srv.call("/healthz")[0] == 200
            assert gauge("ki_api_requests_in_flight") == 1 and gauge("ki_api_rejected_total") == 2
            gateway.release()
            assert first.result(timeout=120)[0] == 200
            assert second.result(timeout=120)[0] == 200
        assert gauge("ki_api_requests_in_flight") == 0 and gauge("ki_api_requests_waiting") == 0
        assert srv.call("/v1/search", {"query": data.word}, bob)[0] == 200
    finally:
        gateway.release()
        srv.stop()
        gateway.stop()


def test_default_mode_follows_the_evidence_and_an_explicit_mode_needs_it_or_the_operator(
    isolation: dict[str, str], data: Data, settings: Settings, iso_settings: Settings, tmp_path_factory
) -> None:
    from ki.embedding import create_embedder
    from ki.evidence_keys import load_private_key, make_keys, sign
    from search.ranking.mode_gate import binding_for, binding_hash

    erin = token(settings, data, "erin")
    reports = tmp_path_factory.mktemp("evidence")
    signature = create_embedder(iso_settings).signature
    # Earlier tests changed texts, written text first: the semantic leg must see every row again.
    documents = {"terms": {"document_id": [str(doc) for doc in data.docs.values()]}}
    wait_until_vectored(settings, iso_settings.retrieval.index_name, documents, "the changed texts")

    def legs(srv: Server, body: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
        status, answer = srv.call("/v1/search", {"query": data.word, "explain": True, **body}, erin)
        assert status == 200, answer
        assert answer["hits"], answer
        return answer["mode"], set().union(*(h["explain"]["ranks"] for h in answer["hits"]))

    # No report for these settings: keyword-only by default, and the response says why.
    srv = Server("search-api-no-evidence", **isolation, KI_RETRIEVAL__MODE_GATE__REPORTS_DIR=str(reports),
                 KI_RETRIEVAL__MODE_GATE__EXPLICIT_WITHOUT_EVIDENCE="refuse")  # the shipped default  # fmt: skip
    srv.start()
    try:
        mode, ran = legs(srv, {})
        assert mode["used"] == "lexical" and mode["requested"] is None and "no evaluation report" in mode["reason"]
        assert "semantic" not in ran
        # An explicit mode with vectors is refused with the gate's reason, not answered keyword-only in silence.
        for asked in ("hybrid", "semantic"):
            status, answer = srv.call("/v1/search", {"query": data.word, "mode": asked}, erin)
            refusal = (status, answer["error"], answer["field"], answer["mode"])
            assert refusal == (409, "mode_unavailable", "mode", asked)
            assert "no evaluation report" in answer["message"] and "hits" not in answer
        mode, ran = legs(srv, {"mode": "lexical"})
        assert mode["used"] == "lexical" and "semantic" not in ran
        status, answer = srv.call("/v1/search", {"query": data.word, "mode": "fuzzy"}, erin)
        assert status == 400 and answer["field"] == "mode"
    finally:
        srv.stop()

    # The operator may honour it: then the explicit mode runs as asked.
    srv = Server("search-api-no-evidence-honoured", **isolation, KI_RETRIEVAL__MODE_GATE__REPORTS_DIR=str(reports),
                 KI_RETRIEVAL__MODE_GATE__EXPLICIT_WITHOUT_EVIDENCE="honour")  # fmt: skip
    srv.start()
    try:
        # Which legs ran is the plan's (`explain`): whether a semantic hit clears the relevance floor for this
        # made-up word is not the question here.
        for asked in ("hybrid", "semantic"):
            status, answer = srv.call("/v1/search", {"query": data.word, "explain": True, "mode": asked}, erin)
            assert status == 200, answer
            assert answer["mode"] == {"used": asked, "requested": asked, "reason": f"requested {asked!r}"}, answer
            legs_run = set(answer["plan"]["legs"])
            assert "semantic" in legs_run and (asked == "hybrid") == ("lexical" in legs_run), answer["plan"]
    finally:
        srv.stop()

    # A report bound to exactly these settings that shows hybrid >= lexical: hybrid by default.
    binding = binding_for(iso_settings, signature, "0" * 64)
    record = {
        "dataset": {"name": "tiny-de"},
        "binding": binding,
        "binding_hash": binding_hash(binding),
        "results": {"lexical": {"ndcg@10": 0.5}, "hybrid": {"ndcg@10": 0.6}},
    }
    # Signed by the deployment's key (ki keys), which the server trusts: unsigned, the report would not count.
    private, public = make_keys(tmp_path_factory.mktemp("keys"))
    (reports / "tiny-de.json").write_text(json.dumps(sign(record, load_private_key(private))))
    srv = Server("search-api-evidence", **isolation, KI_RETRIEVAL__MODE_GATE__REPORTS_DIR=str(reports),
                 KI_RETRIEVAL__MODE_GATE__TRUSTED_KEY_FILES=json.dumps([str(public)]))  # fmt: skip
    srv.start()
    try:
        mode, ran = legs(srv, {})
        assert mode["used"] == "hybrid" and "tiny-de 0.600 >= 0.500" in mode["reason"] and "semantic" in ran
    finally:
        srv.stop()

    # The semantic leg switched off: a mode that needs it is a typed 409 naming the field.
    srv = Server("search-api-no-semantic", **isolation, KI_RETRIEVAL__WEIGHT_SEMANTIC="0")
    srv.start()
    try:
        status, answer = srv.call("/v1/search", {"query": data.word, "mode": "semantic"}, erin)
        assert status == 409 and answer["error"] == "semantic_unavailable" and answer["field"] == "mode"
        mode, ran = legs(srv, {"mode": "lexical"})
        assert mode["used"] == "lexical" and "semantic" not in ran
    finally:
        srv.stop()
