"""`ki bench soak` end to end at a tiny scale on the real stack: half a minute of mixed changes and searches with
one lane killed (the soak restarts the worker, as a process manager would); the command's exit status says that
nothing was lost, no hit leaked unexplained and the fault recovered; the JSON holds each figure, and the run's rows
are gone afterwards. No timing is asserted (BENCHMARKS.md has the figures of a long run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from apps.dev.checkout import REPO_ROOT

# `faults`: it kills a lane, so it runs in the lane of the fault tests, one fault at a time. It starts the sync
# worker twice, and beside CI's busy lanes each start has taken over two minutes: hence the long timeouts.
pytestmark = [pytest.mark.stack, pytest.mark.faults, pytest.mark.timeout(1200)]


def test_a_short_soak_with_a_killed_lane_loses_nothing_leaks_nothing_and_cleans_up(
    tmp_path: Path, engine: Engine
) -> None:
    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "apps.cli", "bench", "soak", "--minutes", "0.4", "--rate", "20",
            "--fault-every", "12", "--faults", "kill", "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1100,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert done.returncode == 0, f"ki bench soak failed ({done.returncode}):\n{done.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert result["lost"]["lost"] == 0 and result["lost"]["rebuilt"] > 0
    assert result["searches"]["leaked_unexplained"] == 0
    assert result["changes"]["committed"] > 0 and result["searches"]["sent"] > 0
    [fault] = result["faults"]
    assert fault["kind"] == "kill" and fault["lane_restarted"] is True
    assert fault["recovery_s"] is not None and fault["probe_found_s"] is not None
    assert "| 1 | kill |" in done.stderr
    assert result["cleanup"]["index_rows_left"] == 0
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM projects WHERE name = :l"), {"l": result["label"]}).scalar_one()
    assert left == 0
