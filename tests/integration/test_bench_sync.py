"""`ki bench sync` and `ki bench freshness` run end to end at a tiny scale on the real stack, write complete
results and leave no trace: nothing they wrote stays in PostgreSQL or the index. No timing is asserted here:
the figures are the benchmark's output, not a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import Engine, text

from apps.dev.checkout import REPO_ROOT
from ki.settings import Settings

pytestmark = [pytest.mark.stack, pytest.mark.second_lane]


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
    assert "no trace left" in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout)


def assert_no_trace(
    engine: Engine, search: OpenSearch, settings: Settings, projects: list[int], versions: list[int]
) -> None:
    """Nothing of these projects and versions in PostgreSQL, and no row of them in the index (refreshed
    first, so a row written but not yet published would count)."""
    assert projects, "the benchmark reports the projects it removed"
    with engine.connect() as conn:
        for sql, ids in (
            ("SELECT count(*) FROM projects WHERE id = ANY(:ids)", projects),
            ("SELECT count(*) FROM documents WHERE project_id = ANY(:ids)", projects),
            ("SELECT count(*) FROM document_versions WHERE id = ANY(:ids)", versions),
            ("SELECT count(*) FROM source_observations WHERE document_version_id = ANY(:ids)", versions),
        ):
            assert conn.execute(text(sql), {"ids": ids}).scalar_one() == 0, sql
    alias = settings.retrieval.index_name
    if not search.indices.exists_alias(name=alias):
        return  # no index yet (a fresh stack, no worker has run): no row anywhere
    search.indices.refresh(index=alias)
    query = {
        "bool": {
            "should": [
                {"terms": {"project_id": [str(p) for p in projects]}},
                {"terms": {"document_version_id": [str(v) for v in versions]}},
            ]
        }
    }
    assert search.count(index=alias, body={"query": query})["count"] == 0


def test_bench_sync_reports_content_access_and_baseline_figures(
    engine: Engine, search: OpenSearch, settings: Settings
) -> None:
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
    # The rebuild's path with unchanged inputs takes every vector over: nothing embedded, all rows written.
    again = result["reprojection_with_reuse"]
    assert again["rows_embedded"] == 0 and again["rows_reused"] == again["rows"] == result["corpus"]["chunks"]
    assert again["raw_bulk_rows"] == again["rows"] and again["vs_raw_bulk"] > 0
    assert result["access_only"]["rows_per_round"] == result["raw_bulk_partial_update"]["rows_per_round"]
    assert len(result["access_only_vs_raw_bulk"]["per_round"]) == 2
    assert (REPO_ROOT / "build" / "bench" / "sync.json").is_file()
    cleanup = result["cleanup"]
    assert cleanup["versions"] == 3 and cleanup["index_rows_left"] == 0
    assert_no_trace(engine, search, settings, cleanup["projects"], [])


def test_bench_freshness_with_a_tiny_backlog_and_rate_steps_leaves_no_trace(
    engine: Engine, search: OpenSearch, settings: Settings, tmp_path: Path
) -> None:
    result = run_bench(
        "freshness", "--rate", "20", "--seconds", "3", "--docs", "3",
        "--content-backlog", "8", "--access-rates", "5", "--step-seconds", "3", "--out", str(tmp_path),
    )  # fmt: skip
    # The quiet phase lasts --seconds (a probe every 0.5 s); the backlog phase lasts until the backlog is
    # indexed, which a fast, idle machine does within a second or two: at least its first probe.
    for phase, least in (("without_backlog", 4), ("with_backlog", 1)):
        figures = result["access"][phase]
        assert figures["probes"]["sent"] >= least, phase
        assert figures["probes"]["seen"] == figures["probes"]["sent"], phase
        lag = figures["commit_to_visible_s"]
        assert 0 < lag["p50"] <= lag["p95"] <= lag["p99"] <= lag["max"], phase
        assert figures["grant_insert_to_visible_s"]["n"] + figures["revocation_to_visible_s"]["n"] == lag["n"]
    backlog = result["content_backlog"]
    assert backlog["drained"] and backlog["chunks"] >= 8
    assert backlog["chunks_per_s"] > 0 and backlog["embedder_standalone_chunks_per_s"] > 0
    assert backlog["ratio_to_standalone"] > 0
    # New documents committed during the backlog were found through the API by word and by file number.
    new = backlog["new_documents_through_the_api"]
    assert new["documents"] >= 1 and new["never_found"] == {"keyword": 0, "identifier": 0}
    assert new["commit_to_found_s"]["keyword"]["n"] == new["documents"]
    steps = result["access_rates"]["steps"]
    assert [s["rate"] for s in steps] == [5] and steps[0]["probes"]["seen"] == steps[0]["probes"]["sent"]
    written = json.loads((tmp_path / "freshness-backlog8-rates.json").read_text())
    assert len(written["samples"]["without_backlog"]) == result["probes"]["seen"]

    # Everything it wrote is gone: its project, documents, versions (the backlog's too) and index rows.
    assert result["cleanup"]["index_rows_left"] == 0
    postgres = result["postgres"]
    assert result["cleanup"]["projects"] == [postgres["project"]]
    assert result["cleanup"]["versions"] == len(postgres["version_ids"]) >= 3 + 1 + 1
    assert_no_trace(engine, search, settings, [postgres["project"]], postgres["version_ids"])
    with engine.connect() as conn:
        label = result["label"]
        assert conn.execute(text("SELECT count(*) FROM sources WHERE name = :n"), {"n": label}).scalar_one() == 0
        tag = label.rsplit(" ", 1)[1]
        grants = conn.execute(
            text("SELECT count(*) FROM grants WHERE principal LIKE :a OR principal LIKE :b"),
            {"a": f"probe:{tag}-%", "b": f"user:load-{tag}-%"},
        ).scalar_one()
    assert grants == 0
