"""The exception tree: transient vs permanent by type, foreign exceptions read by type and code (never
their text), and the one map from the tree to HTTP (no services)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pkgutil
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import KafkaError, KafkaException
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import ConnectionTimeout, NotFoundError, TransportError
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from ki.clients import as_ki_error, database_error, kafka_error, opensearch_error
from ki.embedding import EmbeddingUnavailable
from ki.errors import (
    AlreadyExists,
    BulkError,
    BulkRejected,
    BulkThrottled,
    IndexReadOnly,
    ItemFailure,
    KiError,
    PermanentError,
    QueryTooManyTerms,
    Rejected,
    RequestInvalid,
    SearchUnavailable,
    SettingsError,
    TransientError,
    Unavailable,
    bulk_error,
)
from search.plan import ModeUnavailable, SemanticUnavailable
from search.ranking.rerank import RerankUnavailable
from search.request import WindowTooDeep
from search.web.admission import Overloaded
from search.web.api import error_body, error_response, errors
from search.web.auth import AuthError
from streams.writer import item_outcome

# -- the tree --------------------------------------------------------------------------------------

CORE = ("ki", "projections", "streams", "search", "apps")
# Deliberately outside the tree: the stack's HTTP probe error is an OSError so `except OSError` sees it.
OUTSIDE = {"apps.dev.stack.http.HttpError"}


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for root in CORE:
        package = importlib.import_module(root)
        names = [root] + [m.name for m in pkgutil.walk_packages(package.__path__, root + ".")]
        for name in names:
            if name.startswith(("ki.migrations.", "apps.dev.demo.__main__")):
                continue
            module = importlib.import_module(name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == name:
                    found[f"{name}.{cls.__qualname__}"] = cls
    return list(found.values())


def test_every_exception_class_of_ours_is_in_the_tree() -> None:
    classes = _exception_classes()
    assert len(classes) > 15  # the walk found them
    stray = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, KiError)]
    assert set(stray) == OUTSIDE


def test_every_error_is_transient_or_permanent_never_both() -> None:
    for cls in _exception_classes():
        if not issubclass(cls, KiError) or cls in (KiError, BulkError):  # the two abstract roots
            continue
        assert issubclass(cls, TransientError) != issubclass(cls, PermanentError), cls


# -- bulk items: by status and error type ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, "es_rejected_execution_exception"), (503, "unavailable_shards_exception"), (502, ""), (504, "")],
)
def test_a_bulk_item_answered_429_or_5xx_is_transient(status: int, kind: str) -> None:
    outcome = item_outcome("index", {"status": status, "error": {"type": kind, "reason": "retries exhausted"}})
    assert isinstance(outcome, ItemFailure) and outcome.transient
    error = bulk_error({"1:chunk:0": outcome})
    assert isinstance(error, BulkThrottled) and isinstance(error, TransientError) and isinstance(error, BulkError)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "mapper_parsing_exception"), (400, "illegal_argument_exception"), (413, ""), (500, "exception")],
)
def test_a_bulk_item_the_index_refused_is_permanent(status: int, kind: str) -> None:
    # The reason text says "retries" on purpose: only the status decides, never the wording.
    outcome = item_outcome("index", {"status": status, "error": {"type": kind, "reason": "no retries help"}})
    assert isinstance(outcome, ItemFailure) and not outcome.transient
    error = bulk_error({"1:chunk:0": outcome})
    assert isinstance(error, BulkRejected) and isinstance(error, PermanentError)
    assert f"1:chunk:0: {status} {kind}" in str(error)


def test_one_refused_item_makes_the_whole_failure_permanent() -> None:
    throttled = ItemFailure(429, "es_rejected_execution_exception", "queue full")
    refused = ItemFailure(400, "mapper_parsing_exception", "failed to parse field [doc_date]")
    assert isinstance(bulk_error({"a": throttled, "b": throttled}), BulkThrottled)
    error = bulk_error({"a": throttled, "b": refused})
    assert isinstance(error, BulkRejected)
    assert error.failures == {"a": throttled, "b": refused}


# What OpenSearch 2.19 answers a `_bulk` item on an index past the flood-stage watermark (captured from the
# test stack), and what older versions and an operator's `index.blocks.write` answer: the same type.
FLOOD_STAGE = {
    "status": 429,
    "error": {
        "type": "cluster_block_exception",
        "reason": "index [ki-chunks] blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded flood-stage watermark,"
        " index has read-only-allow-delete block];",
    },
}
FORBIDDEN = {
    "status": 403,
    "error": {
        "type": "cluster_block_exception",
        "reason": "blocked by: [FORBIDDEN/12/index read-only / allow delete (api)];",
    },
}


@pytest.mark.parametrize("answer", [FLOOD_STAGE, FORBIDDEN], ids=["429-flood-stage", "403-read-only-api"])
def test_a_bulk_item_refused_by_a_write_block_is_the_index_read_only_whatever_its_status(answer: Any) -> None:
    outcome = item_outcome("index", answer)
    assert isinstance(outcome, ItemFailure) and outcome.write_blocked
    # Neither a poison record (permanent: dead-lettered) nor plain back-pressure: the index refuses writes.
    error = bulk_error({"1:chunk:0": outcome, "2:chunk:0": ItemFailure(429, "es_rejected_execution_exception")})
    assert isinstance(error, IndexReadOnly) and isinstance(error, TransientError)
    assert "cluster_block_exception" in str(error)
    # Beside a refused item too: the block is the index's, the item would be refused again once it lifts.
    assert isinstance(bulk_error({"a": outcome, "b": ItemFailure(400, "mapper_parsing_exception")}), IndexReadOnly)


def test_a_rejected_execution_is_back_pressure_not_a_write_block() -> None:
    outcome = item_outcome("index", {"status": 429, "error": {"type": "es_rejected_execution_exception"}})
    assert isinstance(outcome, ItemFailure) and outcome.transient and not outcome.write_blocked
    assert isinstance(bulk_error({"a": outcome}), BulkThrottled)


def test_a_request_refused_by_a_write_block_is_the_index_read_only() -> None:
    """A put_mapping (the lane's ensure_index) on a blocked index is refused as a request, not an item."""
    for status in (429, 403):
        body = {"error": {"type": "cluster_block_exception", "reason": "index [x] blocked by: [...]"}, "status": status}
        error = opensearch_error(TransportError(status, "cluster_block_exception", body))
        assert isinstance(error, IndexReadOnly) and "index [x] blocked by" in str(error), status


@pytest.mark.parametrize(
    ("kind", "status", "outcome"),
    [
        ("index", 201, "written"),
        ("update", 200, "written"),
        ("delete", 404, "written"),  # gone either way
        ("create", 409, "conflict"),
        ("update", 409, "conflict"),
        ("update", 404, "conflict"),  # deleted after we read it: read again
    ],
)
def test_bulk_item_outcomes_that_are_not_failures(kind: Any, status: int, outcome: str) -> None:
    assert item_outcome(kind, {"status": status}) == outcome


# -- opensearch-py -------------------------------------------------------------------------------------


def test_opensearch_unreachable_or_overloaded_is_search_unavailable() -> None:
    refused = OpenSearchConnectionError("N/A", "connection refused", OSError("refused"))
    timeout = ConnectionTimeout("TIMEOUT", "read timed out", TimeoutError())
    overloaded = TransportError(429, "circuit_breaking_exception", {"error": {"type": "circuit_breaking_exception"}})
    # No index (yet): the worker creates it with its first write; until then searches are unavailable.
    missing = NotFoundError(404, "index_not_found_exception", {"error": {"type": "index_not_found_exception"}})
    for exc in (refused, timeout, overloaded, missing, TransportError(503, "unavailable_shards_exception")):
        error = opensearch_error(exc)
        assert isinstance(error, SearchUnavailable) and isinstance(error, TransientError), exc
        assert error.service == "opensearch"


def test_opensearch_refusals_are_permanent_and_an_existing_index_is_already_exists() -> None:
    exists = opensearch_error(TransportError(400, "resource_already_exists_exception", {}))
    assert isinstance(exists, AlreadyExists) and exists.service == "opensearch"
    for exc in (TransportError(400, "mapper_parsing_exception"), NotFoundError(404, "resource_not_found_exception")):
        error = opensearch_error(exc)
        assert isinstance(error, Rejected) and isinstance(error, PermanentError), exc


def test_a_search_refused_for_too_many_clauses_is_the_callers_query() -> None:
    """A `client.search` (graph augmentation, the authoritative class) refused as the legs are: by the types
    in the body, wherever OpenSearch nests them."""
    info = {"error": {"type": "search_phase_execution_exception", "reason": "all shards failed",
                      "failed_shards": [{"reason": {"type": "query_shard_exception",
                                                    "caused_by": {"type": "too_many_nested_clauses"}}}]},
            "status": 400}  # fmt: skip
    error = opensearch_error(TransportError(400, "search_phase_execution_exception", info))
    assert isinstance(error, QueryTooManyTerms) and error.field == "query"
    status, body = error_body(error)
    assert status == 400 and body["error"] == "invalid_request" and body["field"] == "query"
    plain = {"error": {"type": "search_phase_execution_exception", "reason": "too_many_clauses"}, "status": 400}
    assert isinstance(opensearch_error(TransportError(400, "search_phase_execution_exception", plain)), Rejected)


# -- confluent-kafka: by error code ------------------------------------------------------------------


def test_kafka_topic_already_exists_is_read_from_the_error_code() -> None:
    error = kafka_error(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
    assert isinstance(error, AlreadyExists) and error.service == "kafka"
    # The same code with any wording: the text is never read.
    assert isinstance(kafka_error(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "something else")), AlreadyExists)


@pytest.mark.parametrize(
    "error",
    [KafkaError(KafkaError._TRANSPORT), KafkaError(KafkaError._ALL_BROKERS_DOWN), KafkaError(1, retriable=True)],
)
def test_kafka_broker_away_is_transient(error: KafkaError) -> None:
    mapped = kafka_error(KafkaException(error))
    assert isinstance(mapped, Unavailable) and mapped.service == "kafka"


def test_kafka_refusals_are_permanent() -> None:
    for code in (KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.TOPIC_AUTHORIZATION_FAILED):
        assert isinstance(kafka_error(KafkaException(KafkaError(code))), Rejected)
    # A KafkaException without a KafkaError (raised by the client itself, e.g. bad arguments).
    assert isinstance(kafka_error(KafkaException("bad config")), Rejected)


# -- SQLAlchemy -------------------------------------------------------------------------------------


def test_postgresql_connection_loss_is_transient_and_a_refused_statement_permanent() -> None:
    lost = OperationalError("SELECT 1", {}, Exception("connection refused"))
    invalidated = DBAPIError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)
    for exc in (lost, invalidated):
        error = database_error(exc)
        assert isinstance(error, Unavailable) and error.service == "postgresql", exc
    refused = database_error(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert isinstance(refused, Rejected) and refused.service == "postgresql"


def test_as_ki_error_passes_ours_maps_theirs_and_leaves_bugs_alone() -> None:
    ours = SettingsError("x")
    assert as_ki_error(ours) is ours
    assert isinstance(as_ki_error(ConnectionRefusedError()), Unavailable)
    assert isinstance(as_ki_error(TransportError(502, "bad_gateway")), SearchUnavailable)
    assert isinstance(as_ki_error(OperationalError("SELECT 1", {}, Exception("gone"))), Unavailable)
    assert as_ki_error(ValueError("a bug")) is None
    assert as_ki_error(KeyError("a bug")) is None


# -- HTTP: one map ---------------------------------------------------------------------------------


def _json(response: web.Response) -> dict[str, Any]:
    assert response.text is not None
    return dict(json.loads(response.text))


@pytest.mark.parametrize(
    ("error", "status", "body"),
    [
        (AuthError("token expired"), 401, {"error": "unauthorized", "message": "token expired"}),
        (
            RequestInvalid("filters.doc_type", "must not be blank"),
            400,
            {"error": "invalid_request", "message": "must not be blank", "field": "filters.doc_type"},
        ),
        (
            WindowTooDeep(490, 20),
            422,
            {
                "error": "window_too_deep",
                "message": "offset + limit = 510 exceeds the maximum ranked window of 500",
                "field": "offset",
                "max_window": 500,
            },
        ),
        (
            ModeUnavailable("hybrid", "no evaluation report matches these settings"),
            409,
            {
                "error": "mode_unavailable",
                "message": "'hybrid' is unavailable here: no evaluation report matches these settings",
                "field": "mode",
                "mode": "hybrid",
                "default_mode": "lexical",
            },
        ),
        (
            SemanticUnavailable("no vectors here"),
            409,
            {"error": "semantic_unavailable", "message": "no vectors here", "field": "mode"},
        ),
        (
            SearchUnavailable("OpenSearch unreachable: secret detail"),
            503,
            {"error": "search_unavailable", "message": "the search index is unavailable; no partial answer is given"},
        ),
        (
            RerankUnavailable("gateway HTTP 502"),
            503,
            {"error": "rerank_unavailable", "message": "the reranker failed; no unreranked answer is given"},
        ),
        (EmbeddingUnavailable("cannot reach http://embed"), 503, {"error": "embedding_unavailable"}),
        (Unavailable("PostgreSQL: OperationalError", service="postgresql"), 503, {"error": "service_unavailable"}),
        (BulkThrottled({"a": ItemFailure(429)}), 503, {"error": "unavailable"}),
        (Rejected("OpenSearch refused: parse error", service="opensearch"), 500, {"error": "internal_error"}),
        (SettingsError("bad"), 500, {"error": "internal_error", "message": "internal error"}),
    ],
)
def test_error_response_maps_the_tree_to_status_and_body(error: KiError, status: int, body: dict[str, Any]) -> None:
    response = error_response(error)
    assert response.status == status
    got = _json(response)
    assert {k: got[k] for k in body} == body
    assert "secret detail" not in json.dumps(got)  # internals go to the log, not to the caller


@pytest.mark.parametrize(("status", "code"), [(429, 429), (503, 503)])
def test_overloaded_keeps_its_status_and_asks_to_retry(status: int, code: int) -> None:
    response = error_response(Overloaded(status, "full; retry later"))
    assert response.status == code and response.headers["Retry-After"] == "1"
    assert _json(response) == {"error": "overloaded", "message": "full; retry later"}


def _serve(raised: BaseException) -> tuple[int, dict[str, Any]]:
    async def boom(request: web.Request) -> web.Response:
        raise raised

    async def scenario() -> tuple[int, dict[str, Any]]:
        app = web.Application(middlewares=[errors])
        app.router.add_get("/x", boom)
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/x")
            return response.status, await response.json()

    return asyncio.run(scenario())


def test_the_middleware_answers_the_tree_and_calls_anything_else_a_bug() -> None:
    """Each port maps its client's exceptions where it calls the client (ki.clients' boundaries); one that
    reaches the middleware unmapped is a bug, answered 500 and logged, never guessed into a 503."""
    handlers: list[tuple[BaseException, int, str]] = [
        (database_error(OperationalError("SELECT 1", {}, Exception("connection refused"))), 503, "service_unavailable"),
        (opensearch_error(OpenSearchConnectionError("N/A", "refused", OSError())), 503, "search_unavailable"),
        (RequestInvalid("query", "must not be blank"), 400, "invalid_request"),
        (OperationalError("SELECT 1", {}, Exception("connection refused")), 500, "internal_error"),
        (ValueError("a bug"), 500, "internal_error"),
    ]
    for raised, status, code in handlers:
        got_status, body = _serve(raised)
        assert (got_status, body["error"]) == (status, code), raised
