"""BEIR files, name/language, subset choice, the baseline table, the tuning grid, the eval's isolated
settings, the per-query diff and the report's binding (no services)."""

import json
from pathlib import Path

import pytest

from apps.dev.eval import beir, isolation, report, tuning
from apps.dev.eval.run import (
    eval_key,
    mode_settings,
    out_stem,
    project,
    truncated_chunk_share,
)
from apps.runtime.processes import free_port
from ki.settings import Settings, SettingsError, load_settings
from search.ranking.mode_gate import binding_for, binding_hash
from tests.conftest import wait_for

README = """# data
| file | content |
| --- | --- |
| `x` | y |

## Published baselines (nDCG@10 on the 300 test queries)

| system | nDCG@10 | recall@100 | source |
| --- | --- | --- | --- |
| BM25 (paper) | 0.665 | 0.908 | arXiv |
| dense | 0.645 | — | MTEB |
| broken | n/a | 0.1 | x |

after the table
"""


def test_parse_qrels_handles_header_crlf_and_grades():
    qrels = beir.parse_qrels("query-id\tcorpus-id\tscore\r\n1\t10\t1\r\n1\t11\t2\r\n3\t12\t0\r\n\r\n")
    assert qrels == {"1": {"10": 1, "11": 2}, "3": {"12": 0}}


@pytest.mark.parametrize("bad", ["1\t2\n", "1\t2\tx\n"])
def test_parse_qrels_names_the_line(bad):
    with pytest.raises(beir.DataError, match=r"f:1"):
        beir.parse_qrels(bad, "f")


def test_corpus_parts_are_read_in_part_order(tmp_path):
    derived = tmp_path / "derived"
    derived.mkdir()
    (derived / "corpus.part2of2.jsonl").write_text(json.dumps({"_id": "b", "title": "B", "text": "bb"}) + "\n")
    (derived / "corpus.part1of2.jsonl").write_text(
        json.dumps({"_id": "a", "title": "A", "text": "aa"})
        + "\n\n"
        + json.dumps({"_id": "c", "title": "", "text": "c"})
    )
    assert [d.id for d in beir.load_corpus(tmp_path)] == ["a", "c", "b"]


def test_corpus_errors_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(beir.DataError, match="neither corpus.jsonl"):
        beir.load_corpus(tmp_path)
    derived = tmp_path / "derived"
    derived.mkdir()
    (derived / "corpus.part1of2.jsonl").write_text("{}\n")
    with pytest.raises(beir.DataError, match="complete set of 2"):
        beir.load_corpus(tmp_path)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "title": "t"}\n')
    with pytest.raises(beir.DataError, match=r"corpus.jsonl:1: field 'text'"):
        beir.load_corpus(tmp_path)
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "a", "title": "t", "text": "x"}\n{"_id": "a", "title": "", "text": "y"}\n'
    )
    with pytest.raises(beir.DataError, match="duplicate"):
        beir.load_corpus(tmp_path)


def test_select_queries_keeps_file_order_and_needs_a_relevant_document():
    qrels = {"5": {"a": 1}, "2": {"b": 0}, "9": {"c": 1}, "1": {"d": 1}}
    assert beir.select_queries(qrels, None) == ["5", "9", "1"]
    assert beir.select_queries(qrels, 2) == ["5", "9"]
    with pytest.raises(ValueError):
        beir.select_queries(qrels, 0)


def test_select_documents_puts_judged_documents_first_and_skips_unknown_ids():
    corpus = ["d1", "d2", "d3", "d4", "d5", "d6"]
    priority = [["d5", "missing"], ["d5", "d2"], ["d6"]]
    assert beir.select_documents(corpus, priority, None) == ["d5", "d2", "d6", "d1", "d3", "d4"]
    assert beir.select_documents(corpus, priority, 2) == ["d5", "d2"]
    assert beir.select_documents(corpus, [], 3) == ["d1", "d2", "d3"]


def test_restrict_qrels_judges_a_subset_only_on_what_it_loaded():
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"c": 1}, "q3": {"a": 0, "d": 1}}
    out = beir.restrict_qrels(qrels, ["q1", "q2", "q3"], ["a", "d"])
    assert out.qrels == {"q1": {"a": 1}, "q3": {"a": 0, "d": 1}}
    assert out.dropped_queries == ("q2",)
    assert out.dropped_judgments == 2  # b and c
    assert beir.relevant_docs(qrels, ["q3", "q1"]) == ["d", "a", "b"]


