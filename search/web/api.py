"""The aiohttp search API: handlers parse and validate, call the service, answer JSON.

`POST /v1/search`, `POST /v1/search/filter`, `POST /v1/decisions/search`, `GET /v1/documents/{id}`,
`GET /v1/documents/{id}/related`, `GET /v1/documents/{id}/versions/{version_id}/text`, `POST /v1/traverse`,
`POST /v1/lookup`,
`GET /v1/stats`, `GET /v1/me`, `GET /v1/ops/overview`, `GET /healthz`, `GET /readyz`, `GET /openapi.json`,
`GET /metrics` (Prometheus), and the console under `/console` (search.web.console).
Every error is a JSON object `{"error": <code>, "message": ..., ["field": ...]}`, made in one place
(`error_response`, from the `ki.errors` tree): 400 bad input (naming the field), 409 `semantic_unavailable`
(a `mode` needing vectors where the semantic leg is off) and `mode_unavailable` (where the evidence says
keyword-only), 401 missing/invalid token, 403 not an
administrator (`/v1/stats`, `/v1/ops/overview`), 404 no document the caller may see, 413 body too large,
422 window too deep, 429 / 503 `overloaded` (admission control, with Retry-After), 503 a service we depend
on unavailable (`search_unavailable`, `rerank_unavailable`, `embedding_unavailable`, `service_unavailable`
for PostgreSQL): never a partial or silently unreranked answer. 500 `internal_error` for everything else,
also a service refusing what we sent (a bug, not worth a retry).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ki.errors import KiError, RequestInvalid
from ki.settings import ApiSettings, Settings
from projections.lanes import LANES
from search import after_answer
from search.compose import start_search_runtime
from search.consistency import ConsistencyGate, answer_consistent
from search.documents.chunks import ChunkId
from search.operations import Operations
from search.rate_limit import RateLimited
from search.request import (
    MAX_ID,
    parse_decision_request,
    parse_filter_request,
    parse_lookup_request,
    parse_read_request,
    parse_related_request,
    parse_search_request,
    parse_traverse_request,
)
from search.service import SearchService
from search.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from search.telemetry.ops import OpsReader
from search.web.admission import AdmissionGate, Overloaded
from search.web.auth import Authenticator
from search.web.console import Console, security_headers
from search.web.errors import Forbidden, NotFound, error_body
from search.web.openapi import openapi_document

log = logging.getLogger(__name__)

SERVICE_KEY = web.AppKey("search_service", SearchService)
OPERATIONS_KEY = web.AppKey("operations", Operations)
SETTINGS_KEY = web.AppKey("settings", Settings)
GATE_KEY = web.AppKey("gate", AdmissionGate)
OPS_KEY = web.AppKey("ops", OpsReader)
AUTH_KEY = web.AppKey("auth", Authenticator)
CONSISTENCY_KEY = web.AppKey("consistency", ConsistencyGate)
# Per request, for the access audit: who called (once authenticated) and the answer's JSON.
PRINCIPALS_KEY = "ki_principals"
ANSWER_KEY = "ki_answer"
_METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"})


def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": code, "message": message, **extra}, status=status)


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise
    try:
        return json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestInvalid("body", f"invalid JSON: {exc}") from None
    except RecursionError:
        raise RequestInvalid("body", "invalid JSON: nested too deeply") from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: KiError, where: str = "") -> web.Response:
    status, payload = error_body(exc, where)
    response = web.json_response(payload, status=status)
    if isinstance(exc, Overloaded):
        response.headers["Retry-After"] = "1"
    if isinstance(exc, RateLimited):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return _error(413, "body_too_large", exc.text or "request body too large")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
        raise
    except KiError as exc:  # the only errors the ports raise: each adapter maps its client's where it calls it
        return error_response(exc, f"{request.method} {request.path}")
    except Exception:  # a bug, or a client's exception a port let through unmapped (map it where it is called)
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, "internal_error", "internal error")


async def _principals(request: web.Request) -> list[str]:
    """Who calls (401 if nobody), within their rate limit (429): every /v1 endpoint starts here."""
    principals = await request.app[AUTH_KEY].principals(request.headers.get("Authorization"))
    request[PRINCIPALS_KEY] = principals  # for the access audit
    request.app[SERVICE_KEY].limiter.take(principals)
    return principals


def _answer(request: web.Request, payload: dict[str, Any]) -> web.Response:
    """The JSON answer, kept for the access audit (which documents it names)."""
    request[ANSWER_KEY] = payload
    return web.json_response(payload)


@web.middleware
async def audit(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One access-audit row per /v1 request (search.telemetry.audit), whatever its status; after `errors`, so an
    error is recorded with the status the caller got."""
    response = await handler(request)
    if request.path.startswith("/v1/"):
        principals = request.get(PRINCIPALS_KEY, [])
        request.app[OPERATIONS_KEY].audit_request(principals, _route(request), response.status, request.get(ANSWER_KEY))
    return response


