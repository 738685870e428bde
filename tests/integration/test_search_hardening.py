"""The search API under hostile input, over real HTTP against real `ki serve` processes: tokens of every
broken kind, limits taken from settings, and schemathesis fuzzing from the served OpenAPI document.

The index these servers read is created (empty) by the one writer (`streams.writer.IndexWriter`) in an
alias of this module's own, so a search is answered (200), not refused for a missing index (503).
Fuzzing runs at most `FUZZ_EXAMPLES` generated requests per operation: every operation as an
administrator, and the document endpoints (documents, related, traverse, decision search) once more as an
ordinary caller who sees two related documents (about 40 s in all here).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hypothesis
import hypothesis.strategies as st
import jwt
import pytest
import schemathesis
from schemathesis import GenerationMode
from sqlalchemy import Engine

from ki.settings import Settings, load_settings
from search.web.auth import mint_token
from search.web.openapi import openapi_document
from tests.integration.search_harness import Server, isolated, remove_world
from tests.integration.world import World

pytestmark = pytest.mark.stack

FUZZ_EXAMPLES = 60


async def _create_index(settings: Settings) -> None:
    from ki.clients import make_client
    from ki.embedding import create_embedder
    from streams.writer import IndexWriter

    client = make_client(settings)
    try:
        await IndexWriter(client, settings).ensure_index(create_embedder(settings).signature)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def isolation(settings: Settings) -> Iterator[dict[str, str]]:
    with isolated(settings, prefix="ki-harden-test") as env:
        asyncio.run(_create_index(load_settings(environ={**os.environ, **env})))
        yield env


@pytest.fixture(scope="module")
def server(isolation: dict[str, str]) -> Iterator[Server]:
    # No sync worker runs here: a consistency token the fuzzer sends can never be reached, so it is refused soon.
    s = Server("search-api-hardening", **isolation, KI_API__CONSISTENCY__MAX_WAIT_S="0.2")
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tight(isolation: dict[str, str]) -> Iterator[Server]:
    s = Server(
        "search-api-tight",
        **isolation,
        KI_API__LIMITS__MAX_BODY_BYTES="2048",
        KI_API__LIMITS__MAX_QUERY_CHARS="50",
        KI_API__LIMITS__MAX_LIMIT="5",
        KI_API__LIMITS__MAX_FILTER_VALUES="2",
        KI_API__LIMITS__MAX_TOKEN_BYTES="512",
    )
    s.start()
    yield s
    s.stop()


@dataclass(frozen=True)
class Reader:
    """An ordinary caller who sees a project of two related documents (not in the empty index: its scope
    is read in SQL, so the legs are sent)."""

    token: str
    documents: tuple[int, int]


@pytest.fixture(scope="module")
def reader(engine: Engine, settings: Settings) -> Iterator[Reader]:
    with engine.begin() as conn:
        w = World(conn)
        project, source = w.project("Härtung"), w.source("local_fs")
        obj = w.source_object(source)
        first, second = (w.searchable(project, f"Vertrag {key}", "Die Miete ist gemindert.", obj, key)
                         for key in ("a", "b"))  # fmt: skip
        w.relation("references", first, second)
        w.grant("project", project, f"user:reader-{w.tag}")
    try:
        yield Reader(mint_token(settings.api, f"reader-{w.tag}", ttl_s=3600), (first, second))
    finally:
        remove_world(engine, [project], [source])


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _claims(api: Any, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"sub": "alice", "iss": api.jwt.issuer, "aud": api.jwt.audience}
    base["exp"] = int(time.time()) + 300
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def assert_clean_error(status: int, content_type: str, payload: bytes, expected: int) -> dict[str, Any]:
    assert status == expected, (status, payload[:300])
    assert content_type.startswith("application/json"), (content_type, payload[:300])
    body = json.loads(payload)
    assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), body
    assert "Traceback" not in payload.decode() and 'File "' not in payload.decode()
    return body


def test_broken_tokens_are_401_with_json(server: Server, settings: Settings) -> None:
    api = settings.api
    secret, alg = api.jwt.secret, api.jwt.algorithm
    tokens = {
        "expired": jwt.encode(_claims(api, exp=int(time.time()) - 60), secret, algorithm=alg),
        "wrong signature": jwt.encode(_claims(api), "not-the-secret-not-the-secret!!", algorithm=alg),
        "alg none": jwt.encode(_claims(api), None, algorithm="none"),
        "alg none, hand-made": f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(_claims(api))}.",
        "other algorithm": jwt.encode(_claims(api), secret, algorithm="HS512" if alg != "HS512" else "HS256"),
        "no sub": jwt.encode(_claims(api, sub=None), secret, algorithm=alg),
        "no exp": jwt.encode(_claims(api, exp=None), secret, algorithm=alg),
        "no iss": jwt.encode(_claims(api, iss=None), secret, algorithm=alg),
        "no aud": jwt.encode(_claims(api, aud=None), secret, algorithm=alg),
        "wrong aud": jwt.encode(_claims(api, aud="another-api"), secret, algorithm=alg),
        "sub with NUL": jwt.encode(_claims(api, sub="a\x00b"), secret, algorithm=alg),
        "groups not strings": jwt.encode(_claims(api, groups=[{"$ne": 1}]), secret, algorithm=alg),
        # over api.limits.max_token_bytes, under aiohttp's own 8,190-byte header limit
        "oversized": mint_token(api, "alice", groups=[f"g{i:04d}" for i in range(600)]),
        "garbage": "eyJ.eyJ.sig",
    }
    assert api.limits.max_token_bytes < len(tokens["oversized"]) < 8000
    for name, token in tokens.items():
        for path, body in [("/v1/search", {"query": "Kaution"}), ("/v1/decisions/search", {"query": "x"})]:
            status, content_type, payload = server.request(path, body, token)
            error = assert_clean_error(status, content_type, payload, 401)
            assert error["error"] == "unauthorized", (name, error)
    for header in ["Basic YWxpY2U6c2VjcmV0", "Bearer", "bearer  ", "Token abc"]:
        status, content_type, payload = server.request("/v1/search", {"query": "x"}, headers={"Authorization": header})
        assert_clean_error(status, content_type, payload, 401)
    status, _, _ = server.request("/v1/search", {"query": "x"}, mint_token(api, "alice"))
    assert status == 200  # the control: a good token passes


def test_limits_come_from_settings(server: Server, tight: Server, settings: Settings) -> None:
    token = mint_token(settings.api, "alice")
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({"query": "x" * 51}, 400, "query"),
        ({"query": "x", "limit": 6}, 400, "limit"),
        ({"query": "x", "filters": {"project_id": [1, 2, 3]}}, 400, "filters.project_id"),
        ({"query": "x", "filters": {"language": ["de", "en", "fr"]}}, 400, "filters.language"),
        ({"query": "ä" * 1000}, 413, None),  # 1,000 characters, but over 2,048 bytes of JSON
    ]
    for body, expected, field in cases:
        error = assert_clean_error(*tight.request("/v1/search", body, token), expected)
        assert error.get("field") == field, (body, error)
        status, _, payload = server.request("/v1/search", body, token)  # default limits admit the same request
        assert status == 200, (body, payload[:300])
    long_token = mint_token(settings.api, "alice", groups=[f"g{i:03d}" for i in range(60)])
    assert 512 < len(long_token) <= settings.api.limits.max_token_bytes
    assert_clean_error(*tight.request("/v1/search", {"query": "x"}, long_token), 401)
    assert server.request("/v1/search", {"query": "x"}, long_token)[0] == 200


def test_malformed_bodies_are_400_with_json(server: Server, settings: Settings) -> None:
    token = mint_token(settings.api, "alice")
    for raw, field in [
        (b"{not json", "body"),
        (b"[" * 5000 + b"]" * 5000, "body"),  # nesting deep enough to exhaust a recursive parser
        (b"\xff\xfe{}", "body"),
        (b'"just a string"', "body"),
        (b'{"query": "\\ud800"}', "query"),  # a lone surrogate
        (b'{"query": "a\\u0000b"}', "query"),
        (b'{"query": "x", "limit": 1e400}', "limit"),
        (b'{"query": "x", "offset": -1}', "offset"),
        (b'{"query": "x", "filters": {"project_id": [99999999999999999999999]}}', "filters.project_id"),
        (b'{"query": "x", "filters": {"date_from": "2024-02-30"}}', "filters.date_from"),
        (b'{"query": "x", "filters": []}', "filters"),
    ]:
        error = assert_clean_error(*server.request("/v1/search", raw=raw, token=token), 400)
        assert error["field"] == field, (raw[:60], error)


def distinct_cjk(n: int) -> str:
    """`n` distinct CJK ideographs: the analyzer makes each one a term, so `n` terms in one `match`."""
    return "".join(chr(0x4E00 + i) for i in range(n))


def test_a_query_of_more_terms_than_the_index_matches_is_400_naming_query(
    server: Server, reader: Reader, settings: Settings
) -> None:
    """Over OpenSearch's clause limit (1,024 by default) the legs are refused: a 400 naming `query`, never a
    500. The caller sees documents, so the legs are sent (into the empty index)."""
    assert server.request("/v1/search", {"query": distinct_cjk(900)}, reader.token)[0] == 200  # the control
    assert settings.api.limits.max_query_chars < 5000
    for n in (1100, settings.api.limits.max_query_chars, 5000):  # 5,000: over the limit, refused before
        for mode in (None, "hybrid", "lexical"):
            body = {"query": distinct_cjk(n), **({"mode": mode} if mode else {})}
            error = assert_clean_error(*server.request("/v1/search", body, reader.token), 400)
            assert error["error"] == "invalid_request" and error["field"] == "query", (n, mode, error)
    # Decision search scores tokens in SQL (no clause limit): the same text is an answer, not an error.
    status, _, payload = server.request("/v1/decisions/search", {"query": distinct_cjk(1100)}, reader.token)
    assert status == 200, payload[:300]


def test_served_document_is_the_one_the_code_builds(server: Server) -> None:
    assert server.call("/openapi.json") == (200, openapi_document())


@pytest.fixture(scope="module")
def fuzz_schema(server: Server) -> Any:
    schema = schemathesis.openapi.from_url(f"{server.base}/openapi.json")
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    return schema


@pytest.fixture(scope="module")
def admin_token(settings: Settings) -> str:
    return mint_token(settings.api, "root", roles=["admin"], ttl_s=3600)


fuzz = schemathesis.pytest.from_fixture("fuzz_schema")


@fuzz.parametrize()
@hypothesis.settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    derandomize=False,
)
def test_fuzzing_from_the_openapi_document(case: Any, admin_token: str) -> None:
    """No 5xx for anything generated from the document (valid or not); every 4xx is a JSON error."""
    assert_no_server_error(case, admin_token)


def assert_no_server_error(case: Any, token: str) -> None:
    """Call `case` with `token`: below 500, and a JSON error body for every 4xx."""
    response = case.call(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    status = response.status_code
    assert status < 500, (case.method, case.formatted_path, case.query, case.body, status, response.text[:300])
    if status >= 400:
        headers = {name.lower(): value for name, value in response.headers.items()}
        content_type = headers.get("content-type", "")
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type.startswith("application/json"), (status, content_type, response.text[:300])
        body = response.json()
        assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), body


# The endpoints that read documents by id, as a caller who is no administrator (the access checks most
# callers meet), with ids the caller sees mixed in so the paths past the 404 (versions, relations, the walk)
# are fuzzed too.
READER_OPERATIONS = ["/v1/documents/{document_id}", "/v1/documents/{document_id}/related", "/v1/traverse",
                     "/v1/decisions/search", "/v1/lookup"]  # fmt: skip


@pytest.fixture(scope="module")
def reader_fuzz_schema(server: Server, reader: Reader) -> Any:
    schema = schemathesis.openapi.from_url(f"{server.base}/openapi.json")
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    seen = st.sampled_from(reader.documents)

    @schema.hook
    def before_generate_path_parameters(context: Any, strategy: Any) -> Any:
        return st.one_of(strategy, st.fixed_dictionaries({"document_id": seen}))

    @schema.hook
    def before_generate_body(context: Any, strategy: Any) -> Any:
        if context.operation is None or context.operation.path != "/v1/traverse":
            return strategy
        starts = st.lists(st.one_of(seen, st.integers(min_value=1, max_value=2**63 - 1)), min_size=1, max_size=4)
        planted = st.tuples(strategy, starts).map(
            lambda pair: {**pair[0], "start": pair[1]} if isinstance(pair[0], dict) else pair[0]
        )
        return st.one_of(strategy, planted)

    return schema


# Filtered here: `from_fixture` re-clones the fixture's schema with its own filters, dropping the schema's.
reader_fuzz = schemathesis.pytest.from_fixture("reader_fuzz_schema").include(path=READER_OPERATIONS)


@reader_fuzz.parametrize()
@hypothesis.settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    derandomize=False,
)
def test_fuzzing_the_document_endpoints_as_an_ordinary_caller(case: Any, reader: Reader) -> None:
    """Documents, related, traverse, decision search and lookup: no 5xx for any generated input of a caller who
    sees some documents and is no administrator; every 4xx is a JSON error."""
    assert_no_server_error(case, reader.token)
