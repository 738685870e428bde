"""`ki bench principals` end to end at a tiny scale on the real stack: a demo corpus of its own, a caller of
many groups and one of one group written to PostgreSQL, a real `ki serve` child, and everything removed after.

Only completeness and well-formedness are asserted; latencies are benchmark figures (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from apps.dev.checkout import REPO_ROOT
from ki.clients import make_engine, make_sync_client
from ki.settings import Settings

pytestmark = [pytest.mark.stack, pytest.mark.second_lane, pytest.mark.timeout(900)]

GROUPS, GRANTING, SCALE = 40, 10, 12


@pytest.fixture(scope="module")
def run(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-principals")
    alias = f"ki-bench-principals-test-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "apps.cli", "bench", "principals", "--groups", str(GROUPS)]
    argv += ["--granting", str(GRANTING), "--scale", str(SCALE), "--concurrency", "1", "--rounds", "1"]
    argv += ["--requests", "6", "--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KI_RETRIEVAL__INDEX_NAME": alias}
    try:
        done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=850, env=env)
        assert done.returncode == 0, f"ki bench principals failed ({done.returncode}):\n{done.stderr[-4000:]}"
        path = out / f"principals-{GROUPS}.json"
        assert path.is_file(), f"no JSON written; stderr:\n{done.stderr[-2000:]}"
        yield {"file": json.loads(path.read_text()), "stdout": done.stdout}
    finally:
        client = make_sync_client(settings, timeout_s=30)
        client.indices.delete(index=f"{alias}--*", ignore_unavailable=True)


def test_both_callers_see_the_same_documents_through_different_numbers_of_groups(run: dict[str, Any]) -> None:
    result = run["file"]
    assert result["callers"]["same_documents"] is True
    one, many = result["sql"]["one_group"], result["sql"]["many_groups"]
    assert one["visible_documents"] == many["visible_documents"] > 0
    assert many["principals_resolved"] >= one["principals_resolved"] + GROUPS - 1
    assert many["scope_filter"] == one["scope_filter"] and one["scope_filter"]["within_budget"]
    # (40 groups are too few for their memory to stand out from tracemalloc's noise: measured, not compared)
    assert many["cached_caller_and_scope_bytes"] > 0 and one["cached_caller_and_scope_bytes"] > 0


def test_every_level_measured_both_callers_beside_raw(run: dict[str, Any]) -> None:
    (level,) = run["file"]["levels"]
    assert level["concurrency"] == 1
    for side in (level["api"], level["compare"]["api"], level["raw_msearch"]):
        assert side["errors"] == 0 and 0 < side["p50_ms"] <= side["p99_ms"]
    assert level["many_over_one"]["p50"] > 0 and "met" in run["file"]["goal"]
    assert "search p50 ratio many/one" in run["stdout"]


def test_the_bench_users_and_its_corpus_left_no_trace(run: dict[str, Any], settings: Settings) -> None:
    result = run["file"]
    users = result["callers"]
    tag = users["many_groups"]["subject"].removeprefix("user:bench-groups-").removesuffix("-many")
    assert not result["setup"]["corpus_reused"] and result["cleanup"]["versions"] == SCALE
    engine = make_engine(settings, pooled=False)
    try:
        with engine.connect() as conn:
            left = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM group_memberships WHERE member_principal LIKE :like"
                    "        OR group_principal LIKE :like)"
                    " + (SELECT count(*) FROM grants WHERE principal LIKE :like)"
                ),
                {"like": f"%bench-groups-{tag}-%"},
            ).scalar_one()
    finally:
        engine.dispose()
    assert left == 0
