"""Question categories and unanswerable queries of `ki eval --categories` (apps.dev.eval.categories, .negatives)."""

from __future__ import annotations

import pytest

from apps.dev.eval import categories as cat
from apps.dev.eval import negatives as neg

# --- categories ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "metadata", "expected"),
    [
        ("§ 573 BGB", None, "identifier"),
        ("Kündigung nach § 573c BGB", None, "identifier"),  # a provision anywhere in the query
        ("Urteil VIII ZR 123/20", None, "identifier"),  # a court file number
        ("Ordentliche Kündigung des Vermieters", {"law": "BGB", "section": "§ 573"}, "exact_title"),  # a heading
        ("super bowl 50", None, "exact_title"),  # a loaded document's title, casefolded
        ("Wie viele Punkte gab die Verteidigung ab?", None, "question"),
        ("Welche Farbe hat der Himmel", None, "question"),  # an interrogative word, no question mark
        ("What causes inflammation?", None, "question"),
        ("0-dimensional biomaterials lack inductive properties.", {}, "concept"),  # a claim
        ("Kündigungsfrist Mietvertrag", None, "concept"),
        ("irgendwas", {"category": "question"}, "question"),  # the data set names it
        ("irgendwas", {"category": "nonsense"}, "concept"),  # an unknown declared category is ignored
    ],
)
def test_the_rule_assigns_each_kind_of_query(query: str, metadata: dict | None, expected: str) -> None:
    assert cat.assign_category(query, metadata, frozenset({"super bowl 50"})) == expected


def test_an_identifier_wins_over_a_question_and_a_title() -> None:
    assert cat.assign_category("Was regelt § 573 BGB?", None, frozenset()) == "identifier"
    assert cat.assign_category("Wo steht § 1 GG?", {"section": "§ 1"}, frozenset({"wo steht § 1 gg?"})) == "identifier"


