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
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import settings as hypothesis_settings

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings, load_settings

T = TypeVar("T")

# The tests run in the checkout's root, where the settings find its config.json (ki.settings.CONFIG_SEARCH_PATH)
# and where the children they start run, whichever folder pytest was started from.
os.chdir(REPO_ROOT)

# Property tests judge results, not speed: Hypothesis' 200 ms per example fails them on a loaded CI machine
# (three stacks on two cores), which says nothing about the code.
hypothesis_settings.register_profile("ki", deadline=None)
hypothesis_settings.load_profile("ki")

# Tests send explicit modes to servers whose settings no shipped report matches (other fusions, floors, weights):
# they test those paths, not the evidence gate, so explicit modes are honoured here (children inherit this);
# tests/integration/test_search_api.py's gate test asks for the refusal, the shipped default, itself.
os.environ.setdefault("KI_RETRIEVAL__MODE_GATE__EXPLICIT_WITHOUT_EVIDENCE", "honour")

collect_ignore = [] if os.environ.get("KI_TEST_IDP") == "1" else ["idp"]
if os.environ.get("KI_TEST_SECURE") != "1":
    collect_ignore.append("secure")
if os.environ.get("KI_TEST_CLUSTER") != "1":
    collect_ignore.append("cluster")


@pytest.fixture(scope="session")
def e5_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache per test session: multilingual-e5-small is converted once, here."""
    return tmp_path_factory.mktemp("models")


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
