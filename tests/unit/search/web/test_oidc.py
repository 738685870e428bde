"""OIDC token verification and the key cache, without a provider: keys made here, the JWKS served by a
function the cache is given in place of the network (tests/idp/ runs the same against a real Keycloak)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ki.settings import ApiSettings, OidcSettings
from search.web.auth import Authenticator, AuthError, mint_token
from search.web.oidc import IdentityProviderUnavailable, Jwks, claim

ISSUER = "https://idp.example/realms/ki"
OIDC = OidcSettings(issuer=ISSUER, audience="ki-search", jwks_refresh_min_interval_s=30, jwks_cache_ttl_s=3600)
API = ApiSettings()


class Provider:
    """Signing keys and what the JWKS endpoint would answer; `down` makes every fetch fail."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.published: list[str] = []
        self.fetches: list[str] = []
        self.down = False
        self.discovered_issuer = ISSUER
        self.now = 1000.0

    def add(self, kid: str, kind: str = "rsa") -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" else \
            ec.generate_private_key(ec.SECP256R1())  # fmt: skip
        self.keys[kid] = key
        self.published.append(kid)

    def jwk(self, kid: str) -> dict[str, Any]:
        algorithm = jwt.algorithms.RSAAlgorithm if isinstance(self.keys[kid], rsa.RSAPrivateKey) else \
            jwt.algorithms.ECAlgorithm  # fmt: skip
        data = json.loads(algorithm.to_jwk(self.keys[kid].public_key()))
        return {**data, "kid": kid, "use": "sig"}

    async def fetch(self, url: str, timeout_s: float) -> Any:
        self.fetches.append(url)
        if self.down:
            raise IdentityProviderUnavailable(f"{url}: refused")
        if url.endswith("/.well-known/openid-configuration"):
            return {"issuer": self.discovered_issuer, "jwks_uri": "https://idp.example/certs"}
        encryption = {"kty": "RSA", "use": "enc", "kid": "enc-1", "n": "AQAB", "e": "AQAB"}
        return {"keys": [self.jwk(k) for k in self.published] + [encryption]}

    def token(self, kid: str, **overrides: Any) -> str:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": ["ki-search", "account"], "sub": "u-1", "preferred_username": "anna",
                  "iat": now, "exp": now + 300, "groups": ["/mietrecht", "/firm/legal"],
                  "realm_access": {"roles": ["admin", "offline_access"]}, **overrides}  # fmt: skip
        alg = "RS256" if isinstance(self.keys[kid], rsa.RSAPrivateKey) else "ES256"
        return jwt.encode({k: v for k, v in claims.items() if v is not None}, self.keys[kid], alg, {"kid": kid})


def authenticator(provider: Provider, oidc: OidcSettings = OIDC, api: ApiSettings = API) -> Authenticator:
    auth = Authenticator(api, oidc)
    assert auth.jwks is not None
    auth.jwks = Jwks(oidc, fetch=provider.fetch, clock=lambda: provider.now)
    return auth


def run(auth: Authenticator, token: str) -> list[str]:
    return asyncio.run(auth.principals(f"Bearer {token}"))


def rejected(auth: Authenticator, token: str) -> str:
    with pytest.raises(AuthError) as err:
        run(auth, token)
    return str(err.value)


def test_rs256_and_es256_tokens_name_the_caller_by_the_configured_claims() -> None:
    provider = Provider()
    provider.add("rsa-1")
    provider.add("ec-1", "ec")
    auth = authenticator(provider, OIDC.model_copy(update={"subject_claim": "preferred_username"}))
    expected = ["user:anna", "group:mietrecht", "group:firm/legal", "role:admin", "role:offline_access"]
    assert run(auth, provider.token("rsa-1")) == expected
    assert run(auth, provider.token("ec-1")) == expected
    # Discovery once, then the keys once: both tokens' keys came in one fetch.
    assert provider.fetches == [f"{ISSUER}/.well-known/openid-configuration", "https://idp.example/certs"]


def test_claim_paths_walk_into_objects_and_take_dotted_names_as_they_are() -> None:
    claims = {"realm_access": {"roles": ["a"]}, "https://x.example/roles": ["b"]}
    assert claim(claims, "realm_access.roles") == ["a"] and claim(claims, "https://x.example/roles") == ["b"]
    assert claim(claims, "realm_access.nothing") is None and claim(claims, "missing") is None