def _endpoint(parse: Callable[[Any, ApiSettings], Any], call: Callable[..., Awaitable[Any]]) -> Handler:
    """A JSON endpoint: authenticate, parse and validate the body, run the service call, answer its JSON."""

    async def handler(request: web.Request) -> web.Response:
        principals = await _principals(request)
        parsed = parse(await _body(request), request.app[SETTINGS_KEY].api)
        timings = request.app[OPERATIONS_KEY].is_operator(principals)

        async def answer() -> dict[str, Any]:
            return (await call(request.app[SERVICE_KEY], principals, parsed)).to_json(timings=timings)

        return _answer(request, await answer_consistent(request.app[CONSISTENCY_KEY], parsed, answer))

    return handler


search_handler = _endpoint(parse_search_request, SearchService.search)
filter_handler = _endpoint(parse_filter_request, SearchService.search_filter)
decisions_handler = _endpoint(parse_decision_request, SearchService.search_decisions)


MAX_STATS_HOURS = 24 * 366


async def stats_handler(request: web.Request) -> web.Response:
    """`GET /v1/stats?hours=24`: the retrieval statistics of the last hours (administrators only: they
    aggregate every caller's queries)."""
    principals = await _principals(request)
    hours = _whole(request, "hours", 24, MAX_STATS_HOURS)
    operations = request.app[OPERATIONS_KEY]
    if not await operations.is_admin(principals):
        raise Forbidden("retrieval statistics are for administrators (security.admin_principals)")
    return web.json_response(await operations.stats_summary(hours))


def _whole(request: web.Request, name: str, default: int, most: int) -> int:
    """A whole-number query parameter between 1 and `most` (400 naming it otherwise)."""
    raw = request.query.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise RequestInvalid(name, f"must be a whole number, got {raw[:40]!r}") from None
    if not 1 <= value <= most:
        raise RequestInvalid(name, f"must be between 1 and {most}")
    return value


MAX_AUDIT_ROWS = 1000


async def audit_handler(request: web.Request) -> web.Response:
    """`GET /v1/audit?hours=24&principal=user:anna&limit=100`: the access audit's newest rows
    (administrators only: it names every caller and what they saw)."""
    principals = await _principals(request)
    hours = _whole(request, "hours", 24, MAX_STATS_HOURS)
    limit = _whole(request, "limit", 100, MAX_AUDIT_ROWS)
    principal = request.query.get("principal") or None
    if principal is not None and len(principal) > 512:
        raise RequestInvalid("principal", "must be at most 512 characters")
    operations = request.app[OPERATIONS_KEY]
    if not await operations.is_admin(principals):
        raise Forbidden("the access audit is for administrators (security.admin_principals)")
    return web.json_response(await operations.read_audit(hours, principal, limit))


def _path_id(request: web.Request, name: str) -> int:
    """An id in the path (`document_id`, `version_id`): a positive whole number, else a 400 naming it."""
    raw = request.match_info[name]
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_ID:
        raise RequestInvalid(name, f"must be a positive whole number, got {raw[:40]!r}")
    return int(raw)


def _document_id(request: web.Request) -> int:
    return _path_id(request, "document_id")


async def document_handler(request: web.Request) -> web.Response:
    """`GET /v1/documents/{id}`: 404 alike for a document that is not there and one the caller may not see."""
    principals = await _principals(request)
    found = await request.app[SERVICE_KEY].get_document(principals, _document_id(request))
    if found is None:
        raise NotFound("no such document")
    return _answer(request, found)


async def text_handler(request: web.Request) -> web.Response:
    """`GET /v1/documents/{id}/versions/{version_id}/text?offset=&length=`: 404 alike for a version that is not
    there and one the caller may not see (search.documents.text)."""
    principals = await _principals(request)
    document_id, version_id = _document_id(request), _path_id(request, "version_id")
    parsed = parse_read_request(request.query, request.app[SETTINGS_KEY].api)
    found = await request.app[SERVICE_KEY].read_text(principals, document_id, version_id, parsed)
    if found is None:
        raise NotFound("no such version")
    return _answer(request, found)


