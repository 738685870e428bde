"""`ki eval` end to end on the real stack: SciFact rows written to PostgreSQL reach the eval index through
Debezium, Kafka and a `ki sync run` child, then the test queries run through the search service.

Only well-formedness is asserted (numbers in [0, 1], files written, every mode computed with the legs it
claims); retrieval quality is a benchmark figure (BENCHMARKS.md), not a test condition.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from opensearchpy import OpenSearch

from ki.eval.run import eval_settings
from ki.settings import REPO_ROOT, Settings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1600)]  # the fixture loads and indexes the corpus

DOCS, QUERIES = 150, 30


@pytest.fixture(scope="module")
def record(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("eval")
    argv = [sys.executable, "-m", "ki.cli", "eval", "--limit-docs", str(DOCS), "--queries", str(QUERIES)]
    # --fresh: a new project every run, so the rows always travel the whole CDC path.
    argv += ["--fresh", "--out", str(out), "--timeout", "1200"]
    done = subprocess.run(
        argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert done.returncode == 0, f"ki eval failed ({done.returncode}):\n{done.stderr[-4000:]}"
    path = out / f"scifact-test-docs{DOCS}-q{QUERIES}.json"
    assert path.is_file(), f"no JSON written; stdout:\n{done.stdout}"
    data = json.loads(path.read_text())
    data["_stdout"], data["_stderr"] = done.stdout, done.stderr
    return data


def test_every_mode_has_well_formed_metrics(record: dict) -> None:
    assert set(record["results"]) == {"lexical", "semantic", "hybrid"}
    for mode, result in record["results"].items():
        for metric in ("ndcg@10", "recall@100", "mrr@10"):
            value = result[metric]
            assert isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 1.0, (mode, metric, value)
        assert result["queries"] == QUERIES, mode


def test_each_mode_ran_the_legs_it_names(record: dict) -> None:
    legs = {mode: set(result["legs"]) for mode, result in record["results"].items()}
    assert legs["lexical"] == {"lexical"}  # a zero-weighted leg is not run at all
    assert legs["semantic"] == {"semantic"}
    assert {"lexical", "semantic"} <= legs["hybrid"]


def test_the_corpus_went_through_the_sync_worker(record: dict) -> None:
    corpus = record["corpus"]
    assert corpus["documents"] == DOCS and corpus["written_now"] == DOCS
    assert corpus["index_rows"] >= DOCS  # at least a profile row per document
    assert 0 < record["timings_s"]["rows_indexed_while_waiting"] <= corpus["index_rows"]
    assert "starting the sync worker" in record["_stderr"] or "already answers" in record["_stderr"]
    assert record["queries"]["evaluated"] == QUERIES


def test_outputs_are_written_and_the_table_is_printed(record: dict) -> None:
    assert "ki hybrid" in record["_stdout"] and "nDCG@10" in record["_stdout"]
    assert record["baselines"], "the published baselines of the data set README are in the record"
    plot = record["files"]["plot"]
    if find_spec("matplotlib") is not None:
        assert plot and Path(plot).is_file() and Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert plot is None and "no plot written" in record["_stderr"]


def test_the_eval_index_is_english_and_separate(record: dict, settings: Settings) -> None:
    es = eval_settings(settings, "english")
    client = OpenSearch(hosts=[settings.opensearch.url], timeout=30)
    mapping = client.indices.get_mapping(index=es.retrieval.index_name)
    assert mapping, "the eval alias exists"
    for physical, body in mapping.items():
        assert body["mappings"]["properties"]["text"]["analyzer"] == "english"
        assert "english" in physical
    if client.indices.exists_alias(name=settings.retrieval.index_name):
        main = client.indices.get_alias(name=settings.retrieval.index_name)
        assert not set(main) & set(mapping), "the German main index and the eval index never share a physical index"