def test_corpus_digest_is_order_free_and_short():
    assert beir.corpus_digest(["b", "a"]) == beir.corpus_digest(["a", "b"])
    assert beir.corpus_digest(["a"]) != beir.corpus_digest(["a", "b"])
    assert len(beir.corpus_digest(["a"])) == 10


def test_parse_baselines_reads_the_published_table():
    rows = report.parse_baselines(README)
    assert rows == [
        report.Baseline("BM25 (paper)", 0.665, 0.908, "arXiv"),
        report.Baseline("dense", 0.645, None, "MTEB"),
    ]
    assert report.parse_baselines("no table here") == []


def test_reference_tables_with_an_mrr_column_and_bold_figures():
    readme = (
        "| system | nDCG@10 | recall@100 | MRR@10 | source |\n| --- | --- | --- | --- | --- |\n"
        "| BM25 | **0.4928** | **0.8170** | **0.4456** | measured here |\n"
    )
    assert report.parse_baselines(readme) == [report.Baseline("BM25", 0.4928, 0.817, "measured here", 0.4456)]


def test_the_real_readme_has_the_published_baselines():
    readme = beir.DEFAULT_DATA_DIR / "README.md"
    if not readme.is_file():
        pytest.fail(f"{readme} is missing: the eval data set is part of the shared folder")
    systems = {b.system: b for b in report.parse_baselines(readme.read_text())}
    assert len(systems) >= 5
    assert any(b.recall100 is not None for b in systems.values())


def test_tables_list_our_modes_then_the_baselines():
    results = {"lexical": {"ndcg@10": 0.5, "recall@100": 0.75, "mrr@10": 0.25}}
    text = report.format_table(results, report.parse_baselines(README), title="T")
    lines = text.splitlines()
    assert lines[0] == "T"
    assert "ki lexical" in lines[3] and "0.500" in lines[3] and "0.750" in lines[3] and "0.250" in lines[3]
    assert "BM25 (paper)" in text and "0.908" in text and "—" in text
    md = report.markdown_table(results, report.parse_baselines(README))
    assert "| **ki lexical** | 0.500 | 0.750 | 0.250 |" in md
    assert "| dense (README) | 0.645 | — | — |" in md


def test_tuning_grid_and_tie_breaks():
    configs = tuning.grid((0.5, 1.0, 0.5), (10, 60))
    assert len(configs) == 4 and configs[0] == tuning.FusionConfig(1.0, 0.5, 10)
    default_grid = tuning.grid()
    assert min(c.weight_semantic for c in default_grid) <= 0.1 and max(c.weight_semantic for c in default_grid) >= 1.0
    assert {10, 100} <= {c.rrf_k for c in default_grid}
    assert all(c.weight_lexical == 1.0 for c in default_grid)
    default = tuning.FusionConfig(1.0, 1.0, 60)
    a, b = tuning.FusionConfig(0.5, 1.0, 10), tuning.FusionConfig(2.0, 1.0, 10)
    assert tuning.pick_best([(a, 0.5), (b, 0.7)], default) == (b, 0.7)
    assert tuning.pick_best([(a, 0.7), (b, 0.7)], default) == (a, 0.7)  # earliest wins a tie
    assert tuning.pick_best([(a, 0.7), (default, 0.7), (b, 0.7)], default) == (default, 0.7)
    with pytest.raises(ValueError):
        tuning.pick_best([], default)
    with pytest.raises(ValueError):
        tuning.grid((), (60,))
    with pytest.raises(ValueError):
        tuning.grid((1.0,), (0,))


def test_mode_settings_weight_one_leg_only():
    base = Settings()
    lexical = mode_settings(base, "lexical").retrieval
    semantic = mode_settings(base, "semantic").retrieval
    hybrid = mode_settings(base, "hybrid").retrieval
    assert (lexical.weight_lexical, lexical.weight_semantic, lexical.weight_identifier) == (1.0, 0.0, 0.0)
    assert (semantic.weight_lexical, semantic.weight_semantic, semantic.weight_identifier) == (0.0, 1.0, 0.0)
    assert hybrid == base.retrieval
    tuned = mode_settings(base, "hybrid", tuning.FusionConfig(2.0, 1.0, 20)).retrieval
    assert (tuned.weight_lexical, tuned.weight_semantic, tuned.fusion_rrf_k) == (2.0, 1.0, 20)
    assert tuned.weight_identifier == base.retrieval.weight_identifier


