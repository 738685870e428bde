"""Shared fixtures.

Tests marked `stack` talk to the real local stack (`ki stack up`); they fail, never skip, when it is
not running, so a missing service can't hide as a green run. The identity-provider tests (tests/idp/)
need Keycloak too and run in a step of their own (`KI_TEST_IDP=1 scripts/test.sh tests/idp`, which
starts the stack with `--idp`); without KI_TEST_IDP they are not collected. Likewise the secured profile's
tests (tests/secure/: `KI_TEST_SECURE=1 scripts/test.sh tests/secure`, the stack with `--secure`) and the
cluster profile's (tests/cluster/: `KI_TEST_CLUSTER=1 scripts/test.sh tests/cluster`, with `--cluster`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings, load_settings

T = TypeVar("T")

# The tests run in the checkout's root, where the settings find its config.json (ki.settings.CONFIG_SEARCH_PATH)
# and where the children they start run, whichever folder pytest was started from.
os.chdir(REPO_ROOT)

collect_ignore = [] if os.environ.get("KI_TEST_IDP") == "1" else ["idp"]
if os.environ.get("KI_TEST_SECURE") != "1":
    collect_ignore.append("secure")
if os.environ.get("KI_TEST_CLUSTER") != "1":
    collect_ignore.append("cluster")


@pytest.fixture(scope="session")
def settings() -> Settings:
    return load_settings()


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str | Callable[[], str] = "",
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds (a callable
    `what` is asked at that moment, to say what the probe saw last)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)  # polling interval of a deadline loop, not a fixed wait
    described = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {described or probe!r}; last value: {last!r}")