async def chunk_handler(request: web.Request) -> web.Response:
    """`GET /v1/chunks/{chunk_id}` (a hit's `chunk_id`): 404 alike for a chunk that is not there and one of a
    version the caller may not see (search.documents.chunks)."""
    principals = await _principals(request)
    raw = request.match_info["chunk_id"]
    chunk = ChunkId.parse(raw)
    if chunk is None:
        raise RequestInvalid(
            "chunk_id", f"must be a hit's chunk_id ({{version_id}}:{{kind}}:{{ordinal}}), got {raw[:60]!r}"
        )
    found = await request.app[SERVICE_KEY].read_chunk(principals, chunk)
    if found is None:
        raise NotFound("no such chunk")
    return _answer(request, found)


async def related_handler(request: web.Request) -> web.Response:
    principals = await _principals(request)
    document_id = _document_id(request)
    parsed = parse_related_request(request.query, request.app[SETTINGS_KEY].api)
    found = await request.app[SERVICE_KEY].related(principals, document_id, parsed)
    if found is None:
        raise NotFound("no such document")
    return _answer(request, found)


async def traverse_handler(request: web.Request) -> web.Response:
    principals = await _principals(request)
    parsed = parse_traverse_request(await _body(request), request.app[SETTINGS_KEY].api)
    return _answer(request, await request.app[SERVICE_KEY].traverse(principals, parsed))


async def lookup_handler(request: web.Request) -> web.Response:
    """`POST /v1/lookup`: exactly one document by identifier or title, `ambiguous` or `not_found` (a 200 each: a
    typed answer, the same for a hidden document as for a missing one; search.documents.lookup)."""
    principals = await _principals(request)
    parsed = parse_lookup_request(await _body(request), request.app[SETTINGS_KEY].api)
    return _answer(request, await request.app[SERVICE_KEY].lookup(principals, parsed))


async def me_handler(request: web.Request) -> web.Response:
    """`GET /v1/me`: the principals the token names and whether they make an administrator (the console
    asks this after sign-in: a bad token is a 401 here, before any search)."""
    principals = await _principals(request)
    admin = await request.app[OPERATIONS_KEY].is_admin(principals)
    return web.json_response({"principals": principals, "admin": admin})


async def ops_handler(request: web.Request) -> web.Response:
    """`GET /v1/ops/overview`: the operations dashboard's figures (administrators only, search.telemetry.ops)."""
    principals = await _principals(request)
    operations = request.app[OPERATIONS_KEY]
    if not await operations.is_admin(principals):
        raise Forbidden("the operations overview is for administrators (security.admin_principals)")
    index_error = await operations.refresh_index_gauges(request.app[SETTINGS_KEY].api.ops.scrape_timeout_s)
    return web.json_response(await request.app[OPS_KEY].read(operations.metrics.exposition, index_error))


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    operations = request.app[OPERATIONS_KEY]
    checks = await operations.ready()
    ok = all(v == "ok" for v in checks.values())
    # The scope cache is not a readiness condition: without it, scopes are compiled in SQL.
    body = {"status": "ok" if ok else "unavailable", "checks": checks, "scope_cache": operations.scope_cache_state()}
    return web.json_response(body, status=200 if ok else 503)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def metrics(request: web.Request) -> web.Response:
    """`GET /metrics` for operators only: index sizes and every tenant's access-change counts are not a
    caller's business. Prometheus sends the static `api.ops.metrics_token` (its `credentials_file`), people
    an operator's or administrator's token."""
    operations = request.app[OPERATIONS_KEY]
    static = request.app[SETTINGS_KEY].api.ops.metrics_token
    sent = request.headers.get("Authorization", "")
    by_static_token = bool(static) and hmac.compare_digest(sent.encode(), f"Bearer {static}".encode())
    if not by_static_token and not operations.is_operator(await _principals(request)):
        raise Forbidden("metrics are for operators (security.operator_principals) and api.ops.metrics_token")
    await operations.refresh_index_gauges(request.app[SETTINGS_KEY].api.ops.scrape_timeout_s)
    body = operations.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


