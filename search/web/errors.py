"""The one map from the error tree (`ki.errors`) to an answer's status and JSON body, shared by the HTTP API
(search.web.api) and the MCP server's tool errors (apps.runtime.mcp_server); no aiohttp here, so the MCP
server maps errors without importing the HTTP API.
"""

from __future__ import annotations

import logging
from typing import Any

from ki.embedding import EmbeddingUnavailable
from ki.errors import KiError, PermanentError, RequestInvalid, SearchUnavailable, TransientError, Unavailable
from search.consistency import Stale
from search.plan import ModeUnavailable, SemanticUnavailable
from search.ranking.rerank import RerankUnavailable
from search.rate_limit import RateLimited
from search.request import WindowTooDeep
from search.web.admission import Overloaded
from search.web.auth import AuthError
from search.web.oidc import IdentityProviderUnavailable

log = logging.getLogger(__name__)


class Forbidden(PermanentError):
    """An authenticated caller asked for something only administrators may see."""


class NotFound(PermanentError):
    """No document the caller may see has this id (whether it exists is not said)."""


# A service that did not answer: the code and the message a caller sees (the details go to the log).
_UNAVAILABLE: list[tuple[type[Unavailable], str, str]] = [
    (SearchUnavailable, "search_unavailable", "the search index is unavailable; no partial answer is given"),
    (RerankUnavailable, "rerank_unavailable", "the reranker failed; no unreranked answer is given"),
    (EmbeddingUnavailable, "embedding_unavailable", "the embedding service is unavailable; no partial answer"),
    (
        IdentityProviderUnavailable,
        "identity_provider_unavailable",
        "the identity provider's signing keys could not be fetched, so the token cannot be checked",
    ),
    (Unavailable, "service_unavailable", "a service the search needs is unavailable; no partial answer is given"),
]


def error_body(exc: KiError, where: str = "") -> tuple[int, dict[str, Any]]:
    """The one map from the error tree to an answer: the HTTP status and `{error, message, [field]}` (HTTP
    answers in search.web.api, tool errors in the MCP server)."""

    def body(status: int, code: str, message: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        return status, {"error": code, "message": message, **extra}

    if isinstance(exc, AuthError):
        return body(401, "unauthorized", str(exc))
    if isinstance(exc, Forbidden):
        return body(403, "forbidden", str(exc))
    if isinstance(exc, NotFound):
        return body(404, "not_found", str(exc))
    if isinstance(exc, Overloaded):
        return body(exc.status, "overloaded", exc.message)
    if isinstance(exc, RateLimited):
        return body(429, "rate_limited", str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, ModeUnavailable):  # the evidence says keyword-only: the gate's reason, and the way out
        return body(409, "mode_unavailable", exc.message, field=exc.field, mode=exc.mode, default_mode="lexical")
    if isinstance(exc, SemanticUnavailable):
        return body(409, "semantic_unavailable", exc.message, field=exc.field)
    if isinstance(exc, WindowTooDeep):
        return body(422, "window_too_deep", exc.message, field=exc.field, max_window=exc.max_window)
    if isinstance(exc, RequestInvalid):
        return body(400, "invalid_request", exc.message, field=exc.field)
    if isinstance(exc, Stale):  # the caller's precondition (its token) does not hold yet; never an older answer
        return body(412, "stale", str(exc), waited_s=round(exc.waited_s, 3))
    if isinstance(exc, Unavailable):
        log.warning("%s: %s unavailable: %s", where, exc.service, exc)
        code, message = next((c, m) for kind, c, m in _UNAVAILABLE if isinstance(exc, kind))
        return body(503, code, message)
    if isinstance(exc, TransientError):
        log.warning("%s: %s: %s", where, type(exc).__name__, exc)
        return body(503, "unavailable", "temporarily unavailable; retry later")
    log.error("%s: %s: %s", where, type(exc).__name__, exc)
    return body(500, "internal_error", "internal error")
