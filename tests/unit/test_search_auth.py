"""Bearer tokens: who the caller is comes only from a valid signed token."""

from __future__ import annotations

import time

import jwt
import pytest

from ki.settings import ApiSettings
from search.auth import AuthError, authenticate, mint_token

API = ApiSettings()


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_principals_from_subject_groups_and_roles() -> None:
    token = mint_token(API, "alice", groups=["legal", "ad:finance"], roles=["admin"])
    assert authenticate(bearer(token), API) == ["user:alice", "group:legal", "ad:finance", "role:admin"]
    assert authenticate(bearer(mint_token(API, "svc:indexer")), API) == ["svc:indexer"]


def test_custom_claim_names() -> None:
    api = ApiSettings(subject_claim="email", groups_claim="grp", roles_claim="rl")
    token = mint_token(api, "a@b.de", groups=["g"], roles=["r"])
    assert authenticate(bearer(token), api) == ["user:a@b.de", "group:g", "role:r"]


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer not-a-jwt"])
def test_missing_or_malformed_header(header: str | None) -> None:
    with pytest.raises(AuthError):
        authenticate(header, API)


def claims(**over: object) -> dict[str, object]:
    now = int(time.time())
    base: dict[str, object] = {"sub": "alice", "iss": API.jwt_issuer, "aud": API.jwt_audience, "exp": now + 60}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    "token",
    [
        jwt.encode(claims(exp=int(time.time()) - 5), API.jwt_secret, algorithm="HS256"),  # expired
        jwt.encode(claims(iss="someone-else"), API.jwt_secret, algorithm="HS256"),
        jwt.encode(claims(aud="other-api"), API.jwt_secret, algorithm="HS256"),
        jwt.encode(claims(exp=None), API.jwt_secret, algorithm="HS256"),  # no expiry
        jwt.encode(claims(sub=None), API.jwt_secret, algorithm="HS256"),
        jwt.encode(claims(), "another-secret-another-secret-xx", algorithm="HS256"),
        jwt.encode(claims(), API.jwt_secret, algorithm="HS512"),  # not the configured algorithm
        jwt.encode(claims(), None, algorithm="none"),  # unsigned
        jwt.encode(claims(groups=[1, 2]), API.jwt_secret, algorithm="HS256"),  # malformed principals
    ],
)
def test_invalid_tokens_are_rejected(token: str) -> None:
    with pytest.raises(AuthError):
        authenticate(bearer(token), API)


@pytest.mark.parametrize(
    ("subject", "groups"),
    [("Dr. X:1", None), ("alice", ["sp group:legal"]), ("alice", ["grüppe:legal"])],
)
def test_a_claim_that_is_no_principal_is_rejected_not_ignored(subject: str, groups: list[str] | None) -> None:
    with pytest.raises(AuthError, match="is not a principal"):
        authenticate(bearer(mint_token(API, subject, groups=groups)), API)
