"""Bearer-token authentication: a signed JWT names the caller; principals never come from the body.
Two kinds of signer: the HMAC secret of `api.jwt.*` (below) and an OpenID Connect provider (search.web.oidc);
`Authenticator` tells them apart by the token's algorithm.

Principals: the subject claim becomes `user:<sub>`, each group claim value `group:<g>`, each role claim
value `role:<r>`, whatever the value contains: a subject "role:admin" is the user "user:role:admin", never
an administrator (only `claims_carry_kinds`, for a signer that writes principals on purpose, takes a
`kind:name` value as that principal). A value that then is not a principal (`ki.principals`: well-formed,
NFC, no letter that case folding would turn into another name, as "anna.ſchmidt" or the Kelvin sign) is
rejected (401) rather than matching nobody or somebody else. The token must be signed with
`api.jwt.algorithm` (HMAC; `alg: none` and any other algorithm are rejected), carry a numeric `exp`, match
`api.jwt.issuer` and `api.jwt.audience`, and name no `crit` extension (we understand none; RFC 7515
4.1.11); `nbf` and `iat`, when present, are numbers too. Tokens over `api.limits.max_token_bytes` are rejected
before decoding; claim values must be text PostgreSQL can take (no NUL, valid Unicode, at most 512
characters).
"""

from __future__ import annotations

import time
from typing import Any

import jwt

from ki.errors import PermanentError
from ki.principals import canonical_principal
from ki.settings import ApiSettings, OidcSettings
from search.request import check_text
from search.web.oidc import Jwks, OidcTokenInvalid, check_header, check_times, claim_values

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})


class AuthError(PermanentError):
    """Missing or invalid credentials (HTTP 401)."""


MAX_PRINCIPAL_CHARS = 512


def _principal_text(name: str, value: str) -> str:
    """Claim values become SQL parameters: no NUL, valid Unicode, bounded length (else 401, never 500)."""
    if len(value) > MAX_PRINCIPAL_CHARS:
        raise AuthError(f"claim {name!r}: values must be at most {MAX_PRINCIPAL_CHARS} characters")
    try:
        check_text(value)
    except ValueError as exc:
        raise AuthError(f"claim {name!r}: {exc}") from None
    return value


def _values(claims: dict[str, Any], name: str) -> list[str]:
    raw = claims.get(name)
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [p for p in raw.replace(",", " ").split() if p]
    if not isinstance(raw, list) or not all(isinstance(v, str) and v.strip() for v in raw):
        raise AuthError(f"claim {name!r} must be a string or a list of non-empty strings")
    return [_principal_text(name, v.strip()) for v in raw]


def _prefixed(name: str, prefix: str, value: str, carries_kind: bool = False) -> str:
    """`prefix:value` (or `value` itself when the signer writes principals and it reads kind:name); 401
    unless that is a principal."""
    principal = value if carries_kind and canonical_principal(value) is not None else f"{prefix}:{value}"
    if canonical_principal(principal) is None:
        raise AuthError(
            f"claim {name!r}: {value[:80]!r} makes no principal (NFC text whose case folding only changes case)"
        )
    return principal


def _principals(
    names: tuple[str, str, str], subject: str, groups: list[str], roles: list[str], carry_kinds: bool
) -> list[str]:
    """The caller's principals from its subject, groups and roles (the claims' names, for errors)."""
    sub_claim, groups_claim, roles_claim = names
    principals = [_prefixed(sub_claim, "user", _principal_text(sub_claim, subject.strip()), carry_kinds)]
    principals += [_prefixed(groups_claim, "group", _principal_text(groups_claim, g), carry_kinds) for g in groups]
    principals += [_prefixed(roles_claim, "role", _principal_text(roles_claim, r).removeprefix("role:")) for r in roles]
    return list(dict.fromkeys(principals))


def principals_from_claims(claims: dict[str, Any], api: ApiSettings) -> list[str]:
    subject = claims.get(api.jwt.subject_claim)
    if not isinstance(subject, str) or not subject.strip():
        raise AuthError(f"claim {api.jwt.subject_claim!r} is missing or empty")
    names = (api.jwt.subject_claim, api.jwt.groups_claim, api.jwt.roles_claim)
    groups, roles = _values(claims, api.jwt.groups_claim), _values(claims, api.jwt.roles_claim)
    return _principals(names, subject, groups, roles, api.jwt.claims_carry_kinds)


