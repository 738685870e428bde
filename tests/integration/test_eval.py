"""`ki eval` end to end on the real stack, on a tiny German BEIR folder (`tests/data/mietrecht-mini`):
the rows go to the eval's own database, through its own connector, topics and `ki sync run` child into
its own index, then the test queries run through the search service.

Isolation is checked in both directions: a marker document written to the main database before and
after the eval never reaches the eval index or database, and no eval document reaches the main
database or the main index. A re-run resumes (writes nothing, starts no worker); `--drop` removes the
eval's database, slot, connector, topics and indexes. Retrieval quality is a benchmark figure
(BENCHMARKS.md), not a test condition: only well-formedness is asserted.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opensearchpy import OpenSearch
from sqlalchemy import text

from apps.dev.checkout import REPO_ROOT
from apps.dev.eval import beir
from apps.dev.eval.fusion_choice import setting_label
from apps.dev.eval.run import FUSIONS, load_into_postgres
from apps.dev.stack.http import request_json
from apps.dev.stack.settings import stack_settings
from apps.runtime.processes import free_port
from ki import exposition
from ki.clients import make_engine, make_kafka_admin
from ki.settings import Settings, load_settings, with_overrides
from search.ranking.coverage import content_words, coverage
from search.ranking.mode_gate import parse_report, parse_reports
from tests.conftest import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

DATA = REPO_ROOT / "tests" / "data" / "mietrecht-mini"
EVAL_WORD = "Zaunkönigklausel"  # only in the eval corpus (document m09)


def _ki(*argv: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apps.cli", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def _write_marker(settings: Settings, word: str) -> None:
    engine = make_engine(settings, pooled=False)
    try:
        doc = beir.CorpusDoc(word, f"Markierung {word}", f"Dieses Dokument der Hauptdatenbank enthält {word}.")
        load_into_postgres(engine, [doc], project_name=f"isolation marker {word}", principal="user:ki-eval",
                           language="de", batch_docs=10, progress=lambda _: None)  # fmt: skip
    finally:
        engine.dispose()


def _hits(client: OpenSearch, alias: str, word: str) -> int:
    if not client.indices.exists_alias(name=alias):
        return 0
    body = {"query": {"match_phrase": {"text": word}}}
    return int(client.count(index=alias, body=body)["count"])


@pytest.fixture(scope="module")
def run(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    out = tmp_path_factory.mktemp("eval")
    marker = f"Isolationsmarker{uuid.uuid4().hex[:10]}"
    _write_marker(settings, marker)  # in the main database's CDC stream while the eval runs
    # --fresh: drop what an earlier run left, so the rows travel the whole CDC path every time.
    started = time.monotonic()
    done = _ki("eval", "--data", str(DATA), "--tune", "--features", "--categories", "--negatives", "2", "--fresh",
               "--out", str(out), "--timeout", "400")  # fmt: skip
    seconds = time.monotonic() - started
    assert done.returncode == 0, f"ki eval failed ({done.returncode}):\n{done.stderr[-4000:]}"
    _write_marker(settings, marker + "b")
    path = out / "mietrecht-mini.json"
    assert path.is_file(), f"no JSON written; stdout:\n{done.stdout}"
    record = json.loads(path.read_text())
    yield {"record": record, "stdout": done.stdout, "stderr": done.stderr, "out": out, "marker": marker,
           "seconds": seconds}  # fmt: skip
    _ki("eval", "--data", str(DATA), "--drop", timeout=300)  # whatever a failed test left (a no-op after the drop test)


def test_the_report_names_the_data_set_and_every_mode(run: dict) -> None:
    record = run["record"]
    dataset = record["dataset"]
    assert (dataset["name"], dataset["language"], dataset["language_source"]) == ("mietrecht-mini", "de", "README")
    assert Path(dataset["path"]) == DATA.resolve() and len(dataset["sha256"]) == 64
    assert set(dataset["files"]) == {"corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv"}
    configured = load_settings().retrieval.fusion_method
    others = [m for m in FUSIONS if m != configured]
    assert set(record["results"]) == {"lexical", "semantic", "hybrid", "hybrid-tuned", *(f"hybrid-{m}" for m in others)}
    fusions = [record["results"][label]["fusion"] for label in ("hybrid", *(f"hybrid-{m}" for m in others))]
    assert fusions == [configured, *others]
    for mode, result in record["results"].items():
        for metric in ("ndcg@10", "recall@100", "mrr@10"):
            value = result[metric]
            assert isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 1.0, (mode, metric, value)
        assert result["queries"] == 10, mode
    legs = {mode: set(result["legs"]) for mode, result in record["results"].items()}
    assert legs["lexical"] == {"lexical"} and legs["semantic"] == {"semantic"}
    assert {"lexical", "semantic"} <= legs["hybrid"]
    # Hybrid against the better single leg, paired per query (wins, losses, ties, interval, p-value).
    paired = record["hybrid_vs_best_leg"]
    best = max(("lexical", "semantic"), key=lambda mode: record["results"][mode]["ndcg@10"])
    assert paired["best_leg"] == best and paired["wins"] + paired["losses"] + paired["ties"] == paired["queries"] == 10
    difference = record["results"]["hybrid"]["ndcg@10"] - record["results"][best]["ndcg@10"]
    assert paired["mean_difference"] == pytest.approx(difference, abs=1e-5)
    assert paired["ci95"][0] <= paired["mean_difference"] <= paired["ci95"][1] and 0 < paired["p_value"] <= 1
    lexical_gap = record["results"]["hybrid"]["ndcg@10"] - record["results"]["lexical"]["ndcg@10"]
    assert record["hybrid_vs_lexical"]["mean_difference"] == pytest.approx(lexical_gap, abs=1e-5)  # the gate's test
    for method in others:  # the other fusions against the same leg
        other = paired["fusions"][f"hybrid-{method}"]
        gap = record["results"][f"hybrid-{method}"]["ndcg@10"] - record["results"][best]["ndcg@10"]
        assert other["queries"] == 10 and other["mean_difference"] == pytest.approx(gap, abs=1e-5)
    # The product's default analyzer (a German chain), not english.
    assert record["settings"]["text_analyzer"] == load_settings().retrieval.text_analyzer != "english"
    assert "mietrecht-mini (de)" in run["stdout"] and "SciFact" not in run["stdout"] + run["stderr"]


def test_tuning_binding_truncation_and_the_query_diff(run: dict) -> None:
    record = run["record"]
    assert set(record["tuned"]) == {"weight_lexical", "weight_semantic", "fusion_rrf_k"}
    assert record["tuning"]["split"] == "train" and record["tuning"]["queries"] == 4
    # Every fusion and semantic weight on the train split: where a fusion default may be chosen.
    train = record["train"]
    assert train["split"] == "train" and train["queries"] == 4
    expected = {f"hybrid-{m}{w}" for m in ("rrf", "minmax", "dbsf") for w in ("", "-wsem0.5", "-wsem0.7")}
    assert set(train["results"]) == {"lexical", "semantic", "hybrid"} | expected
    r = load_settings().retrieval
    assert train["results"]["hybrid"] == train["results"][setting_label(r.fusion_method, r.weight_semantic)]
    binding = record["binding"]
    assert binding["dataset_sha256"] == record["dataset"]["sha256"]
    assert binding["embedding_signature"] == record["settings"]["embedding_signature"]
    assert len(record["binding_hash"]) == 16
    evidence = parse_report("mietrecht-mini.json", record)  # what the search service's evidence gate reads
    assert evidence is not None and evidence.dataset == "mietrecht-mini" and evidence.binding == binding
    share = record["truncated_chunk_share"]
    assert 0.0 <= share["value"] <= 1.0 and share["chunks"] == record["corpus"]["body_chunks"] and share["method"]
    diff_path = Path(record["files"]["query_diff"])
    assert diff_path.name == "mietrecht-mini.queries.jsonl" and diff_path.is_file()
    rows = [json.loads(line) for line in diff_path.read_text().splitlines()]
    assert len(rows) == record["queries"]["hybrid_below_lexical"]
    assert [r["loss"] for r in rows] == sorted((r["loss"] for r in rows), reverse=True)
    for row in rows:
        assert row["ndcg@10_hybrid"] < row["ndcg@10_lexical"] and row["text"] and "rank_lexical" in row


def test_the_semantic_floor_and_every_feature_off_and_on(run: dict) -> None:
    record = run["record"]
    floor = record["semantic_floor"]
    signature = record["settings"]["embedding_signature"]
    assert floor["split"] == "train" and floor["embedding_signature"] == signature
    assert floor["queries_found"] + floor["queries_not_found"] == floor["queries"] == 4
    assert floor["similarity"] is None or -1.0 <= floor["similarity"] <= 1.0
    features = {e["feature"]: e for e in record["features"]["entries"]}
    assert set(features) == {"identity", "synonyms", "semantic_floor", "graph_rag", "decay"}
    assert record["corpus"]["references"] >= 0
    assert features["identity"]["default_on"] is True and features["synonyms"]["default_on"] is False
    assert features["decay"]["ndcg@10_on"] is None and features["decay"]["unmeasurable"]
    base = record["features"]["base"]["hybrid"]
    for name in ("identity", "synonyms", "graph_rag"):
        entry = features[name]
        assert base == (entry["ndcg@10_on"] if entry["default_on"] else entry["ndcg@10_off"]), name
        assert 0.0 <= entry["ndcg@10_on"] <= 1.0 and 0.0 <= entry["ndcg@10_off"] <= 1.0
    # Every measured variant is evidence the gate reads, bound to its own ranking settings.
    found = parse_reports("mietrecht-mini.json", record)
    assert [r.dataset for r in found[1:]] == [f"mietrecht-mini ({v['name']})" for v in record["variants"]]
    assert len({r.binding["ranking_hash"] for r in found}) == len(found) - 1  # identity off ranks like the default
    assert any(line.startswith("| mietrecht-mini | graph_rag | off |") for line in record["features"]["markdown"])


def test_categories_and_unanswerable_queries_with_the_floors_curve(run: dict) -> None:
    """`--categories` (issue 50, item 3): the test queries' categories add up, and the unanswerable queries ran
    against every floor of the sweep, on train and test, each answer counted once."""
    record = run["record"]["categories"]
    evaluated = run["record"]["queries"]["evaluated"]
    assert sum(record["counts"].values()) == evaluated and record["counts"]["question"] > 0  # the set asks questions
    for mode in ("lexical", "semantic", "hybrid"):
        figures = record["results"][mode]
        assert sum(f["queries"] for f in figures.values()) == evaluated
        assert all(0.0 <= f["ndcg@10"] <= 1.0 for f in figures.values() if f["queries"])
    unanswerable = record["unanswerable"]
    assert unanswerable["queries"]["test"]["real_word"] == 2 and unanswerable["queries"]["test"]["removed_answer"] == 2
    floors = [point["threshold"] for point in unanswerable["curve"]]
    assert len(floors) == 9 and floors == sorted(set(floors))
    for point in [unanswerable["no_floor"], *unanswerable["curve"]]:
        for split in ("train", "test"):
            shares = point[split]
            assert shares["queries"] == 4
            assert sum(shares[o] for o in ("empty", "empty_other", "wrong_hit", "leaked")) == pytest.approx(1.0)
            assert shares["leaked"] == 0.0  # a removed document never comes back
    assert unanswerable["no_floor"]["test"]["empty"] == 0.0  # without the floor the lexical leg always answers


def test_the_coverage_gates_curve_is_read_from_one_run_and_its_chosen_point_holds_through_the_api(run: dict) -> None:
    """The coverage gate's curve (retrieval.answer_coverage_gate) is computed from each answer's `answer_gate`
    reading; the point chosen on train, measured through the API with the gate on, gives what the curve said."""
    gate = run["record"]["categories"]["unanswerable"]["coverage_gate"]
    assert len(gate["curve"]) == len(gate["bars"]) * len(gate["min_coverages"])
    for split in ("train", "test"):
        readings = gate["readings"][split]
        assert len(readings) == 4 + sum(1 for r in readings.values() if "ndcg@10" in r)  # 4 unanswerable
        answered = [r for r in readings.values() if r["hits"]]
        assert answered and all(r["coverage"] is None or 0.0 <= r["coverage"] <= 1.0 for r in answered)
    # The side file for offline study: every query of the curve with its reading and the first hits' texts, from
    # which the gate's coverage is recomputed as the API computed it.
    lines = [json.loads(line) for line in (run["out"] / "mietrecht-mini-gate-readings.jsonl").read_text().splitlines()]
    assert {(r["split"], r["qid"]) for r in lines} == {(s, q) for s in ("train", "test") for q in gate["readings"][s]}
    for r in lines:
        assert len(r["texts"]) == min(len(r["hits"]), 3), r
        if r["hits"]:
            recomputed = coverage(content_words(r["query"]), r["texts"])
            assert r["coverage"] == (None if recomputed is None else round(recomputed, 4)), r
    chosen = gate["chosen_on_train"]
    if chosen is not None:  # a point within the cost on the mini set's train queries
        at = next(p for p in gate["curve"] if p["threshold"] == chosen["threshold"])
        for split in ("train", "test"):
            measured = gate["measured_through_api"][split]
            assert measured["ndcg@10"] == at[split]["ndcg@10"] and measured["empty"] == at[split]["empty"]


def test_the_eval_went_through_its_own_world(run: dict, settings: Settings) -> None:
    record, iso = run["record"], run["record"]["isolation"]
    assert iso["database"] != settings.database.name and iso["slot"] != settings.connect.slot_name
    assert iso["topic_prefix"] != settings.kafka.topic_prefix and iso["consumer_group"] != settings.streams.app_id
    assert iso["index_alias"] != settings.retrieval.index_name
    assert record["corpus"]["written_now"] == 20 and record["timings_s"]["rows_indexed_while_waiting"] > 0
    assert "starting the eval sync worker" in run["stderr"]
    # Not a terminal: plain progress lines, the last one at the full count.
    lines = [line for line in run["stderr"].splitlines() if line.startswith("eval: indexing: ")]
    assert lines and re.match(r"eval: indexing: (\d+)/\1 rows \(100%\), ", lines[-1]), lines


def test_isolation_in_both_directions(run: dict, settings: Settings, search: OpenSearch) -> None:
    record, marker = run["record"], run["marker"]
    alias = record["isolation"]["index_alias"]
    # The eval index holds exactly the eval's rows, and no main-database document.
    assert int(search.count(index=alias)["count"]) == record["corpus"]["index_rows"]
    assert _hits(search, alias, EVAL_WORD) >= 1
    assert _hits(search, alias, marker) == 0 and _hits(search, alias, marker + "b") == 0
    eval_db = with_overrides(settings, {"database": {"name": record["isolation"]["database"]}})
    main_engine, eval_engine = make_engine(settings, pooled=False), make_engine(eval_db, pooled=False)
    try:
        count = text("SELECT count(*) FROM documents WHERE title LIKE :t")
        with eval_engine.connect() as conn:
            assert conn.execute(count, {"t": "Markierung Isolationsmarker%"}).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM documents")).scalar() == 20
        with main_engine.connect() as conn:
            assert conn.execute(count, {"t": "Haustiere in der Mietwohnung"}).scalar() == 0
            assert conn.execute(count, {"t": f"Markierung {marker}"}).scalar() == 1
    finally:
        main_engine.dispose()
        eval_engine.dispose()
    # The main index never holds an eval document (whether or not a main worker runs right now).
    assert _hits(search, settings.retrieval.index_name, EVAL_WORD) == 0


def test_a_rerun_resumes_and_drop_removes_everything(run: dict, settings: Settings, search: OpenSearch) -> None:
    again = _ki("eval", "--data", str(DATA), "--queries", "3", "--out", str(run["out"]), "--timeout", "120")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "20 documents already there, writing 0" in again.stderr
    assert "starting the eval sync worker" not in again.stderr
    assert (run["out"] / "mietrecht-mini-q3.json").is_file()
    # Another analyzer is another index (and consumer group), replayed from the same topics: worlds share
    # vectors, so its worker embeds nothing and takes every vector from the first index.
    variant = _ki("eval", "--data", str(DATA), "--analyzer", "standard", "--queries", "3",
                  "--out", str(run["out"] / "variant"), "--timeout", "300")  # fmt: skip
    assert variant.returncode == 0, variant.stderr[-3000:]
    record = json.loads((run["out"] / "variant" / "mietrecht-mini-standard-q3.json").read_text())
    assert record["isolation"]["index_alias"] != run["record"]["isolation"]["index_alias"]
    timings = record["timings_s"]
    assert timings["rows_embedded"] == 0, variant.stderr[-3000:]
    assert timings["rows_vector_reused"] >= record["corpus"]["index_rows"] > 0

    iso = run["record"]["isolation"]
    dropped = _ki("eval", "--data", str(DATA), "--drop", timeout=300)
    assert dropped.returncode == 0, dropped.stderr[-3000:]
    assert f"dropped database {iso['database']}" in dropped.stderr
    assert not search.indices.exists_alias(name=iso["index_alias"])
    engine = make_engine(settings, pooled=False)
    try:
        with engine.connect() as conn:
            assert (
                conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": iso["database"]}).scalar()
                is None
            )
            assert conn.execute(text("SELECT 1 FROM pg_replication_slots WHERE slot_name = :n"),
                                {"n": iso["slot"]}).scalar() is None  # fmt: skip
    finally:
        engine.dispose()
    status, _ = request_json("GET", f"{settings.connect.url.rstrip('/')}/connectors/{iso['connector']}")
    assert status == 404
    home = Path(stack_settings(settings).home).expanduser()
    assert not (home / "eval" / iso["key"]).exists()  # config file with secrets


# --- --config reaches the Faust worker ------------------------------------------------------------


def test_a_worker_started_with_config_uses_it(settings: Settings, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    port = free_port()
    data = settings.model_dump(mode="json")
    data["streams"].update({"app_id": f"ki-test-config-{tag}", "web_port": port, "dlq_topic": f"ki_test_{tag}.dlq"})
    data["streams"]["access_web_port"] = free_port()  # never web_port + 1: that port may be taken
    data["streams"]["principals_web_port"] = free_port()
    data["kafka"]["topic_prefix"] = f"ki_test_{tag}"
    data["retrieval"]["index_name"] = f"ki-test-config-{tag}"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    log = (tmp_path / "worker.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not (k.startswith("KI_") and "__" in k) and k != "KI_CONFIG"}
    worker = subprocess.Popen([sys.executable, "-m", "apps.cli", "--config", str(config), "sync", "run"],
                              cwd=tmp_path, stdout=log, stderr=log, env=env)  # fmt: skip
    admin = make_kafka_admin(settings)
    try:

        def answers() -> bool:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            return exposition.answers(f"http://127.0.0.1:{port}/metrics", "ki_sync_events_total")

        wait_for(answers, timeout=120, interval=0.5, what="the worker on the web port of its --config")
        topics = set(admin.list_topics(timeout=30).topics)
        assert f"ki_test_{tag}.dlq" in topics and any(t.startswith(f"ki_test_{tag}.public.") for t in topics)
        wait_for(
            lambda: f"ki-test-config-{tag}"
            in {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid},
            timeout=60,
            interval=1.0,
            what="the worker's consumer group named after the --config's app id",
        )
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(30)
        log.close()
        mine = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"ki_test_{tag}.")]
        if mine:
            for future in admin.delete_topics(mine, request_timeout=30).values():
                future.result(timeout=60)
        admin.delete_consumer_groups([f"ki-test-config-{tag}"], request_timeout=30)
        home = Path(stack_settings(settings).home).expanduser()
        shutil.rmtree(home / "faust" / f"ki-test-config-{tag}", ignore_errors=True)
