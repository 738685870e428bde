"""`ki bench first-load` end to end at a tiny scale on the real stack: the demo corpus goes through
PostgreSQL, Debezium, Kafka and both lanes; the JSON says every version PostgreSQL holds became
keyword-searchable, holds the access, search, vector and core figures, and the run's rows are gone
afterwards. No timing is asserted (BENCHMARKS.md has the figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from apps.dev.checkout import REPO_ROOT
from projections.lanes import LANES

pytestmark = [pytest.mark.stack, pytest.mark.second_lane, pytest.mark.timeout(600)]

SCALE = 30  # demo versions, ~180 chunks


def test_a_tiny_first_load_is_keyword_searchable_and_measured_and_nothing_is_left(
    tmp_path: Path, engine: Engine
) -> None:
    out = tmp_path / "first-load.json"
    argv = [sys.executable, "-m", "apps.cli", "bench", "first-load", "--scale", str(SCALE), "--vector-seconds", "3",
            "--standalone-chunks", "4", "--access-rate", "20", "--access-docs", "10", "--versions-per-transaction", "4",
            "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=550,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert done.returncode == 0, f"ki bench first-load failed ({done.returncode}):\n{done.stderr[-4000:]}"
    result = json.loads(out.read_text())

    # Every version the generator committed is live in PostgreSQL and has its rows in the index.
    assert result["postgres"]["versions"] == SCALE
    # The load began with the access lane caught up (whatever earlier tests left in its stream was applied first).
    backlog = result["backlog_at_start"]
    assert set(backlog["lag_events"]) == set(LANES) and backlog["access_caught_up_after_s"] >= 0
    assert result["keyword"]["versions_searchable"] == SCALE
    assert result["keyword"]["chunks"] >= SCALE
    last = result["progress"][-1]
    assert last["versions_written"] == SCALE and last["chunks_searchable"] == result["keyword"]["chunks"]
    assert result["postgres"]["versions_per_transaction"] == 4

    keyword, vectors = result["keyword"], result["vectors"]
    assert keyword["first_commit_to_all_searchable_s"] > 0
    assert keyword["access"]["probes"]["sent"] > 0 and keyword["access"]["commit_to_visible_s"]["p99"] > 0
    assert {"writing", "catching_up", "keyword_phase"} <= set(keyword["cpu_cores"])
    assert keyword["cpu_cores"]["keyword_phase"]["opensearch"] > 0
    assert result["searches"]["keyword"]["ms"]["n"] > 0
    assert vectors["time_boxed"] and vectors["embedder_alone"]["chunks_per_s"] > 0
    assert vectors["ratio_to_embedder_alone"] is not None
    assert 0 <= vectors["chunks_with_vector_at_start"] <= vectors["chunks_with_vector_at_end"] <= keyword["chunks"]

    assert result["cleanup"]["index_rows_left"] == 0
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM projects WHERE name LIKE :l"),
                            {"l": f"%{result['label']}"}).scalar_one()  # fmt: skip
    assert left == 0
