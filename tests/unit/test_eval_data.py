"""SciFact files, subset choice, the baseline table, the tuning grid and the eval settings (no services)."""

import json

import pytest

from ki.eval import report, scifact, tuning
from ki.eval.run import eval_settings, expected_rows, mode_settings, worker_env
from ki.settings import Settings, load_settings

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
    qrels = scifact.parse_qrels("query-id\tcorpus-id\tscore\r\n1\t10\t1\r\n1\t11\t2\r\n3\t12\t0\r\n\r\n")
    assert qrels == {"1": {"10": 1, "11": 2}, "3": {"12": 0}}


@pytest.mark.parametrize("bad", ["1\t2\n", "1\t2\tx\n"])
def test_parse_qrels_names_the_line(bad):
    with pytest.raises(scifact.DataError, match=r"f:1"):
        scifact.parse_qrels(bad, "f")


def test_corpus_parts_are_read_in_part_order(tmp_path):
    derived = tmp_path / "derived"
    derived.mkdir()
    (derived / "corpus.part2of2.jsonl").write_text(json.dumps({"_id": "b", "title": "B", "text": "bb"}) + "\n")
    (derived / "corpus.part1of2.jsonl").write_text(
        json.dumps({"_id": "a", "title": "A", "text": "aa"})
        + "\n\n"
        + json.dumps({"_id": "c", "title": "", "text": "c"})
    )
    assert [d.id for d in scifact.load_corpus(tmp_path)] == ["a", "c", "b"]


def test_corpus_errors_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(scifact.DataError, match="neither corpus.jsonl"):
        scifact.load_corpus(tmp_path)
    derived = tmp_path / "derived"
    derived.mkdir()
    (derived / "corpus.part1of2.jsonl").write_text("{}\n")
    with pytest.raises(scifact.DataError, match="complete set of 2"):
        scifact.load_corpus(tmp_path)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "title": "t"}\n')
    with pytest.raises(scifact.DataError, match=r"corpus.jsonl:1: field 'text'"):
        scifact.load_corpus(tmp_path)
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "a", "title": "t", "text": "x"}\n{"_id": "a", "title": "", "text": "y"}\n'
    )
    with pytest.raises(scifact.DataError, match="duplicate"):
        scifact.load_corpus(tmp_path)


def test_select_queries_keeps_file_order_and_needs_a_relevant_document():
    qrels = {"5": {"a": 1}, "2": {"b": 0}, "9": {"c": 1}, "1": {"d": 1}}
    assert scifact.select_queries(qrels, None) == ["5", "9", "1"]
    assert scifact.select_queries(qrels, 2) == ["5", "9"]
    with pytest.raises(ValueError):
        scifact.select_queries(qrels, 0)


def test_select_documents_puts_judged_documents_first_and_skips_unknown_ids():
    corpus = ["d1", "d2", "d3", "d4", "d5", "d6"]
    priority = [["d5", "missing"], ["d5", "d2"], ["d6"]]
    assert scifact.select_documents(corpus, priority, None) == ["d5", "d2", "d6", "d1", "d3", "d4"]
    assert scifact.select_documents(corpus, priority, 2) == ["d5", "d2"]
    assert scifact.select_documents(corpus, [], 3) == ["d1", "d2", "d3"]


def test_restrict_qrels_judges_a_subset_only_on_what_it_loaded():
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"c": 1}, "q3": {"a": 0, "d": 1}}
    out = scifact.restrict_qrels(qrels, ["q1", "q2", "q3"], ["a", "d"])
    assert out.qrels == {"q1": {"a": 1}, "q3": {"a": 0, "d": 1}}
    assert out.dropped_queries == ("q2",)
    assert out.dropped_judgments == 2  # b and c
    assert scifact.relevant_docs(qrels, ["q3", "q1"]) == ["d", "a", "b"]


def test_corpus_digest_is_order_free_and_short():
    assert scifact.corpus_digest(["b", "a"]) == scifact.corpus_digest(["a", "b"])
    assert scifact.corpus_digest(["a"]) != scifact.corpus_digest(["a", "b"])
    assert len(scifact.corpus_digest(["a"])) == 10


def test_parse_baselines_reads_the_published_table():
    rows = report.parse_baselines(README)
    assert rows == [
        report.Baseline("BM25 (paper)", 0.665, 0.908, "arXiv"),
        report.Baseline("dense", 0.645, None, "MTEB"),
    ]
    assert report.parse_baselines("no table here") == []


def test_the_real_readme_has_the_published_baselines():
    readme = scifact.DEFAULT_DATA_DIR / "README.md"
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
    assert "| dense (published) | 0.645 | — | — |" in md


def test_tuning_grid_and_tie_breaks():
    configs = tuning.grid((0.5, 1.0, 0.5), (10, 60))
    assert len(configs) == 4 and configs[0] == tuning.FusionConfig(0.5, 1.0, 10)
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


def test_eval_settings_use_their_own_index_group_and_analyzer_and_the_worker_env_reproduces_them():
    base = Settings()
    es = eval_settings(base, "english")
    assert es.retrieval.text_analyzer == "english" and base.retrieval.text_analyzer == "german"
    assert es.retrieval.index_name != base.retrieval.index_name
    assert es.streams.app_id != base.streams.app_id
    assert es.streams.web_port == base.streams.web_port + 1
    assert eval_settings(base, "english", 7001).streams.web_port == 7001
    # The child worker gets these as KI_* overrides: loading them must give the same settings.
    child = load_settings(environ=worker_env(es))
    assert child.retrieval.text_analyzer == "english"
    assert child.retrieval.index_name == es.retrieval.index_name
    assert child.streams.app_id == es.streams.app_id and child.streams.web_port == es.streams.web_port


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
    short = scifact.CorpusDoc("1", "Title", "one short abstract")
    long = scifact.CorpusDoc("2", "Title", "word " * 100)  # 500 chars -> several chunks
    assert expected_rows([short], settings) == 2  # profile + one chunk
    assert expected_rows([short, long], settings) > 4
    no_profile = Settings.model_validate({"retrieval": {"profile_embeddings": False}})
    assert expected_rows([short], no_profile) == 1