def test_per_category_figures_with_counts_and_empty_categories() -> None:
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d4": 0}}
    run = {"q1": ["d1"], "q2": ["x", "d2"], "q3": []}
    categories = {"q1": "question", "q2": "question", "q3": "concept", "q4": "concept"}
    out = cat.per_category(run, qrels, categories)
    assert out["question"]["queries"] == 2
    assert out["question"]["mrr@10"] == pytest.approx((1.0 + 0.5) / 2, abs=1e-4)
    assert out["concept"] == {"queries": 1, "ndcg@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}  # q4 has no relevant
    assert out["identifier"] == {"queries": 0} and out["exact_title"] == {"queries": 0}
    assert cat.category_counts(categories) == {"identifier": 0, "exact_title": 0, "question": 2, "concept": 2}


def test_assign_all_reads_titles_and_metadata() -> None:
    out = cat.assign_all({"a": "Super Bowl 50", "b": "Wer?"}, {"b": {}}, ["Super  Bowl 50", ""])
    assert out == {"a": "exact_title", "b": "question"}


# --- unanswerable queries ---------------------------------------------------------------------------------------


def test_absent_words_leave_out_what_the_corpus_contains() -> None:
    vocabulary = neg.corpus_vocabulary(["Der Regenschirm steht im Flur.", "Eine GITARRE"])
    words = neg.absent_words("de", vocabulary)
    assert "Regenschirm" not in words and "Gitarre" not in words
    assert "Kochlöffel" in words
    assert len(words) == len(set(words))
    assert neg.absent_words("xx", vocabulary) == []  # no list for the language


def test_words_split_into_disjoint_seeded_halves() -> None:
    words = neg.absent_words("en", frozenset())
    halves = neg.split_words(words, 7)
    assert not set(halves["train"]) & set(halves["test"])
    assert sorted(halves["train"] + halves["test"]) == sorted(words)
    assert neg.split_words(words, 7) == halves  # seeded: the same every run
    assert neg.split_words(words, 8) != halves


def test_real_word_queries_are_deterministic_one_or_two_words_from_their_half() -> None:
    words = ["alpha", "beta", "gamma", "delta"]
    queries = neg.real_word_queries(words, 6, 3, "test")
    assert queries == neg.real_word_queries(words, 6, 3, "test")
    assert queries != neg.real_word_queries(words, 6, 3, "train")
    assert len(queries) == 6 and len({q.text for q in queries}) == 6
    assert [len(q.text.split()) for q in queries] == [1, 2, 1, 2, 1, 2]
    for q in queries:
        assert q.kind == "real_word" and not q.removed
        parts = q.text.split()
        assert set(parts) <= set(words) and len(set(parts)) == len(parts)
    assert neg.real_word_queries([], 5, 3, "test") == []
    assert len(neg.real_word_queries(["solo"], 5, 3, "test")) == 1  # runs out of distinct queries


def test_removed_answer_queries_remove_each_querys_relevant_documents() -> None:
    qrels = {"q1": {"d1": 1, "d9": 0}, "q2": {"d2": 1, "d3": 2}, "q3": {"d4": 0}, "q4": {"d5": 1}}
    queries = {"q1": "eins", "q2": "zwei", "q3": "drei"}  # q4 has no text
    out = neg.removed_answer_queries(qrels, queries, 5, 1, "train")
    assert [(q.qid, q.text, q.removed) for q in out] == [
        ("neg-removed-train-q1", "eins", frozenset({"d1"})),
        ("neg-removed-train-q2", "zwei", frozenset({"d2", "d3"})),
    ]
    one = neg.removed_answer_queries(qrels, queries, 1, 1, "train")
    assert len(one) == 1 and one == neg.removed_answer_queries(qrels, queries, 1, 1, "train")


def test_outcomes_and_shares() -> None:
    assert neg.outcome([], "no_credible_evidence") == "empty"
    assert neg.outcome([], "filtered_out") == "empty_other"
    assert neg.outcome(["d7"], None) == "wrong_hit"
    assert neg.outcome(["d7", "d1"], None, frozenset({"d1"})) == "leaked"
    assert neg.shares(["empty", "empty", "wrong_hit", "empty_other"]) == {
        "queries": 4, "empty": 0.5, "empty_other": 0.25, "wrong_hit": 0.25, "leaked": 0.0,
    }  # fmt: skip
    assert neg.shares([])["queries"] == 0


def test_the_threshold_is_the_emptiest_within_the_cost() -> None:
    curve = [
        {"threshold": 0.80, "ndcg@10": 0.70, "empty": 0.2},
        {"threshold": 0.82, "ndcg@10": 0.695, "empty": 0.5},
        {"threshold": 0.84, "ndcg@10": 0.69, "empty": 0.5},  # as empty, costs more: not chosen
        {"threshold": 0.86, "ndcg@10": 0.60, "empty": 0.9},  # too costly
    ]
    assert neg.choose_threshold(curve, 0.70, 0.01)["threshold"] == 0.82
    assert neg.choose_threshold(curve, 0.80, 0.01) is None


# --- the subsample a small run uses ---------------------------------------------------------------------------


def test_a_subsample_keeps_every_judged_document_and_is_deterministic() -> None:
    from apps.dev.eval.subsample import choose

    corpus = [f"d{i}" for i in range(50)]
    test = {f"t{i}": {f"d{i}": 1} for i in range(10)}
    train = {f"r{i}": {f"d{10 + i}": 1, "gone": 1} for i in range(10)} | {"r-none": {"d30": 0}}
    sample = choose(corpus, test, train, n_test=3, n_train=4, distractors=5, seed=1)
    assert len(sample.test) == 3 and len(sample.train) == 4 and "r-none" not in sample.train
    judged = {d for qrels in (sample.test, sample.train) for j in qrels.values() for d in j if d != "gone"}
    assert judged <= set(sample.doc_ids) and len(sample.doc_ids) == len(judged) + 5
    assert sample.doc_ids == [d for d in corpus if d in set(sample.doc_ids)]  # corpus order
    assert choose(corpus, test, train, n_test=3, n_train=4, distractors=5, seed=1) == sample


MODES = ("lexical", "hybrid")


def test_the_markdown_rows_name_every_category_and_the_chosen_floor() -> None:
    figures = {"queries": 2, "ndcg@10": 0.5, "mrr@10": 0.25, "recall@100": 1.0}
    empty = {"queries": 0}
    record = {
        "counts": {"identifier": 0, "exact_title": 0, "question": 2, "concept": 0},
        "results": {m: {c: figures if c == "question" else empty for c in cat.CATEGORIES} for m in MODES},
        "derived_identifier": {"queries": 3, "lexical": figures, "hybrid": figures},
    }
    rows = cat.markdown_rows("set", record)
    assert rows[2] == "| set | question | 2 | 0.500 / 0.250 / 1.000 | 0.500 / 0.250 / 1.000 |"
    assert rows[0] == "| set | identifier | 0 | – | – |"
    assert rows[-1].startswith("| set | identifier (title as query) | 3 |")
    shares = {"ndcg@10": 0.9, "empty": 0.5, "kinds": {"real_word": {"empty": 1.0}, "removed_answer": {"empty": 0.0}}}
    curve = {
        "configured": {"floor": 0.8, "gates_answer": False, "train": shares, "test": shares},
        "no_floor": {"train": shares, "test": shares},
        "curve": [{"threshold": 0.79, "train": shares, "test": shares}, {"threshold": 0.8, "train": shares}],
        "chosen_on_train": {"threshold": 0.8},
    }
    lines = neg.markdown_curve(curve)
    assert lines[1] == "| 0.8 (configured) | off | 0.9000 | 0.50 (1.00/0.00) | 0.9000 | 0.50 (1.00/0.00) |"
    assert lines[-1] == "| **0.8** | on | 0.9000 | 0.50 (1.00/0.00) | – | – |"


def test_a_committed_categories_record_is_no_evidence_for_the_mode_gate() -> None:
    from search.ranking.mode_gate import parse_report

    report = {
        "dataset": {"name": "set"},
        "results": {"lexical": {"ndcg@10": 0.5}, "hybrid": {"ndcg@10": 0.6}},
        "categories": {"counts": {}},
        "binding": {"dataset_sha256": "x"},
        "binding_hash": "y",
        "table": "...",
    }
    record = cat.benchmark_record(report)
    assert parse_report("set-categories.json", record) is None
    assert record["categories"] == {"counts": {}} and "table" not in record
    assert record["binding_of_run"] == {"binding": {"dataset_sha256": "x"}, "binding_hash": "y"}


def test_the_coverage_curve_is_read_from_the_answers_without_the_gate() -> None:
    readings = {
        "a1": neg.Reading(("d1",), None, 0.90, 0.2),  # similar enough at bar 0.86
        "a2": neg.Reading(("d2",), None, 0.84, 0.3),  # emptied at (0.86, 0.5): scores 0
        "n1": neg.Reading(("d9",), None, 0.83, 0.0),
        "n2": neg.Reading(("d8",), None, 0.83, 0.0, identifier=True),  # never emptied
        "n3": neg.Reading((), "no_credible_evidence", None, None),  # already empty
    }
    negatives = [
        neg.Unanswerable("n1", "x", "removed_answer", frozenset({"d1"})),
        neg.Unanswerable("n2", "y", "removed_answer", frozenset({"d2"})),
        neg.Unanswerable("n3", "z", "real_word"),
    ]
    point = neg.coverage_point(readings, {"a1": 1.0, "a2": 0.5}, negatives, 0.86, 0.5)
    assert point["threshold"] == [0.86, 0.5]
    assert point["ndcg@10"] == 0.5 and point["answerable_empty"] == 0.5
    assert point["empty"] == pytest.approx(0.6667, abs=1e-4) and point["wrong_hit"] == pytest.approx(0.3333, abs=1e-4)
    assert point["kinds"]["removed_answer"]["empty"] == 0.5 and point["kinds"]["real_word"]["empty"] == 1.0
    off = neg.coverage_point(readings, {"a1": 1.0, "a2": 0.5}, negatives, 0.80, 0.5)
    assert off["ndcg@10"] == 0.75 and off["kinds"]["removed_answer"]["empty"] == 0.0
    assert len(neg.coverage_curve(readings, {"a1": 1.0}, negatives)) == len(neg.COVERAGE_BARS) * len(neg.COVERAGE_MINS)


def test_one_joint_point_fits_every_sets_cost_and_maximises_the_smallest_share() -> None:
    first = [{"threshold": [0.8, 0.5], "ndcg@10": 0.90, "empty": 0.5},
             {"threshold": [0.9, 0.5], "ndcg@10": 0.89, "empty": 0.7},
             {"threshold": [1.0, 0.5], "ndcg@10": 0.80, "empty": 0.9}]  # fmt: skip
    second = [{"threshold": [0.8, 0.5], "ndcg@10": 0.70, "empty": 0.6},
              {"threshold": [0.9, 0.5], "ndcg@10": 0.695, "empty": 0.65},
              {"threshold": [1.0, 0.5], "ndcg@10": 0.70, "empty": 1.0}]  # fmt: skip
    chosen = neg.choose_joint([first, second], [0.90, 0.70], 0.01)
    assert chosen is not None and chosen["threshold"] == [0.9, 0.5]  # [1.0, 0.5] costs the first set 0.10
    assert chosen["empty"] == [0.7, 0.65] and chosen["cost"] == [0.01, 0.005]
    assert neg.choose_joint([first[2:], second[2:]], [0.90, 0.70], 0.01) is None