def test_expected_rows_follow_the_projection():
    settings = Settings.model_validate({"retrieval": {"chunk_chars": 100, "chunk_overlap_chars": 10}})
    short = beir.CorpusDoc("1", "Title", "one short abstract")
    long = beir.CorpusDoc("2", "Title", "word " * 100)  # 500 chars -> several chunks
    assert project([short], settings, "de").rows == 2  # profile + one chunk
    assert project([short, long], settings, "de").rows > 4
    no_profile = Settings.model_validate({"retrieval": {"profile_embeddings": False}})
    assert project([short], no_profile, "de").rows == 1


def test_tuning_samples_at_most_the_limit_in_file_order_and_reproducibly():
    ids = [f"q{i}" for i in range(50)]
    assert tuning.sample_queries(ids, 100) == ids
    sample = tuning.sample_queries(ids, 10)
    assert len(sample) == 10 and sample == sorted(sample, key=ids.index)
    assert sample == tuning.sample_queries(ids, 10)


def _beir(root, *, train=True, readme=None, text="Der Mieter kündigt das Mietverhältnis."):
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "T", "text": text}) + "\n" for i in range(3))
    )
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "Kündigung"}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    if train:
        (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n")
    if readme is not None:
        (root / "README.md").write_text(readme)
    return root


def test_data_files_need_train_only_when_asked_and_hash_every_file(tmp_path):
    with_train = _beir(tmp_path / "a")
    without = _beir(tmp_path / "b", train=False)
    assert beir.train_qrels_path(without) is None
    names = [p.relative_to(with_train).as_posix() for p in beir.data_files(with_train, with_train=True)]
    assert names == ["corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv"]
    assert len(beir.data_files(without, with_train=True)) == 3
    combined, each = beir.files_sha256(with_train, beir.data_files(with_train, with_train=True))
    assert len(combined) == 64 and set(each) == set(names)
    other, _ = beir.files_sha256(without, beir.data_files(without, with_train=False))
    assert other != combined


def test_name_and_language_resolution(tmp_path):
    german = _beir(tmp_path / "Gesetze Mini")
    corpus = beir.load_corpus(german)
    assert beir.resolve_dataset(german, corpus=[]).language == beir.DEFAULT_LANGUAGE  # nothing to go by
    many = [beir.CorpusDoc("x", "", "Der Vermieter und die Mieterin sind mit dem Vertrag nicht einverstanden, " * 5)]
    found = beir.resolve_dataset(german, corpus=many)
    assert (found.name, found.language, found.language_source) == ("Gesetze Mini", "de", "corpus")
    english = [beir.CorpusDoc("x", "", "The tenant and the landlord agree that the rent is due on the first day. " * 5)]
    assert beir.resolve_dataset(german, corpus=english).language == "en"
    hinted = _beir(tmp_path / "hinted", readme="# x\n\nlanguage: EN\n")
    assert beir.resolve_dataset(hinted, corpus=corpus).language == "en"
    assert beir.resolve_dataset(hinted, corpus=corpus).language_source == "README"
    flagged = beir.resolve_dataset(hinted, name="mine", language="fr", corpus=corpus)
    assert (flagged.name, flagged.language, flagged.language_source) == ("mine", "fr", "--language")
    with pytest.raises(beir.DataError, match="--language"):
        beir.resolve_dataset(hinted, language="deutsch!")


def test_slugs_are_safe_names_and_never_collide():
    assert beir.slug("scifact") == "scifact" and beir.slug("xquad-de") == "xquad_de"
    assert beir.slug("Foo Bar") != beir.slug("foo_bar")
    for name in ("Foo Bar", "9x", "ü" * 40, "a" * 60):
        s = beir.slug(name)
        assert s[0].isalpha() and len(s) <= 24 and all(c.isalnum() or c == "_" for c in s) and s.isascii()


def test_the_eval_key_changes_with_the_corpus_and_the_subset():
    ds = beir.Dataset("xquad-de", "de", "README", Path("."))
    full = eval_key(ds, "a" * 64, None)
    assert full.startswith("xquad_de_") and full == eval_key(ds, "a" * 64, None)
    assert eval_key(ds, "b" * 64, None) != full
    assert eval_key(ds, "a" * 64, ["d1", "d2"]) != full


def test_the_eval_target_is_a_world_of_its_own_and_its_alias_hashes_the_index_settings():
    base = Settings()
    t = isolation.make_target(base, "xquad_de_abc123", analyzer="german", embedding_signature="emb-384", web_port=7001)
    s = t.settings
    assert s.database.name == "ki_eval_xquad_de_abc123" != base.database.name
    assert s.connect.slot_name == "ki_eval_xquad_de_abc123" != base.connect.slot_name
    assert s.connect.publication_name == "ki_eval_xquad_de_abc123_pub"
    assert s.connect.connector_name != base.connect.connector_name
    assert s.kafka.topic_prefix == "ki_eval_xquad_de_abc123" != base.kafka.topic_prefix
    assert s.streams.dlq_topic == "ki_eval_xquad_de_abc123.dlq" and s.streams.web_port == 7001
    assert s.streams.app_id == s.retrieval.index_name == f"ki-eval-xquad_de_abc123-{t.index_hash}"
    assert s.retrieval.index_name.startswith(t.group_prefix)
    # Another analyzer, embedder or chunking: another alias and consumer group; the same: the same.
    same = isolation.make_target(base, "xquad_de_abc123", analyzer="german", embedding_signature="emb-384")
    assert same.settings.retrieval.index_name == s.retrieval.index_name
    others = [
        isolation.make_target(base, "xquad_de_abc123", analyzer="standard", embedding_signature="emb-384"),
        isolation.make_target(base, "xquad_de_abc123", analyzer="german", embedding_signature="other-768"),
        isolation.make_target(
            Settings.model_validate({"retrieval": {"chunk_chars": 600}}),
            "xquad_de_abc123",
            analyzer="german",
            embedding_signature="emb-384",
        ),
        isolation.make_target(
            Settings.model_validate({"retrieval": {"chunk_contextualize": False}}),
            "xquad_de_abc123",
            analyzer="german",
            embedding_signature="emb-384",
        ),
    ]
    aliases = {o.settings.retrieval.index_name for o in others}
    assert len(aliases) == 4 and s.retrieval.index_name not in aliases
    assert all(o.settings.streams.app_id == o.settings.retrieval.index_name for o in others)
    assert others[0].settings.retrieval.text_analyzer == "standard"


def test_the_worker_config_file_reproduces_the_eval_settings(tmp_path, monkeypatch):
    t = isolation.make_target(Settings(), "k_1", analyzer="standard", embedding_signature="e", web_port=7002)
    path = isolation.write_config(t.settings, tmp_path / "c.json")
    monkeypatch.setenv("KI_RETRIEVAL__INDEX_NAME", "would-clobber-the-eval-alias")
    env = isolation.child_env(path)
    assert "KI_RETRIEVAL__INDEX_NAME" not in env and env["KI_CONFIG"] == str(path)
    assert load_settings(environ=env) == t.settings


def test_overrides_are_validated():
    with pytest.raises(SettingsError, match="weight_semantic"):
        mode_settings(Settings(), "hybrid", tuning.FusionConfig(1.0, -1.0, 60))
    with pytest.raises(SettingsError):
        isolation.make_target(Settings(), "bad key!", analyzer="german", embedding_signature="e")


def test_query_diff_lists_hybrid_losses_biggest_first():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}, "q4": {"d": 1}}
    lexical = {"q1": ["a", "x"], "q2": ["x", "b"], "q3": ["c"], "q4": ["x"]}
    hybrid = {"q1": ["x", "y", "a"], "q2": ["b"], "q3": ["x", "c"], "q4": ["d"]}
    rows = report.query_diff(lexical, hybrid, qrels, {"q1": "eins", "q3": "drei"})
    assert [r["query_id"] for r in rows] == ["q1", "q3"]  # q1 loses 0.5, q3 loses 0.37
    assert rows[0]["text"] == "eins" and (rows[0]["rank_lexical"], rows[0]["rank_hybrid"]) == (1, 3)
    assert rows[0]["ndcg@10_lexical"] == 1.0 and rows[0]["ndcg@10_hybrid"] == 0.5 and rows[0]["loss"] == 0.5
    assert report.first_relevant_rank(["x"], {"a": 1}) is None