@web.middleware
async def admission(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bound the API work in flight and waiting (health, readiness, metrics and the document are exempt)."""
    if not request.path.startswith("/v1/"):
        return await handler(request)
    try:
        async with request.app[GATE_KEY].admit():
            return await handler(request)
    except Overloaded:
        request.app[SERVICE_KEY].metrics.rejected.inc()
        raise


def _route(request: web.Request) -> str:
    """The route template, never the raw path (a scanner's random paths must not become label values)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def answer_first(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: the answer is sent before the work the request deferred starts (search.after_answer: the
    refresh of a stale cache entry it was answered from), so that work never shows in the request's time."""
    with after_answer.collecting() as pending:
        try:
            response = await handler(request)
            if pending and not response.prepared:
                await response.prepare(request)
                await response.write_eof()
            return response
        finally:
            after_answer.release(pending)


@web.middleware
async def instrument(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request count and latency by route, method and status (outermost, so it sees the final status)."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        m = request.app[SERVICE_KEY].metrics
        method = request.method if request.method in _METHODS else "other"
        labels = (_route(request), method, str(status))
        m.requests.labels(*labels).inc()
        m.request_seconds.labels(*labels).observe(time.perf_counter() - started)


def lane_metrics_urls(settings: Settings) -> dict[str, str]:
    """Each sync lane's /metrics: `api.ops.lane_urls`, else the local lanes' ports."""
    if settings.api.ops.lane_urls:
        return dict(settings.api.ops.lane_urls)
    return {lane: f"http://127.0.0.1:{settings.streams.lane_web_port(lane)}/metrics" for lane in LANES}


def build_app(
    settings: Settings, service: SearchService, operations: Operations, consistency: ConsistencyGate
) -> web.Application:
    # answer_first sends the answer before deferred work starts; instrument sees the final status; errors
    # turns Overloaded (raised by admission) into JSON.
    app = web.Application(
        middlewares=[answer_first, instrument, security_headers, audit, errors, admission],
        client_max_size=settings.api.limits.max_body_bytes,
    )
    app[SETTINGS_KEY] = settings
    app[SERVICE_KEY] = service
    app[OPERATIONS_KEY] = operations
    app[CONSISTENCY_KEY] = consistency
    app[AUTH_KEY] = Authenticator(settings.api, settings.oidc)
    app[OPS_KEY] = OpsReader(lane_metrics_urls(settings), settings.api.ops.window_s, settings.api.ops.scrape_timeout_s)
    limits = settings.api.limits
    app[GATE_KEY] = AdmissionGate(
        limits.max_concurrent_requests,
        limits.max_queued_requests,
        limits.queue_timeout_s,
        on_change=service.metrics.admission,
    )
    app.router.add_post("/v1/search", search_handler)
    app.router.add_post("/v1/search/filter", filter_handler)
    app.router.add_post("/v1/decisions/search", decisions_handler)
    app.router.add_get("/v1/stats", stats_handler)
    app.router.add_get("/v1/audit", audit_handler)
    app.router.add_get("/v1/documents/{document_id}", document_handler)
    app.router.add_get("/v1/documents/{document_id}/related", related_handler)
    app.router.add_get("/v1/documents/{document_id}/versions/{version_id}/text", text_handler)
    app.router.add_get("/v1/chunks/{chunk_id}", chunk_handler)
    app.router.add_post("/v1/traverse", traverse_handler)
    app.router.add_post("/v1/lookup", lookup_handler)
    app.router.add_get("/v1/me", me_handler)
    app.router.add_get("/v1/ops/overview", ops_handler)
    Console(settings, service.engine, _body).add_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/metrics", metrics)
    return app


async def create_app(settings: Settings) -> web.Application:
    """The app with its own search service and operations service (search.compose), closed on cleanup."""
    runtime = await start_search_runtime(settings)
    app = build_app(settings, runtime.service, runtime.operations, runtime.consistency)

    async def cleanup(_: web.Application) -> None:
        await runtime.close()

    app.on_cleanup.append(cleanup)
    return app


def serve(settings: Settings, *, reuse_port: bool = False) -> None:
    """Serve until stopped. `reuse_port`: bind with SO_REUSEPORT, as each of `ki serve --workers N` does."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opensearch").setLevel(logging.WARNING)
    web.run_app(
        create_app(settings),
        host=settings.api.host,
        port=settings.api.port,
        access_log=None,
        reuse_port=reuse_port or None,
    )
