"""`ki stack stop|start <service>`: a missing or unknown service name is one readable line and exit 2,
before anything is locked or touched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from apps.dev.checkout import REPO_ROOT


@pytest.mark.parametrize(("action", "service"), [("stop", "bogus"), ("start", None), ("stop", "")])
def test_one_service_commands_name_the_services_on_a_bad_name(action: str, service: str | None) -> None:
    argv = [sys.executable, "-m", "apps.cli", "stack", action] + ([service] if service is not None else [])
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "postgres, kafka, opensearch, connect" in lines[0], result.stderr
