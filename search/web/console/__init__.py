"""The search console and operations dashboard: static pages under `/console` that call the public API
with the bearer token the person pasted (or, in demo mode only, one minted for a demo user they picked).

Nothing loads from anywhere but this server: the assets ship in the package, and a strict
Content-Security-Policy (no inline script or style, connections to this origin only) says so to the browser.
The demo endpoints (`/console/demo/users`, `/console/demo/token`) exist only with `api.demo_mode`: anyone
who reaches them can act as any user, which is the point of a demo and never right anywhere else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

from aiohttp import web
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ki.clients import database_errors
from ki.errors import RequestInvalid
from ki.principals import canonical_principal
from ki.settings import Settings
from search.web.auth import mint_token

STATIC = Path(str(files(__package__) / "static"))
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
DEMO_ADMIN = "demo-admin"
MAX_DEMO_USERS = 50

# Users a demo token may be minted for: the user principals the data names (grants, memberships, aliases).
_DEMO_USERS = text(
    """
    SELECT principal FROM (
        SELECT principal FROM grants
        UNION SELECT member_principal FROM group_memberships
        UNION SELECT principal FROM principal_aliases
    ) known
    WHERE principal LIKE 'user:%'
      AND CASE WHEN :exact THEN principal = :q ELSE strpos(lower(principal), lower(:q)) > 0 END
    ORDER BY principal
    LIMIT :limit
    """
)


@web.middleware
async def security_headers(request: web.Request, handler: Any) -> web.StreamResponse:
    response: web.StreamResponse = await handler(request)
    if request.path.startswith("/console"):
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-cache"
    return response


class Console:
    """The console's routes; `read_body` is the API's JSON body reader (one place for its errors)."""

    def __init__(self, settings: Settings, engine: AsyncEngine, read_body: Callable[[web.Request], Awaitable[Any]]):
        self.api, self.engine, self.read_body = settings.api, engine, read_body

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/console", self._redirect)
        app.router.add_get("/console/", self._index)
        app.router.add_get("/console/demo/users", self._demo_users)
        app.router.add_post("/console/demo/token", self._demo_token)
        app.router.add_static("/console/static/", STATIC, show_index=False, follow_symlinks=False)

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/console/")

    def _require_demo(self) -> None:
        if not self.api.demo_mode:
            raise web.HTTPNotFound()

    async def _known_users(self, q: str, *, exact: bool = False) -> list[str]:
        with database_errors():
            async with self.engine.connect() as conn:
                params = {"q": q, "exact": exact, "limit": MAX_DEMO_USERS}
                return list((await conn.execute(_DEMO_USERS, params)).scalars().all())

    async def _demo_users(self, request: web.Request) -> web.Response:
        """`GET /console/demo/users?q=anna`: up to 50 user principals the data knows, and the administrator."""
        self._require_demo()
        users = [{"principal": p, "label": p.removeprefix("user:"), "admin": False}
                 for p in await self._known_users(request.query.get("q", "")[:100])]  # fmt: skip
        admin = {"principal": f"user:{DEMO_ADMIN}", "label": f"{DEMO_ADMIN} (administrator)", "admin": True}
        return web.json_response({"users": [admin, *users]})

    async def _demo_token(self, request: web.Request) -> web.Response:
        """`POST /console/demo/token {"principal": "user:..."}`: a one-hour token for a known demo user."""
        self._require_demo()
        body = await self.read_body(request)
        principal = body.get("principal") if isinstance(body, dict) else None
        if (
            not isinstance(principal, str)
            or not principal.startswith("user:")
            or canonical_principal(principal) is None
        ):
            raise RequestInvalid("principal", "must be a user principal such as user:anna")
        subject = principal.removeprefix("user:")  # a token's subject becomes user:<sub>
        if principal == f"user:{DEMO_ADMIN}":
            return web.json_response({"token": mint_token(self.api, subject, roles=["admin"])})
        if not await self._known_users(principal, exact=True):
            raise RequestInvalid("principal", f"{principal[:80]!r} is not a user the demo data knows")
        return web.json_response({"token": mint_token(self.api, subject)})
