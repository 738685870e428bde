"""`ki bench sync` and `ki bench freshness` run end to end at a tiny scale on the real stack and write
complete results. No timing is asserted here: the figures are the benchmark's output, not a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ki.settings import REPO_ROOT

pytestmark = pytest.mark.stack


def run_bench(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "apps.cli", "bench", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bench" in done.stderr or "freshness" in done.stderr  # progress lines go to stderr
    return json.loads(done.stdout)


def test_bench_sync_reports_content_access_and_baseline_figures() -> None:
    result = run_bench(
        "sync", "--versions", "3", "--paragraphs", "6", "--rounds", "2", "--compare-model", "all-MiniLM-L6-v2"
    )
    assert result["corpus"]["versions"] == 3 and result["corpus"]["chunks"] >= 3
    assert result["content_sync"]["chunks_per_s"] > 0
    # The old embedder measured on the same versions in the same run, into its own scratch index.
    compared = result["content_sync_compared"]
    assert compared["embedder"] == "all-minilm-l6-v2-384" != result["content_sync"]["embedder"]
    assert compared["chunks"] >= 3 and compared["chunks_per_s"] > 0
    assert result["access_only"]["texts_embedded"] == 0  # the access path never embeds
    assert result["access_only"]["rows_per_round"] == result["raw_bulk_partial_update"]["rows_per_round"]
    assert len(result["access_only_vs_raw_bulk"]["per_round"]) == 2
    assert (REPO_ROOT / "build" / "bench" / "sync.json").is_file()


def test_bench_freshness_sees_every_probe() -> None:
    result = run_bench("freshness", "--rate", "20", "--seconds", "4", "--docs", "3")
    assert result["probes"]["sent"] >= 4
    assert result["probes"]["seen"] == result["probes"]["sent"]
    lag = result["commit_to_visible_s"]
    assert 0 < lag["p50"] <= lag["p95"] <= lag["p99"] <= lag["max"]
    written = json.loads((REPO_ROOT / "build" / "bench" / "freshness.json").read_text())
    assert len(written["samples"]) == result["probes"]["seen"]