def test_a_rotated_key_is_fetched_once_and_unknown_kids_are_rate_limited() -> None:
    provider = Provider()
    provider.add("rsa-1")
    auth = authenticator(provider)
    run(auth, provider.token("rsa-1"))
    provider.add("rsa-2")  # rotated in at the provider
    provider.now += 31
    assert run(auth, provider.token("rsa-2"))[0] == "user:u-1"  # unknown kid: fetched again at once
    fetches = len(provider.fetches)
    provider.keys["made-up"] = provider.keys["rsa-1"]
    provider.now += 5  # within jwks_refresh_min_interval_s of the last fetch: not asked again
    assert "does not publish" in rejected(auth, provider.token("made-up"))
    assert len(provider.fetches) == fetches
    provider.now += 30
    assert "does not publish" in rejected(auth, provider.token("made-up"))  # asked again: still unknown
    assert len(provider.fetches) == fetches + 1
    provider.now += 5
    rejected(auth, provider.token("made-up"))
    assert len(provider.fetches) == fetches + 1


def test_fail_closed_when_the_provider_is_down_but_cached_keys_keep_working() -> None:
    provider = Provider()
    provider.add("rsa-1")
    provider.down = True
    auth = authenticator(provider)
    with pytest.raises(IdentityProviderUnavailable):
        run(auth, provider.token("rsa-1"))  # nothing cached: never accepted
    provider.down = False
    provider.now += 60
    run(auth, provider.token("rsa-1"))
    provider.down = True
    provider.now += 7200  # the cache is stale and the provider away: the cached key still verifies
    assert run(auth, provider.token("rsa-1"))[0] == "user:u-1"
    provider.add("rsa-2")
    provider.now += 60
    with pytest.raises(IdentityProviderUnavailable):
        run(auth, provider.token("rsa-2"))  # a key we never saw, and nobody to ask


def test_tokens_that_are_not_the_providers_for_this_api_are_rejected() -> None:
    provider = Provider()
    provider.add("rsa-1")
    provider.add("ec-1", "ec")
    auth = authenticator(provider)
    now = int(time.time())
    assert "expired" in rejected(auth, provider.token("rsa-1", iat=now - 1000, exp=now - 61))
    run(auth, provider.token("rsa-1", iat=now - 1000, exp=now - 30))  # within oidc.clock_skew_s
    assert "not yet valid" in rejected(auth, provider.token("rsa-1", nbf=now + 120))
    assert "audience" in rejected(auth, provider.token("rsa-1", aud="account")).lower()
    assert "issuer" in rejected(auth, provider.token("rsa-1", iss="https://idp.example/realms/other")).lower()
    assert "exp" in rejected(auth, provider.token("rsa-1", exp=None))
    # The RSA key's kid on an ES256 signature (and the other way round): the key decides the algorithm.
    forged = jwt.encode({"iss": ISSUER, "aud": "ki-search", "sub": "x", "exp": now + 60}, provider.keys["ec-1"],
                        "ES256", {"kid": "rsa-1"})  # fmt: skip
    assert "RS256 key" in rejected(auth, forged)


def test_alg_none_and_a_public_key_used_as_hmac_secret_are_rejected() -> None:
    provider = Provider()
    provider.add("rsa-1")
    auth = authenticator(provider)
    claims = {"iss": ISSUER, "aud": "ki-search", "sub": "mallory", "exp": int(time.time()) + 60}
    public_pem = (
        provider.keys["rsa-1"]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": "rsa-1"}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    signature = base64.urlsafe_b64encode(hmac.new(public_pem, header + b"." + body, hashlib.sha256).digest())
    swapped = (header + b"." + body + b"." + signature.rstrip(b"=")).decode()
    assert "invalid token" in rejected(auth, swapped)  # met the HMAC secret, which is not the public key
    off = authenticator(provider, api=API.model_copy(update={"jwt": API.jwt.model_copy(update={"enabled": False})}))
    assert "not accepted here" in rejected(off, swapped)
    assert "not accepted here" in rejected(off, mint_token(API, "alice"))  # HMAC off: even a good one
    assert run(auth, mint_token(API, "alice")) == ["user:alice"]  # HMAC on: local tokens still work
    unsigned = jwt.encode(claims, None, "none")
    assert "invalid token" in rejected(auth, unsigned)


def test_a_discovery_document_for_another_issuer_is_refused() -> None:
    provider = Provider()
    provider.add("rsa-1")
    provider.discovered_issuer = "https://evil.example/realms/ki"
    with pytest.raises(IdentityProviderUnavailable, match="names the issuer"):
        run(authenticator(provider), provider.token("rsa-1"))


def test_without_an_issuer_only_hmac_tokens_are_known() -> None:
    auth = Authenticator(API, OidcSettings())
    assert auth.jwks is None
    provider = Provider()
    provider.add("rsa-1")
    assert "no identity provider" in rejected(auth, provider.token("rsa-1"))
