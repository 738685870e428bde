"""Bearer tokens: who the caller is comes only from a valid signed token."""

from __future__ import annotations

import time

import jwt
import pytest

from ki.settings import ApiSettings, JwtSettings
from search.web.auth import AuthError, authenticate, mint_token

API = ApiSettings()


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_principals_from_subject_groups_and_roles() -> None:
    token = mint_token(API, "alice", groups=["legal", "ad:finance"], roles=["admin"])
    assert authenticate(bearer(token), API) == ["user:alice", "group:legal", "group:ad:finance", "role:admin"]


@pytest.mark.parametrize("subject", ["role:admin", "system:admin", "group:partner", "user:bob"])
def test_a_subject_is_always_a_user_and_a_group_always_a_group(subject: str) -> None:
    """A provider that lets people pick their own name must not let them pick `role:admin`."""
    token = mint_token(API, subject, groups=["role:admin"], roles=["role:reader"])
    assert authenticate(bearer(token), API) == [f"user:{subject}", "group:role:admin", "role:reader"]


def test_a_signer_that_writes_principals_says_so_in_the_settings() -> None:
    api = ApiSettings(jwt=JwtSettings(claims_carry_kinds=True))
    token = mint_token(api, "svc:indexer", groups=["ad:finance", "legal"])
    assert authenticate(bearer(token), api) == ["svc:indexer", "ad:finance", "group:legal"]


def test_custom_claim_names() -> None:
    api = ApiSettings(jwt=JwtSettings(subject_claim="email", groups_claim="grp", roles_claim="rl"))
    token = mint_token(api, "a@b.de", groups=["g"], roles=["r"])
    assert authenticate(bearer(token), api) == ["user:a@b.de", "group:g", "role:r"]


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer not-a-jwt"])
def test_missing_or_malformed_header(header: str | None) -> None:
    with pytest.raises(AuthError):
        authenticate(header, API)


def claims(**over: object) -> dict[str, object]:
    now = int(time.time())
    base: dict[str, object] = {"sub": "alice", "iss": API.jwt.issuer, "aud": API.jwt.audience, "exp": now + 60}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    "token",
    [
        jwt.encode(claims(exp=int(time.time()) - 5), API.jwt.secret, algorithm="HS256"),  # expired
        jwt.encode(claims(iss="someone-else"), API.jwt.secret, algorithm="HS256"),
        jwt.encode(claims(aud="other-api"), API.jwt.secret, algorithm="HS256"),
        jwt.encode(claims(exp=None), API.jwt.secret, algorithm="HS256"),  # no expiry
        jwt.encode(claims(sub=None), API.jwt.secret, algorithm="HS256"),
        jwt.encode(claims(), "another-secret-another-secret-xx", algorithm="HS256"),
        jwt.encode(claims(), API.jwt.secret, algorithm="HS512"),  # not the configured algorithm
        jwt.encode(claims(), None, algorithm="none"),  # unsigned
        jwt.encode(claims(groups=[1, 2]), API.jwt.secret, algorithm="HS256"),  # malformed principals
    ],
)
def test_invalid_tokens_are_rejected(token: str) -> None:
    with pytest.raises(AuthError):
        authenticate(bearer(token), API)


@pytest.mark.parametrize(
    ("subject", "groups", "roles"),
    [
        ("anna.\u017fchmidt", None, None),  # long s: folded, anna.schmidt
        ("katharina.\u212arueger", None, None),  # the Kelvin sign: folded, katharina.krueger
        ("stra\u00dfe", None, None),
        ("alice", ["\ufb01nance"], None),  # a ligature
        ("alice", ["ju\u0308rgen"], None),  # decomposed: not NFC
        ("alice", None, ["\u212a"]),
    ],
)
def test_a_claim_that_folding_would_merge_with_another_name_is_rejected(
    subject: str, groups: list[str] | None, roles: list[str] | None
) -> None:
    with pytest.raises(AuthError, match="makes no principal"):
        authenticate(bearer(mint_token(API, subject, groups=groups, roles=roles)), API)


@pytest.mark.parametrize(
    "token",
    [
        jwt.encode(claims(), API.jwt.secret, algorithm="HS256", headers={"crit": ["b64"], "b64": True}),
        jwt.encode(claims(), API.jwt.secret, algorithm="HS256", headers={"crit": ["x-unknown"]}),
        jwt.encode(claims(exp=str(int(time.time()) + 60)), API.jwt.secret, algorithm="HS256"),
        jwt.encode(claims(exp=True), API.jwt.secret, algorithm="HS256"),
        jwt.encode(claims(nbf=str(int(time.time()) - 60)), API.jwt.secret, algorithm="HS256"),
        jwt.encode(claims(iat="yesterday"), API.jwt.secret, algorithm="HS256"),
    ],
    ids=["crit-b64", "crit-unknown", "exp-string", "exp-bool", "nbf-string", "iat-string"],
)
def test_critical_extensions_and_times_that_are_not_numbers_are_rejected(token: str) -> None:
    with pytest.raises(AuthError, match="invalid token|expired"):
        authenticate(bearer(token), API)
