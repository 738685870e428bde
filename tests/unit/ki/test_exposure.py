"""The published JWT secret and demo mode stay on loopback: the pure decision (`ki.exposure`) and the real
`ki serve` / `ki mcp` refusing to start with one line (no services: they stop before connecting)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.dev.checkout import REPO_ROOT
from apps.runtime.processes import free_port
from ki.exposure import PUBLISHED_JWT_SECRET, exposure_problem, is_loopback
from ki.settings import Settings, load_settings

OWN_SECRET = "a-secret-of-our-own-0123456789abcdef"
LOOPBACK = ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LocalHost", "::ffff:127.0.0.1"]
EXPOSED = ["0.0.0.0", "::", "", "10.1.2.3", "192.0.2.7", "2001:db8::1", "::ffff:192.0.2.7", "api.example.org"]


def settings(server: str = "api", host: str = "0.0.0.0", **api: object) -> Settings:
    env = {f"KI_API__{k.upper()}": v if isinstance(v, str) else json.dumps(v) for k, v in api.items()}
    return load_settings(environ={f"KI_{server.upper()}__HOST": host, **env})


def test_the_published_secret_is_the_one_the_shipped_configuration_has() -> None:
    shipped = load_settings(environ={}).api.jwt.secret
    assert shipped == PUBLISHED_JWT_SECRET == "change-me-local-only-secret-0123456789"


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    assert exposure_problem(settings(host=host)) is None  # the published secret
    assert exposure_problem(settings(host=host, demo_mode=True)) is None
    assert exposure_problem(settings("mcp", host=host), "mcp") is None


@pytest.mark.parametrize("host", EXPOSED)
def test_other_hosts_refuse_the_published_secret(host: str) -> None:
    assert not is_loopback(host)
    problem = exposure_problem(settings(host=host))
    assert problem is not None and "api.jwt.secret" in problem and "api.host" in problem and "\n" not in problem
    assert PUBLISHED_JWT_SECRET not in problem
    mcp = exposure_problem(settings("mcp", host=host), "mcp")
    assert mcp is not None and "api.jwt.secret" in mcp and "mcp.host" in mcp


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_a_secret_of_our_own_or_no_hmac_tokens_may_listen_anywhere(host: str) -> None:
    assert settings(jwt__secret=OWN_SECRET).api.jwt.secret == OWN_SECRET
    assert exposure_problem(settings(host=host, jwt__secret=OWN_SECRET)) is None
    assert exposure_problem(settings(host=host, jwt__enabled=False)) is None
    assert exposure_problem(settings("mcp", host=host, jwt__secret=OWN_SECRET), "mcp") is None
    assert exposure_problem(settings("mcp", host=host, jwt__enabled=False), "mcp") is None


def test_the_published_secret_read_from_a_file_is_still_the_published_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(PUBLISHED_JWT_SECRET + "\n")
    assert exposure_problem(settings(jwt__secret_file=str(path))) is not None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_demo_mode_is_refused_off_loopback_whatever_the_secret(host: str) -> None:
    for api in ({}, {"jwt__secret": OWN_SECRET}, {"jwt__enabled": False}):
        problem = exposure_problem(settings(host=host, demo_mode=True, **api))
        assert problem is not None and "api.demo_mode" in problem and "api.host" in problem, api
    assert exposure_problem(settings(host=host, demo_mode=False, jwt__enabled=False)) is None
    # The MCP server has no console and no demo picker: only the secret counts there.
    assert exposure_problem(settings("mcp", host=host, demo_mode=True, jwt__secret=OWN_SECRET), "mcp") is None


def test_the_api_host_does_not_decide_for_the_mcp_server_or_back() -> None:
    exposed_api = settings(host="0.0.0.0")
    assert exposure_problem(exposed_api, "api") is not None and exposure_problem(exposed_api, "mcp") is None
    exposed_mcp = settings("mcp", host="0.0.0.0")
    assert exposure_problem(exposed_mcp, "mcp") is not None and exposure_problem(exposed_mcp, "api") is None


def _ki(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`ki ARGS` with the shipped settings but `env`; a server that does start is killed after the timeout
    (and the test fails on TimeoutExpired)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("KI_API__", "KI_MCP__"))}
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=30, env={**inherited, **env})  # fmt: skip


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ki_serve_on_all_interfaces_with_the_published_secret_refuses_to_start(workers: str) -> None:
    result = _ki("serve", "--workers", workers, KI_API__HOST="0.0.0.0", KI_API__PORT=str(free_port()))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ki: refusing to start:"), result.stderr
    assert "api.jwt.secret" in lines[0] and "api.host" in lines[0]


def test_ki_mcp_on_all_interfaces_with_the_published_secret_refuses_to_start() -> None:
    result = _ki("mcp", "--port", str(free_port()), KI_MCP__HOST="0.0.0.0")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and "mcp.host" in lines[0], result.stderr


@pytest.mark.parametrize(
    "secret",
    [
        PUBLISHED_JWT_SECRET + " ",  # a trailing space: still the published one
        " " + PUBLISHED_JWT_SECRET + "\t",
        "change-me-local-only-secret-０１２３４５６７８９",  # full-width digits: the same under NFKC
        "short-but-random-Xq9",  # under 32 bytes
        "a" * 64,  # long, no entropy
        "secret" * 8,  # long, repetitive: ~124 bits by its characters
    ],
)
def test_weak_or_disguised_published_secrets_are_refused_off_loopback(secret: str) -> None:
    problem = exposure_problem(settings(host="0.0.0.0", jwt__secret=secret))
    assert problem is not None and "api.jwt.secret" in problem and "\n" not in problem
    assert secret.strip() not in problem
    assert exposure_problem(settings(host="127.0.0.1", jwt__secret=secret)) is None
