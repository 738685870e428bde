"""Callers from a real identity provider: Keycloak (started by `ki stack up --idp`, realm apps/dev/stack/keycloak/
ki-realm.json) issues the tokens at its real token endpoint; the real `ki serve` and `ki mcp` verify them
against its real JWKS while a real sync worker indexes the documents.

anna (group mietrecht) sees project P, ben (group arbeitsrecht) project Q; each sees only their own, with
RS256 and ES256 tokens. Keys rotated in Keycloak while the API runs are picked up without a restart;
expired, wrong-audience, foreign-issuer and alg-swapped tokens are rejected; an unreachable provider is a
503, never an acceptance; with HMAC off a locally minted token is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from sqlalchemy import Engine

from apps.dev.stack.keycloak import ADMIN_USER, Keycloak
from apps.dev.stack.paths import StackPaths
from apps.runtime.processes import free_port
from ki.settings import Settings
from search.web.auth import mint_token
from tests.conftest import wait_for
from tests.integration.search_harness import McpHttp, Server, remove_world, synced_api, wait_until_indexed
from tests.integration.world import World

pytestmark = pytest.mark.stack


class Provider:
    """The running Keycloak: tokens from its token endpoint, and its admin REST API."""

    def __init__(self, settings: Settings) -> None:
        self.kc = Keycloak(settings, StackPaths.from_settings(settings))
        reason = self.kc.probe()
        assert reason is None, f"Keycloak is not running ({reason}): `ki stack up --idp` starts it"
        self.issuer = self.kc.issuer

    @staticmethod
    def _post(url: str, form: dict[str, str]) -> dict[str, Any]:
        request = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def token(self, user: str, client: str = "ki-search", realm: str = "ki") -> str:
        form = {"grant_type": "password", "client_id": client, "username": user, "password": f"{user}-demo-password"}
        return self._post(f"{self.kc.base_url}/realms/{realm}/protocol/openid-connect/token", form)["access_token"]

    def admin_token(self) -> str:
        form = {"grant_type": "password", "client_id": "admin-cli", "username": ADMIN_USER,
                "password": self.kc.admin_password_file.read_text().strip()}  # fmt: skip
        return self._post(f"{self.kc.base_url}/realms/master/protocol/openid-connect/token", form)["access_token"]

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.kc.base_url}/admin/realms/ki{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.admin_token()}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None, dict(response.headers)

    def add_rsa_key(self, name: str, priority: int) -> str:
        realm_id = self.admin("GET", "")[1]["id"]
        component = {"name": name, "providerId": "rsa-generated", "providerType": "org.keycloak.keys.KeyProvider",
                     "parentId": realm_id, "config": {"priority": [str(priority)], "keySize": ["2048"]}}  # fmt: skip
        _, _, headers = self.admin("POST", "/components", component)
        return headers["Location"].rsplit("/", 1)[1]

    def remove_key(self, component_id: str) -> None:
        self.admin("DELETE", f"/components/{component_id}")

    def public_pem(self, kid: str) -> bytes:
        with urllib.request.urlopen(f"{self.issuer}/protocol/openid-connect/certs", timeout=30) as response:
            keys = {k["kid"]: k for k in json.loads(response.read())["keys"]}
        public = jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(keys[kid]))
        return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def kid_of(token: str) -> str:
    return str(jwt.get_unverified_header(token)["kid"])


@dataclass
class Data:
    word: str
    docs: dict[str, int]
    projects: list[int]
    sources: list[int]


@pytest.fixture(scope="module")
def provider(settings: Settings) -> Provider:
    return Provider(settings)


def oidc_env(provider: Provider, **extra: str) -> dict[str, str]:
    return {"KI_OIDC__ISSUER": provider.issuer, "KI_OIDC__AUDIENCE": "ki-search",
            "KI_OIDC__SUBJECT_CLAIM": "preferred_username", "KI_OIDC__JWKS_REFRESH_MIN_INTERVAL_S": "1",
            "KI_OIDC__CLOCK_SKEW_S": "0", **extra}  # fmt: skip


@pytest.fixture(scope="module")
def stack(settings: Settings, provider: Provider) -> Iterator[tuple[Server, dict[str, str]]]:
    with synced_api(settings, "ki-idp-test", "idp-api", **oidc_env(provider)) as (server, _, env):
        yield server, env


@pytest.fixture(scope="module")
def data(engine: Engine, stack: tuple[Server, dict[str, str]], settings: Settings) -> Iterator[Data]:
    server, _ = stack
    with engine.begin() as conn:
        w = World(conn)
        word = f"idpwort{w.tag}"
        p, q = w.project("IdP Mietrecht"), w.project("IdP Arbeitsrecht")
        source = w.source("local_fs")
        obj = w.source_object(source)
        docs = {
            "mietvertrag": w.searchable(p, "Mietvertrag Lindenallee", f"{word} Die Miete ist gemindert.", obj, "mv"),
            "abmahnung": w.searchable(q, "Abmahnung Schichtdienst", f"{word} Der Arbeitnehmer kam zu spät.", obj, "ab"),
        }
        # Groups as Keycloak names them, without the path's leading "/" (oidc.group_prefix).
        w.grant("project", p, "group:mietrecht")
        w.grant("project", q, "group:arbeitsrecht")
        d = Data(word, docs, [p, q], [source])
    try:
        wait_until_indexed(server, settings, d.projects, set(docs.values()), "the IdP test's documents indexed")
        yield d
    finally:
        remove_world(engine, d.projects, d.sources)


def found(server: Server, data: Data, token: str) -> set[str]:
    status, body = server.call("/v1/search", {"query": data.word, "limit": 10, "mode": "lexical"}, token)
    assert status == 200, body
    names = {v: k for k, v in data.docs.items()}
    return {names.get(h["document_id"], "foreign") for h in body["hits"]}


def refused(server: Server, token: str, status: int = 401) -> str:
    got, body = server.call("/v1/me", token=token)
    assert got == status, (got, body)
    assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), body
    return str(body["message"])


def accepted(server: Server, token: str) -> None:
    wait_for(lambda: server.call("/v1/me", token=token)[0] == 200, timeout=20, what="the token accepted")


def test_each_provider_user_sees_only_their_groups_documents(
    stack: tuple[Server, dict[str, str]], data: Data, provider: Provider
) -> None:
    server, _ = stack
    anna, ben = provider.token("anna"), provider.token("ben")
    assert jwt.get_unverified_header(anna)["alg"] == "RS256"
    status, me = server.call("/v1/me", token=anna)
    assert status == 200 and me["principals"][:2] == ["user:anna", "group:mietrecht"] and me["admin"] is False
    assert found(server, data, anna) == {"mietvertrag"}
    assert found(server, data, ben) == {"abmahnung"}
    es256 = provider.token("ben", client="ki-search-es256")
    assert jwt.get_unverified_header(es256)["alg"] == "ES256"
    assert found(server, data, es256) == {"abmahnung"}
    # The realm role `admin` arrives in realm_access.roles and makes an administrator.
    assert server.call("/v1/me", token=provider.token("root"))[1]["admin"] is True


def test_tokens_that_are_not_for_this_api_are_rejected(
    stack: tuple[Server, dict[str, str]], data: Data, provider: Provider
) -> None:
    server, _ = stack
    short = provider.token("anna", client="ki-search-short")  # Keycloak makes it valid for 2 s
    assert server.call("/v1/me", token=short)[0] == 200
    wait_for(lambda: server.call("/v1/me", token=short)[0] == 401, timeout=30, what="the 2 s token expired")
    assert "expired" in refused(server, short)
    assert "audience" in refused(server, provider.token("anna", client="ki-other")).lower()
    # Another realm of the same Keycloak: another issuer, and keys this realm does not publish.
    foreign = provider._post(
        f"{provider.kc.base_url}/realms/master/protocol/openid-connect/token",
        {
            "grant_type": "password",
            "client_id": "admin-cli",
            "username": ADMIN_USER,
            "password": provider.kc.admin_password_file.read_text().strip(),
        },  # fmt: skip
    )["access_token"]
    assert "does not publish" in refused(server, foreign) or "issuer" in refused(server, foreign).lower()
    # This realm's own keys but another issuer: in dev mode Keycloak names the issuer after the host it is
    # asked on, so a token fetched through `localhost` passes the signature and must fail on `iss` alone.
    renamed_host = provider.kc.base_url.replace("127.0.0.1", "localhost")
    form = {"grant_type": "password", "client_id": "ki-search", "username": "anna", "password": "anna-demo-password"}
    renamed = provider._post(f"{renamed_host}/realms/ki/protocol/openid-connect/token", form)["access_token"]
    assert jwt.decode(renamed, options={"verify_signature": False})["iss"] != provider.issuer
    assert kid_of(renamed) == kid_of(provider.token("anna")), "not signed with the realm's published key"
    assert "issuer" in refused(server, renamed).lower()
    # alg swapped: anna's claims signed as HS256 with the realm's public RSA key as the HMAC secret.
    real = provider.token("anna")
    head, body, _ = real.split(".")
    swapped_head = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": kid_of(real)}).encode()).rstrip(b"=")
    signing_input = swapped_head + b"." + body.encode()
    signature = hmac.new(provider.public_pem(kid_of(real)), signing_input, hashlib.sha256).digest()
    swapped = (signing_input + b"." + base64.urlsafe_b64encode(signature).rstrip(b"=")).decode()
    refused(server, swapped)
    refused(server, f"{head}.{body}.")  # the signature cut off
    assert found(server, data, real) == {"mietvertrag"}  # and the real one still works


def test_a_key_rotated_in_keycloak_is_picked_up_while_the_api_runs(
    stack: tuple[Server, dict[str, str]], data: Data, provider: Provider
) -> None:
    server, _ = stack
    before = provider.token("anna")
    assert found(server, data, before) == {"mietvertrag"}  # the API holds the realm's keys now
    rotated = provider.add_rsa_key(f"rotation-{uuid.uuid4().hex[:6]}", priority=500)
    newer = None
    try:
        after = provider.token("anna")
        assert kid_of(after) != kid_of(before), "Keycloak did not sign with the new key"
        # An unknown kid: the keys are fetched again, at most every jwks_refresh_min_interval_s (1 s here;
        # the previous test's foreign tokens may just have caused a fetch).
        accepted(server, after)
        assert found(server, data, after) == {"mietvertrag"}
        assert found(server, data, before) == {"mietvertrag"}  # the old key is still published
        # The rotated key withdrawn and another one in: once the API fetches the keys again (a token with
        # the newest kid makes it), a token signed with the withdrawn key no longer passes.
        newer = provider.add_rsa_key(f"rotation-{uuid.uuid4().hex[:6]}", priority=600)
        provider.remove_key(rotated)
        rotated = ""
        latest = provider.token("anna")
        assert kid_of(latest) not in (kid_of(before), kid_of(after))
        accepted(server, latest)
        assert found(server, data, latest) == {"mietvertrag"}
        assert "does not publish" in refused(server, after)
    finally:
        for component in (rotated, newer):
            if component:
                provider.remove_key(component)


def test_with_hmac_off_only_the_provider_signs_and_an_unreachable_provider_fails_closed(
    stack: tuple[Server, dict[str, str]], data: Data, provider: Provider, settings: Settings
) -> None:
    _, env = stack
    strict = Server("idp-strict-api", **env, **oidc_env(provider), KI_API__JWT__ENABLED="false")
    nowhere = f"http://127.0.0.1:{free_port()}/realms/ki"
    unreachable = Server("idp-unreachable-api", **env, **oidc_env(provider, KI_OIDC__ISSUER=nowhere))
    strict.start()
    unreachable.start()
    try:
        assert "not accepted here" in refused(strict, mint_token(settings.api, "root", roles=["admin"]))
        assert found(strict, data, provider.token("anna")) == {"mietvertrag"}
        status, body = unreachable.call("/v1/search", {"query": data.word}, provider.token("anna"))
        assert status == 503 and body["error"] == "identity_provider_unavailable", body
    finally:
        strict.stop()
        unreachable.stop()


def test_mcp_over_http_takes_the_providers_tokens(
    stack: tuple[Server, dict[str, str]], data: Data, provider: Provider
) -> None:
    _, env = stack
    mcp = McpHttp(**env, **oidc_env(provider))
    mcp.start()
    try:

        async def search(token: str) -> set[int]:
            headers = {"Authorization": f"Bearer {token}"}
            http = create_mcp_http_client(headers=headers)
            async with Client(streamable_http_client(mcp.url, http_client=http)) as client:
                result = await client.call_tool("search", {"query": data.word, "mode": "lexical"})
                assert not result.is_error, result
                return {h["document_id"] for h in result.structured_content["hits"]}

        assert anyio.run(search, provider.token("anna")) == {data.docs["mietvertrag"]}
        assert anyio.run(search, provider.token("ben", client="ki-search-es256")) == {data.docs["abmahnung"]}
        wrong_audience = {"Authorization": f"Bearer {provider.token('anna', 'ki-other')}"}
        try:
            urllib.request.urlopen(urllib.request.Request(mcp.url, method="POST", data=b"{}", headers=wrong_audience))
            raise AssertionError("a wrong-audience token reached the MCP layer")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401 and json.loads(exc.read())["error"] == "unauthorized"
    finally:
        mcp.stop()
