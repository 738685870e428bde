"""Callers signed in at an OpenID Connect provider: RS256 and ES256 access tokens verified against the
provider's published keys (JWKS), with issuer, audience, expiry, not-before and issued-at checks
(`oidc.clock_skew_s` of tolerance) and claim paths that fit the provider's layout.

Keys are discovered from `{issuer}/.well-known/openid-configuration` (or `oidc.jwks_url`), cached for
`oidc.jwks_cache_ttl_s`, and fetched again at once for a token whose `kid` is unknown — at most every
`oidc.jwks_refresh_min_interval_s`, so a flood of made-up `kid`s cannot hammer the provider. Fail closed:
a token is accepted only with a key the provider published; when the provider cannot be reached and no
cached key fits, the answer is 503 `identity_provider_unavailable`, never acceptance. A cached key keeps
working through an outage of the provider.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jwt

from ki.errors import PermanentError, Unavailable
from ki.settings import OidcSettings

log = logging.getLogger(__name__)

FetchJson = Callable[[str, float], Awaitable[Any]]


class IdentityProviderUnavailable(Unavailable):
    """The provider's keys could not be fetched, and no cached key fits the token (HTTP 503)."""


class OidcTokenInvalid(PermanentError):
    """The token is not one this provider signed for this API (HTTP 401; search.web.auth turns it into AuthError)."""


async def fetch_json(url: str, timeout_s: float) -> Any:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status != 200:
                raise IdentityProviderUnavailable(f"{url}: HTTP {response.status}")
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise IdentityProviderUnavailable(f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None


def claim(claims: dict[str, Any], path: str) -> Any:
    """The value at a dotted claim path (`realm_access.roles`); None where the path ends early. A claim whose
    own name contains dots (some providers use URLs as claim names) is found as it is first."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _signing_keys(document: Any) -> dict[str | None, jwt.PyJWK]:
    """The signature keys of a JWKS document by `kid` (encryption keys and keys of other types left out)."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise IdentityProviderUnavailable("the JWKS document has no `keys` list")
    keys: dict[str | None, jwt.PyJWK] = {}
    for data in document["keys"]:
        if not isinstance(data, dict) or data.get("use", "sig") != "sig" or data.get("kty") not in ("RSA", "EC"):
            continue
        try:
            keys[data.get("kid")] = jwt.PyJWK(data)
        except (jwt.PyJWKError, jwt.InvalidKeyError) as exc:
            log.warning("oidc: JWKS key %s skipped: %s", data.get("kid"), exc)
    return keys


class Jwks:
    """The provider's signing keys, cached and refreshed as the module docstring says. `fetch` and `clock`
    are the network and the time (the unit tests pass their own; the service uses `fetch_json`)."""

    def __init__(self, oidc: OidcSettings, fetch: FetchJson = fetch_json, clock: Callable[[], float] = time.monotonic):
        self.oidc, self.fetch, self.clock = oidc, fetch, clock
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._tried_at: float | None = None
        self._jwks_url = oidc.jwks_url
        self._lock = asyncio.Lock()
        self.refreshes = 0

    async def _url(self) -> str:
        if not self._jwks_url:
            discovery = f"{self.oidc.issuer.rstrip('/')}/.well-known/openid-configuration"
            document = await self.fetch(discovery, self.oidc.http_timeout_s)
            if not isinstance(document, dict) or not isinstance(document.get("jwks_uri"), str):
                raise IdentityProviderUnavailable(f"{discovery}: no jwks_uri")
            if document.get("issuer") != self.oidc.issuer:
                raise IdentityProviderUnavailable(
                    f"{discovery} names the issuer {document.get('issuer')!r}, not oidc.issuer {self.oidc.issuer!r}"
                )
            self._jwks_url = document["jwks_uri"]
        return self._jwks_url

    async def _refresh(self) -> None:
        self._tried_at = self.clock()
        self.refreshes += 1
        keys = _signing_keys(await self.fetch(await self._url(), self.oidc.http_timeout_s))
        self._keys, self._fetched_at = keys, self.clock()
        log.info("oidc: %d signing keys from the provider (%s)", len(keys), ", ".join(map(str, keys)))

    def _due(self, kid: str | None) -> bool:
        now = self.clock()
        if self._fetched_at is None or now - self._fetched_at >= self.oidc.jwks_cache_ttl_s:
            return self._tried_at is None or now - self._tried_at >= min(1.0, self.oidc.jwks_refresh_min_interval_s)
        unknown = kid not in self._keys
        return unknown and (self._tried_at is None or now - self._tried_at >= self.oidc.jwks_refresh_min_interval_s)

    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        async with self._lock:
            if self._due(kid):
                try:
                    await self._refresh()
                except IdentityProviderUnavailable as exc:
                    if kid not in self._keys:
                        raise
                    log.warning("oidc: keys not refreshed, using the cached key %s: %s", kid, exc)
            key = self._keys.get(kid)
            if key is None and kid is None and len(self._keys) == 1:
                key = next(iter(self._keys.values()))  # a provider with one key may leave `kid` out
        if key is None:
            if self._fetched_at is None:
                raise IdentityProviderUnavailable("the identity provider's keys have not been fetched yet")
            raise OidcTokenInvalid(f"signed with a key the identity provider does not publish (kid {kid!r})")
        if key.algorithm_name != alg:
            raise OidcTokenInvalid(f"the key {kid!r} is a {key.algorithm_name} key, the token says {alg}")
        return key

    async def verify(self, token: str, header: dict[str, Any]) -> dict[str, Any]:
        """The claims of a token this provider signed for this API; raises OidcTokenInvalid."""
        check_header(header)
        alg = header.get("alg")
        if alg not in self.oidc.algorithms:
            raise OidcTokenInvalid(f"algorithm {alg!r} is not in oidc.algorithms")
        key = await self.key(header.get("kid"), alg)
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.oidc.audience,
                issuer=self.oidc.issuer,
                leeway=self.oidc.clock_skew_s,
                options={"require": ["exp", "iss", "aud"]},
            )
            return check_times(claims)
        except jwt.ExpiredSignatureError:
            raise OidcTokenInvalid("token expired") from None
        except jwt.InvalidTokenError as exc:
            raise OidcTokenInvalid(str(exc)) from None


def check_header(header: dict[str, Any]) -> None:
    """A `crit` header names extensions the recipient must understand or reject the token (RFC 7515
    4.1.11); this API understands none."""
    if "crit" in header:
        raise OidcTokenInvalid(f"critical header extensions {header['crit']!r} are not understood")


def check_times(claims: dict[str, Any]) -> dict[str, Any]:
    """`claims`, once `exp`, `nbf` and `iat` are numbers where present (NumericDate, RFC 7519 2): a string
    "9999999999" is not a time, however a library reads it."""
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name)
        if name in claims and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise OidcTokenInvalid(f"claim {name!r} must be a number (seconds since the epoch)")
    return claims


def claim_values(claims: dict[str, Any], path: str, prefix: str = "") -> list[str]:
    """A claim's values as strings (a string or a list of strings), each without `prefix`."""
    raw = claim(claims, path)
    if raw is None:
        return []
    values = [raw] if isinstance(raw, str) else raw
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise OidcTokenInvalid(f"claim {path!r} must be a string or a list of strings")
    return [v.removeprefix(prefix) if prefix else v for v in values if v.strip()]
