"""Shared fixtures.

Tests marked `stack` talk to the real local stack (`ki stack up`); they fail, never skip, when it is
not running, so a missing service can't hide as a green run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from ki.settings import Settings, load_settings

T = TypeVar("T")


@pytest.fixture(scope="session")
def settings() -> Settings:
    return load_settings()


def wait_for(probe: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.2, what: str = "") -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)  # polling interval of a deadline loop, not a fixed wait
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or probe!r}; last value: {last!r}")
