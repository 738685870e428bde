"""A versioned BEIR set: reading, grouping, the latest final version, whole documents, hits counted by version,
the words-on/off record and the comparison-label check (no services)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from apps.dev.eval import beir, versioned
from apps.dev.eval.queries import compare_labels, hit_corpus_ids
from apps.dev.eval.run import project
from ki.settings import Settings


def _write(root: Path, rows: list[dict]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


VERSIONED = [
    {"_id": "a2", "title": "Mietvertrag", "text": "zwei", "document": "a", "version_no": 2, "status": "executed",
     "doc_date": "2020-03-01"},
    {"_id": "b1", "title": "Gutachten", "text": "eins", "document": "b", "version_no": 1, "status": "draft"},
    {"_id": "a1", "title": "Mietvertrag", "text": "eins", "document": "a", "version_no": 1, "status": "final",
     "doc_date": "2020-01-01"},
    {"_id": "a3", "title": "Mietvertrag", "text": "drei", "document": "a", "version_no": 3, "status": "draft",
     "doc_date": "2020-06-01"},
    {"_id": "c", "title": "Plain", "text": "ohne Versionen"},
]  # fmt: skip


def test_versioned_entries_are_read_with_their_fields(tmp_path):
    _write(tmp_path, VERSIONED)
    docs = {d.id: d for d in beir.load_corpus(tmp_path)}
    assert docs["a2"] == beir.CorpusDoc("a2", "Mietvertrag", "zwei", "a", 2, dt.date(2020, 3, 1), "executed")
    assert (docs["b1"].status, docs["b1"].doc_date, docs["b1"].group) == ("draft", None, "b")
    # An entry without the fields is a plain, final, undated single version of its own document.
    assert docs["c"] == beir.CorpusDoc("c", "Plain", "ohne Versionen")
    assert (docs["c"].group, docs["c"].version_no, docs["c"].status) == ("c", 1, "final")
    assert beir.is_versioned(docs.values()) and not beir.is_versioned([docs["c"]])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"version_no": 0}, "version_no"),
        ({"version_no": "2"}, "version_no"),
        ({"doc_date": "1.3.2020"}, "doc_date"),
        ({"status": "signed"}, "status"),
        ({"document": 7}, "document"),
    ],
)
def test_bad_version_fields_name_the_line(tmp_path, extra, message):
    _write(tmp_path, [{"_id": "x", "title": "T", "text": "t", **extra}])
    with pytest.raises(beir.DataError, match=rf"corpus.jsonl:1: field '{message}'"):
        beir.load_corpus(tmp_path)


def test_a_version_number_twice_in_one_document_is_refused(tmp_path):
    rows = [{"_id": "x1", "title": "T", "text": "t", "document": "x"},
            {"_id": "x2", "title": "T", "text": "u", "document": "x", "version_no": 1}]  # fmt: skip
    _write(tmp_path, rows)
    with pytest.raises(beir.DataError, match=r"corpus.jsonl:2: document 'x' has version 1 twice"):
        beir.load_corpus(tmp_path)


def test_versions_group_per_document_in_version_order_and_the_latest_final_is_the_last_final(tmp_path):
    _write(tmp_path, VERSIONED)
    groups = beir.group_versions(beir.load_corpus(tmp_path))
    assert [[d.id for d in g] for g in groups] == [["a1", "a2", "a3"], ["b1"], ["c"]]
    assert [beir.latest_final(g) for g in groups] == [1, None, 0]  # a2 (executed; a3 is a draft), none, c


def test_a_plain_set_groups_one_document_per_entry_in_corpus_order():
    docs = [beir.CorpusDoc(i, "T", "t") for i in ("z", "a", "m")]
    assert [[d.id for d in g] for g in beir.group_versions(docs)] == [["z"], ["a"], ["m"]]


def test_a_chosen_version_brings_its_whole_document():
    docs = [beir.CorpusDoc(i, "T", "t", document=i[0], version_no=int(i[1])) for i in ("a1", "a2", "b1", "c1", "c2")]
    assert beir.whole_documents(["c2", "a1"], docs) == ["c1", "c2", "a1", "a2"]
    plain = [beir.CorpusDoc(i, "T", "t") for i in ("x", "y")]
    assert beir.whole_documents(["y"], plain) == ["y"]


def test_query_metadata_is_read_where_present(tmp_path):
    (tmp_path / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "a", "metadata": {"kind": "dated"}}\n{"_id": "q2", "text": "b"}\n'
    )
    assert beir.load_query_metadata(tmp_path) == {"q1": {"kind": "dated"}}


def test_expected_rows_of_a_versioned_document_have_one_profile_for_its_latest_final():
    settings = Settings.model_validate({"retrieval": {"chunk_chars": 100, "chunk_overlap_chars": 10}})
    versions = [beir.CorpusDoc(f"a{n}", "Titel", f"kurz {n}", "a", n, dt.date(2020, n, 1), s)
                for n, s in ((1, "final"), (2, "executed"), (3, "draft"))]  # fmt: skip
    assert project(versions, settings, "de").rows == 4  # three chunks + the profile of a2
    drafts = [beir.CorpusDoc(f"b{n}", "Titel", "kurz", "b", n, None, "draft") for n in (1, 2)]
    assert project(drafts, settings, "de").rows == 2  # no final version: no profile


def test_hits_count_by_version_in_a_versioned_set_and_by_document_otherwise():
    hits = [{"document_id": 1, "version_id": 11}, {"document_id": 2, "version_id": 22},
            {"document_id": 3, "version_id": 33}]  # fmt: skip
    assert hit_corpus_ids(hits, {1: "a", 2: "b"}) == ["a", "b"]
    assert hit_corpus_ids(hits, {1: "a", 2: "b"}, {11: "a2", 33: "c1"}) == ["a2", "c1"]
    assert hit_corpus_ids(hits, None) == ["1", "2", "3"]


def test_compare_labels_map_the_earlier_version_to_its_corpus_id():
    versions = {11: "a2", 10: "a1", 22: "b1"}
    hits = [
        {"version_id": 11, "compare": {"earlier": {"side": "previous", "version_id": 10}}},
        {"version_id": 22, "compare": {"earlier": {"side": "previous", "version_id": None}}},
        {"version_id": 99, "compare": {"earlier": {"version_id": 10}}},  # not in the data set
        {"version_id": 10},  # no label
    ]
    assert compare_labels(hits, versions) == {"a2": "a1", "b1": None}


def test_the_comparison_labels_are_checked_against_the_metadata():
    qrels = {"q1": {"a2": 1}, "q2": {"b1": 1}, "q3": {"c2": 1}, "q4": {"d1": 1}}
    metadata = {"q1": {"earlier": "a1"}, "q2": {"earlier": None}, "q3": {"earlier": "c1"}, "q4": {"kind": "dated"}}
    compared = {"q1": {"a2": "a1"}, "q2": {"b1": "b0"}, "q3": {"x": "c1"}}
    check = versioned.check_compare_labels(compared, qrels, metadata)
    assert (check["checked"], check["correct"], check["not_found"]) == (3, 1, 1)
    assert check["wrong"] == [{"query_id": "q2", "hit": "b1", "expected": None, "labelled": "b0"}]
    assert check["not_found_queries"] == ["q3"]


def test_words_on_against_off_is_paired_per_query_and_per_kind():
    qrels = {f"q{i}": {f"v{i}": 1} for i in range(12)}
    metadata = {f"q{i}": {"kind": "dated" if i < 8 else "compare"} for i in range(12)}
    on = {f"q{i}": [f"v{i}"] for i in range(12)}  # every relevant version first
    off = {f"q{i}": ["other", f"v{i}"] if i < 8 else [f"v{i}"] for i in range(12)}  # the dated ones second
    runs = {"hybrid": on, "hybrid-words-off": off, "lexical": on}  # lexical measured one way only
    record = versioned.query_words_record(runs, qrels, metadata, {})
    assert list(record["modes"]) == ["hybrid"] and record["queries"] == 12
    hybrid = record["modes"]["hybrid"]
    assert hybrid["on"]["ndcg@10"] == 1.0 and hybrid["off"]["mrr@10"] == pytest.approx((8 * 0.5 + 4) / 12, abs=1e-6)
    paired = hybrid["paired_ndcg@10"]
    assert (paired["wins"], paired["losses"], paired["ties"]) == (8, 0, 4) and paired["p_value"] < 0.05
    assert record["per_kind"]["dated"]["queries"] == 8 and record["per_kind"]["dated"]["paired_ndcg@10"]["wins"] == 8
    assert record["per_kind"]["compare"]["paired_ndcg@10"]["ties"] == 4
    rows = versioned.markdown_rows("dated-de", record)
    assert len(rows) == 3 and rows[0].startswith("| dated-de | hybrid | 12 | 1.000 / ")