def test_the_binding_names_data_embedder_analyzer_and_ranking():
    base = Settings()
    binding = binding_for(base, "emb-384", "f" * 64)
    assert set(binding) == {"dataset_sha256", "embedding_signature", "analyzer_hash", "ranking_hash"}
    assert len(binding["analyzer_hash"]) == 12 and len(binding["ranking_hash"]) == 12
    assert len(binding_hash(binding)) == 16 and binding_hash(binding) == binding_hash(dict(binding))
    other_analyzer = binding_for(
        Settings.model_validate({"retrieval": {"text_analyzer": "standard"}}), "emb-384", "f" * 64
    )
    assert other_analyzer["analyzer_hash"] != binding["analyzer_hash"]
    assert other_analyzer["ranking_hash"] == binding["ranking_hash"]
    reweighted = binding_for(mode_settings(base, "lexical"), "emb-384", "f" * 64)
    assert (
        reweighted["ranking_hash"] != binding["ranking_hash"]
        and reweighted["analyzer_hash"] == binding["analyzer_hash"]
    )
    assert binding_hash(binding_for(base, "emb-384", "e" * 64)) != binding_hash(binding)


class _Counter:
    max_tokens = 5

    def count_tokens(self, text):  # words plus the two special tokens, untruncated like the embedders'
        return len(text.split()) + 2


