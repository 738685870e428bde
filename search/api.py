"""The aiohttp search API.

`POST /v1/search`, `POST /v1/search/filter`, `GET /healthz`, `GET /readyz`, `GET /openapi.json`.
Every error is a JSON object `{"error": <code>, "message": ..., ["field": ...]}`:
400 bad input (naming the field), 401 missing/invalid token, 413 body too large, 422 window too deep,
503 OpenSearch unavailable (never a partial answer).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ki.settings import Settings
from search.auth import AuthError, authenticate
from search.filters import (
    MAX_RANKED_WINDOW,
    FilterRequest,
    RequestInvalid,
    SearchRequest,
    WindowTooDeep,
    parse_filter_request,
    parse_search_request,
)
from search.service import SearchService, SearchUnavailable

log = logging.getLogger(__name__)

SERVICE_KEY = web.AppKey("search_service", SearchService)
SETTINGS_KEY = web.AppKey("settings", Settings)
LIMIT_KEY = web.AppKey("limit", asyncio.Semaphore)


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


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AuthError as exc:
        return _error(401, "unauthorized", str(exc))
    except RequestInvalid as exc:
        return _error(400, "invalid_request", exc.message, field=exc.field)
    except WindowTooDeep as exc:
        return _error(422, "window_too_deep", str(exc), field="offset", max_window=MAX_RANKED_WINDOW)
    except SearchUnavailable as exc:
        return _error(503, "search_unavailable", str(exc))
    except web.HTTPRequestEntityTooLarge as exc:
        return _error(413, "body_too_large", exc.text or "request body too large")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, "internal_error", "internal error")


def _principals(request: web.Request) -> list[str]:
    return authenticate(request.headers.get("Authorization"), request.app[SETTINGS_KEY].api)


async def search_handler(request: web.Request) -> web.Response:
    principals = _principals(request)
    parsed = parse_search_request(await _body(request), request.app[SETTINGS_KEY].api)
    async with request.app[LIMIT_KEY]:
        result = await request.app[SERVICE_KEY].search(principals, parsed)
    return web.json_response(result.to_json())


async def filter_handler(request: web.Request) -> web.Response:
    principals = _principals(request)
    parsed = parse_filter_request(await _body(request), request.app[SETTINGS_KEY].api)
    async with request.app[LIMIT_KEY]:
        result = await request.app[SERVICE_KEY].search_filter(principals, parsed)
    return web.json_response(result.to_json())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    checks = await request.app[SERVICE_KEY].ready()
    ok = all(v == "ok" for v in checks.values())
    return web.json_response({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)


def openapi_document() -> dict[str, Any]:
    """A minimal OpenAPI 3 document; request schemas come from the pydantic models."""
    search_schema = SearchRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    filter_schema = FilterRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = {}
    for schema in (search_schema, filter_schema):
        schemas.update(schema.pop("$defs", {}))
    schemas["SearchRequest"] = search_schema
    schemas["FilterRequest"] = filter_schema
    schemas["Error"] = {
        "type": "object",
        "required": ["error", "message"],
        "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}},
    }
    schemas["SearchResponse"] = {
        "type": "object",
        "properties": {
            "hits": {"type": "array", "items": {"type": "object"}},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
            "has_more": {"type": "boolean"},
        },
    }

    def err(description: str) -> dict[str, Any]:
        return {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }

    def post(summary: str, model: str) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
                },
                "responses": {
                    "200": {
                        "description": "hits of the requested window",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SearchResponse"}}},
                    },
                    "400": err("invalid input; `field` names the offending field"),
                    "401": err("missing or invalid bearer token"),
                    "413": err("request body too large"),
                    "422": err(f"offset + limit exceeds {MAX_RANKED_WINDOW}"),
                    "503": err("OpenSearch unavailable"),
                },
            }
        }

    return {
        "openapi": "3.0.3",
        "info": {"title": "ki-sidecar search API", "version": "1"},
        "paths": {
            "/v1/search": post("Ranked hybrid search within the caller's SQL access scope", "SearchRequest"),
            "/v1/search/filter": post(
                "Metadata-only search (doc_date descending, one hit per version)", "FilterRequest"
            ),
            "/healthz": {"get": {"summary": "process is up", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {
                "get": {
                    "summary": "PostgreSQL and OpenSearch reachable, index alias present",
                    "responses": {"200": {"description": "ready"}, "503": err("not ready")},
                }
            },
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
    }


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def build_app(settings: Settings, service: SearchService) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=settings.api.max_body_bytes)
    app[SETTINGS_KEY] = settings
    app[SERVICE_KEY] = service
    app[LIMIT_KEY] = asyncio.Semaphore(settings.api.max_concurrent_requests)
    app.router.add_post("/v1/search", search_handler)
    app.router.add_post("/v1/search/filter", filter_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    return app


async def create_app(settings: Settings) -> web.Application:
    """The app with its own OpenSearch client, async engine and embedder, closed on cleanup."""
    from ki.db.engine import make_async_engine
    from ki.embedding import create_embedder
    from streams.writer import make_client

    loop = asyncio.get_running_loop()
    embedder = await loop.run_in_executor(None, create_embedder, settings)
    engine = make_async_engine(settings)
    client = make_client(settings)
    app = build_app(settings, SearchService(settings, engine, client, embedder))

    async def close(_: web.Application) -> None:
        await client.close()
        await engine.dispose()

    app.on_cleanup.append(close)
    return app


def serve(settings: Settings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("opensearch").setLevel(logging.WARNING)
    web.run_app(create_app(settings), host=settings.api.host, port=settings.api.port, access_log=None)
