"""`ki bench search` end to end at a tiny scale on the real stack: demo corpus in PostgreSQL, indexed through
the backfill path into an index alias of this test's own, a real `ki serve` child, raw `_msearch` beside it,
scope compilation in a rolled-back transaction.

Only completeness and well-formedness are asserted; latencies are benchmark figures (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from apps.dev.checkout import REPO_ROOT
from ki.clients import make_sync_client
from ki.settings import Settings, with_overrides

pytestmark = [pytest.mark.stack, pytest.mark.second_lane, pytest.mark.timeout(1200)]

SCALE, SEED, REQUESTS, ROUNDS = 24, 23, 6, 1
CONCURRENCY = (1, 2)
SCOPE_SIZES = (10, 120)
# Small enough that the 120-document scope is split into two `terms` clauses, which OpenSearch must accept.
MAX_TERMS = 100
COMPARE = "KI_RETRIEVAL__NAME_LOOKUP_ENABLED=false,KI_API__STATS__ENABLED=false"


@pytest.fixture(scope="module")
def run(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-search")
    alias = f"ki-bench-search-test-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "apps.cli", "bench", "search", "--scale", str(SCALE), "--seed", str(SEED)]
    argv += ["--requests", str(REQUESTS), "--rounds", str(ROUNDS), "--out", str(out)]
    argv += ["--concurrency", ",".join(map(str, CONCURRENCY)), "--scope-sizes", ",".join(map(str, SCOPE_SIZES))]
    argv += ["--compare-env", COMPARE]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "KI_RETRIEVAL__INDEX_NAME": alias,
        "KI_OPENSEARCH__MAX_TERMS_COUNT": str(MAX_TERMS),
        # Small enough that the larger scope goes out as its projects and is checked hit by hit.
        "KI_API__LIMITS__MAX_SCOPE_FILTER_BYTES": "256",
    }
    try:
        done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1100, env=env)
        assert done.returncode == 0, f"ki bench search failed ({done.returncode}):\n{done.stderr[-4000:]}"
        path = out / "search.json"
        assert path.is_file(), f"no JSON written; stderr:\n{done.stderr[-2000:]}"
        yield {"file": json.loads(path.read_text()), "stdout": done.stdout, "stderr": done.stderr, "out": out}
    finally:
        client = make_sync_client(settings, timeout_s=30)
        client.indices.delete(index=f"{alias}--*", ignore_unavailable=True)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_stdout_is_one_json_object_matching_the_file(run: dict[str, Any]) -> None:
    printed = json.loads(run["stdout"])
    assert printed["corpus"] == run["file"]["corpus"]
    assert [lv["concurrency"] for lv in printed["levels"]] == list(CONCURRENCY)
    assert "bench search: concurrency 1" in run["stderr"], "progress lines go to stderr"


def test_corpus_was_generated_and_indexed_through_the_backfill_path(run: dict[str, Any]) -> None:
    corpus = run["file"]["corpus"]
    assert corpus["scale_versions"] == SCALE and corpus["versions"] == SCALE
    assert corpus["label"].startswith(f"ki-demo-s{SEED}-n{SCALE}-")
    # The alias is new, so every version was indexed in this run, and it holds nothing else.
    assert corpus["versions_indexed_now"] == SCALE and corpus["rows_embedded_now"] > 0
    assert corpus["chunks"] == corpus["index_chunks_total"] >= SCALE


def test_every_level_has_both_sides_with_ordered_percentiles(run: dict[str, Any]) -> None:
    result = run["file"]
    for level, c in zip(result["levels"], CONCURRENCY, strict=True):
        assert level["concurrency"] == c and level["rounds"] == ROUNDS
        for side in ("api", "raw_msearch"):
            figures = level[side]
            assert figures["errors"] == 0, figures["error_examples"]
            assert figures["requests_per_round"] == max(REQUESTS, 4 * c)
            assert all(_positive(figures[k]) for k in ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "throughput_rps"))
            assert figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"]
            assert len(level["latencies_ms"][side]) == ROUNDS * figures["requests_per_round"]
            assert figures["hits_per_request_p50"] > 0, f"{side}: the callers must find something"
        for ratio in ("ratio_p50", "ratio_p99", "ratio_mean", "ratio_throughput"):
            assert _positive(level[ratio]), ratio
        assert len(level["per_round"]) == ROUNDS
        assert {"scope", "embed", "msearch", "fuse", "reverify", "total", "outside_service"} <= set(
            level["api_server_timings_ms_p50"]
        )


def test_the_compared_api_ran_in_the_same_rounds(run: dict[str, Any]) -> None:
    result = run["file"]
    assert result["compare_env"] == {"KI_RETRIEVAL__NAME_LOOKUP_ENABLED": "false", "KI_API__STATS__ENABLED": "false"}
    for level in result["levels"]:
        compare = level["compare"]
        assert compare["api"]["errors"] == 0 and _positive(compare["api"]["p50_ms"]) and _positive(compare["ratio_p50"])
        for r in level["per_round"]:
            assert r["ratio_p50_delta"] == pytest.approx(r["ratio_p50"] - r["ratio_p50_compare"], abs=0.002)
        assert compare["api_server_timings_ms_p50"]["total"] > 0
    assert (run["out"] / "search-api-compare.log").is_file()


def test_callers_queries_and_embedding_cost_are_reported(run: dict[str, Any]) -> None:
    result = run["file"]
    assert result["callers"] and all(c["scope_documents"] > 0 for c in result["callers"])
    queries = result["queries"]
    assert queries["requests_in_mix"] == len(result["callers"]) * len(queries["texts"])
    assert 0 < queries["with_filters"] < len(queries["texts"])
    assert any("§" in text for text in queries["texts"]), "statute references are in the mix"
    embedding = result["embedding"]
    assert embedding["texts"] == len(set(queries["texts"]))
    assert _positive(embedding["request_ms_p50_cold"]) and _positive(embedding["request_ms_p50_warm"])
    assert _positive(embedding["embedder_direct_ms_p50"])
    goal = result["goal"]
    assert goal["ratio_p50_at_8"] is None and goal["met"] is None, "no concurrency-8 level in this run"


def test_scope_compilation_covers_every_size_and_splits_large_terms(run: dict[str, Any]) -> None:
    scope = run["file"]["scope_compilation"]
    sizes = scope["sizes"]
    assert [s["synthetic_documents"] for s in sizes] == list(SCOPE_SIZES)
    for s in sizes:
        assert s["corpus_documents"] > 0 and s["visible_documents"] == s["synthetic_documents"] + s["corpus_documents"]
        assert _positive(s["compile_ms_p50"]) and _positive(s["msearch_ms_p50"]) and s["filter_bytes"] > 0
        assert s["document_terms_clauses"] == math.ceil(s["visible_documents"] / MAX_TERMS)
        bounded = s["bounded"]
        assert bounded["legs_equal"] is True, bounded
        if bounded["kind"] == "exact":  # over the budget too (a caller is never sent a superset)
            assert bounded["filter_bytes"] >= s["filter_bytes"], (bounded, s["filter_bytes"])
        else:
            assert bounded["filter_bytes"] <= 256 + 64, bounded  # the budget, plus the `bool` wrapper
    # The caller reaches the corpus as a member of its grants' principals: the principals filter fits when
    # there are few of those, else the exact filter goes over the budget; never a superset for a non-admin.
    assert {s["bounded"]["kind"] for s in sizes} <= {"exact", "principals"}
    assert scope["observations_in_database"] >= sum(SCOPE_SIZES)


def test_plot_is_written_or_skipped_with_a_note(run: dict[str, Any]) -> None:
    result, png = run["file"], Path(run["out"]) / "search_latency.png"
    if find_spec("matplotlib") is not None:
        assert result["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert result["plot"] is None and "matplotlib" in result["plot_note"]


def test_rolled_back_scope_rows_left_nothing_behind(run: dict[str, Any], settings: Settings) -> None:
    from sqlalchemy import text

    from ki.clients import make_engine

    engine = make_engine(settings, pooled=False)
    try:
        with engine.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM projects WHERE name LIKE 'bench scope %'")).scalar_one()
    finally:
        engine.dispose()
    assert left == 0


def test_no_indexing_measures_the_index_as_it_is(settings: Settings) -> None:
    """`--no-indexing`: a corpus whose versions are not indexed yet is reported, not backfilled."""
    import asyncio

    from apps.dev.bench.search import ensure_corpus
    from ki.clients import make_engine

    alias = f"ki-bench-search-noindex-{uuid.uuid4().hex[:8]}"
    isolated = with_overrides(settings, {"retrieval": {"index_name": alias}})
    engine = make_engine(isolated, pooled=False)
    try:
        corpus = asyncio.run(ensure_corpus(isolated, engine, seed=29, scale=5, index_missing=False))
    finally:
        engine.dispose()
    assert len(corpus.version_ids) == 5
    assert corpus.versions_not_indexed == 5 and corpus.versions_indexed_now == 0
    client = make_sync_client(settings, timeout_s=30)
    assert not client.indices.exists_alias(name=alias), "nothing may have been indexed"


def test_generated_corpus_left_no_trace(run: dict[str, Any], settings: Settings) -> None:
    """The corpus this run generated is gone from PostgreSQL (projects, sources, documents, versions, the
    run's aliases) and from the index it was backfilled into."""
    from sqlalchemy import text

    from apps.dev.demo.generator import NAME_SEPARATOR
    from ki.clients import make_engine

    result = run["file"]
    cleanup, label = result["cleanup"], result["corpus"]["label"]
    assert not result["corpus"]["reused"] and cleanup["versions"] == SCALE and cleanup["aliases"] > 0
    assert cleanup["index_rows_at_start"] == result["corpus"]["chunks"] and cleanup["index_rows_left"] == 0
    engine = make_engine(settings, pooled=False)
    try:
        with engine.connect() as conn:
            like = {"like": f"%{NAME_SEPARATOR}{label}"}
            left = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM projects WHERE name LIKE :like)"
                    " + (SELECT count(*) FROM sources WHERE name LIKE :like)"
                    " + (SELECT count(*) FROM documents WHERE project_id = ANY(:p))"
                ),
                {**like, "p": cleanup["projects"]},
            ).scalar_one()
    finally:
        engine.dispose()
    assert left == 0