def test_truncated_chunk_share_says_how_it_counted():
    out = truncated_chunk_share(["a", "a b c", "a b c d e f"], _Counter())
    assert out["value"] == round(1 / 3, 4) and out["chunks"] == 3 and out["max_tokens"] == 5
    assert "count_tokens" in out["method"]
    assert truncated_chunk_share(["a"], object())["value"] is None


def test_output_names_carry_the_data_set_and_the_subset():
    assert out_stem("xquad-de", None, None) == "xquad-de"
    assert out_stem("xquad-de", 100, 20) == "xquad-de-docs100-q20"
    assert out_stem("my set/1", None, None, "standard") == "my-set-1-standard"


_FAKE_WORKER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ki_sync_events_total 0")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_killed_runs_worker_is_adopted_with_the_same_settings_and_stopped_otherwise(tmp_path):
    import subprocess
    import sys

    base = Settings.model_validate({"stack": {"home": str(tmp_path)}})
    target = isolation.make_target(base, "k_1", analyzer="german", embedding_signature="e", web_port=1)
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", _FAKE_WORKER, str(port)])
    try:
        target.state_dir.mkdir(parents=True)
        record = {"pid": fake.pid, "app_id": target.settings.streams.app_id, "port": port}
        (target.state_dir / "worker.json").write_text(json.dumps(record))
        worker = isolation.EvalWorker(target, tmp_path / "w.log")
        wait_for(worker.adopt, timeout=20, what="the fake worker to listen and be adopted")
        assert worker.adopted == fake.pid and worker.port == port
        worker.check_alive()
        # Another settings variant of the same eval key does not adopt it; stop_orphan ends it.
        other = isolation.make_target(base, "k_1", analyzer="standard", embedding_signature="e", web_port=1)
        stranger = isolation.EvalWorker(other, tmp_path / "w.log")
        assert stranger.adopt() is None
        assert stranger.stop_orphan() == fake.pid
        assert fake.wait(10) is not None
        assert not (target.state_dir / "worker.json").exists()
        assert stranger.stop_orphan() is None
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()


def test_expected_rows_cut_chunks_to_the_workers_token_budget_like_the_worker():
    from apps.dev.eval.run import token_budget

    class Words:
        max_tokens = 40

        def count_tokens(self, text):
            return len(text.split()) + 2

    doc = beir.CorpusDoc("1", "Titel", "Wort " * 200)  # 1,000 characters: one chunk by characters
    settings = Settings()
    plain = project([doc], settings, "de")
    cut = project([doc], settings, "de", token_budget(Words()))
    assert plain.chunks == 1 and cut.chunks > 1 and cut.rows == cut.chunks + 1  # + the profile row
    assert all(Words().count_tokens(t) <= Words.max_tokens for t in cut.chunk_inputs)
    assert token_budget(object()) is None