def decode_token(token: str, api: ApiSettings) -> dict[str, Any]:
    try:
        check_header(jwt.get_unverified_header(token))
        return check_times(
            jwt.decode(
                token,
                api.jwt.secret,
                algorithms=[api.jwt.algorithm],
                issuer=api.jwt.issuer,
                audience=api.jwt.audience,
                options={"require": ["exp", "iss", "aud", api.jwt.subject_claim]},
            )
        )
    except OidcTokenInvalid as exc:
        raise AuthError(f"invalid token: {exc}") from None
    except jwt.ExpiredSignatureError:
        raise AuthError("token expired") from None
    except jwt.InvalidTokenError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    except (ValueError, TypeError):  # e.g. characters that are not even ASCII; never a 500
        raise AuthError("invalid token: not a JWT") from None


def authenticate(authorization: str | None, api: ApiSettings) -> list[str]:
    """Principals of the caller named by an `Authorization: Bearer <jwt>` header signed with the HMAC
    secret (the services use `Authenticator`, which also knows identity providers); raises AuthError."""
    return principals_from_claims(decode_token(bearer_token(authorization, api), api), api)


def bearer_token(authorization: str | None, api: ApiSettings) -> str:
    """The token of an `Authorization: Bearer <jwt>` header (length-checked); raises AuthError."""
    if not authorization:
        raise AuthError("missing bearer token")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("authorization header must be 'Bearer <token>'")
    if len(token.strip()) > api.limits.max_token_bytes:
        raise AuthError(f"token longer than {api.limits.max_token_bytes} bytes")
    return token.strip()


def principals_from_oidc(claims: dict[str, Any], oidc: OidcSettings) -> list[str]:
    """Principals of a provider's token, read at the configured claim paths (same rules as for HMAC)."""
    try:
        subjects = claim_values(claims, oidc.subject_claim)
        groups = claim_values(claims, oidc.groups_claim, oidc.group_prefix)
        roles = claim_values(claims, oidc.roles_claim)
    except OidcTokenInvalid as exc:
        raise AuthError(str(exc)) from None
    if len(subjects) != 1:
        raise AuthError(f"claim {oidc.subject_claim!r} is missing or empty")
    names = (oidc.subject_claim, oidc.groups_claim, oidc.roles_claim)
    return _principals(names, subjects[0], groups, roles, oidc.claims_carry_kinds)


class Authenticator:
    """Who calls: HMAC tokens (`api.jwt.*`, while `api.jwt.enabled`) and, with `oidc.issuer` set, an
    identity provider's RS256/ES256 tokens (search.web.oidc). The token's own `alg` picks the path, and each
    path accepts only its own algorithms: an RS256 token re-signed as HS256 with the provider's public key
    meets the HMAC secret and fails, `alg: none` fails everywhere."""

    def __init__(self, api: ApiSettings, oidc: OidcSettings) -> None:
        self.api, self.oidc = api, oidc
        self.jwks = Jwks(oidc) if oidc.issuer else None

    async def principals(self, authorization: str | None) -> list[str]:
        token = bearer_token(authorization, self.api)
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.InvalidTokenError, ValueError, TypeError):
            raise AuthError("invalid token: not a JWT") from None
        alg = header.get("alg")
        if alg in HMAC_ALGORITHMS:
            if not self.api.jwt.enabled:
                raise AuthError("HMAC-signed tokens are not accepted here (api.jwt.enabled is off)")
            return principals_from_claims(decode_token(token, self.api), self.api)
        if self.jwks is None:
            raise AuthError(f"invalid token: algorithm {alg!r} not accepted (no identity provider configured)")
        try:
            claims = await self.jwks.verify(token, header)
        except OidcTokenInvalid as exc:
            raise AuthError(f"invalid token: {exc}") from None
        return principals_from_oidc(claims, self.oidc)


def mint_token(
    api: ApiSettings,
    subject: str,
    *,
    groups: list[str] | None = None,
    roles: list[str] | None = None,
    ttl_s: int = 3600,
    now: float | None = None,
) -> str:
    """A token for local use and tests, signed with the configured secret."""
    issued = int(now if now is not None else time.time())
    claims: dict[str, Any] = {
        api.jwt.subject_claim: subject,
        "iss": api.jwt.issuer,
        "aud": api.jwt.audience,
        "iat": issued,
        "exp": issued + ttl_s,
    }
    if groups:
        claims[api.jwt.groups_claim] = groups
    if roles:
        claims[api.jwt.roles_claim] = roles
    return jwt.encode(claims, api.jwt.secret, algorithm=api.jwt.algorithm)
