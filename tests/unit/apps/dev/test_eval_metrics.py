"""nDCG@k, recall@k and MRR@k against values computed by hand."""

import math

import pytest

from apps.dev.eval.metrics import dcg, evaluate, mrr_at_k, ndcg_at_k, recall_at_k

L2, L3, L4 = math.log2(2), math.log2(3), math.log2(4)


def test_dcg_discounts_by_log2_of_rank_plus_one():
    assert dcg([]) == 0
    assert dcg([1, 1, 1]) == pytest.approx(1 / L2 + 1 / L3 + 1 / L4)  # 1 + 0.6309 + 0.5
    assert dcg([0, 2]) == pytest.approx(2 / L3)


def test_ndcg_binary_hand_computed():
    judgments = {"a": 1, "b": 1}
    # relevant at ranks 2 and 3: (1/log2 3 + 1/log2 4) / (1/log2 2 + 1/log2 3) = 1.1309 / 1.6309
    assert ndcg_at_k(["x", "a", "b"], judgments, 10) == pytest.approx((1 / L3 + 1 / L4) / (1 + 1 / L3))
    assert ndcg_at_k(["x", "a", "b"], judgments, 10) == pytest.approx(0.693426, abs=1e-6)
    assert ndcg_at_k(["a", "b", "x"], judgments, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], judgments, 10) == 0.0


def test_ndcg_cuts_at_k_and_the_ideal_is_cut_too():
    judgments = {"a": 1, "b": 1, "c": 1}
    # k=2: only rank 2 counts; ideal of two relevant documents = 1 + 1/log2 3
    assert ndcg_at_k(["x", "a", "b"], judgments, 2) == pytest.approx((1 / L3) / (1 + 1 / L3))
    assert ndcg_at_k(["x", "x2", "a"], judgments, 2) == 0.0


def test_ndcg_graded_uses_linear_gain_and_ignores_zero_and_negative_judgments():
    judgments = {"a": 2, "b": 1, "c": 0, "d": -1}
    # ranking b, a: (1 + 2/log2 3) / (2 + 1/log2 3)
    assert ndcg_at_k(["b", "a"], judgments, 10) == pytest.approx((1 + 2 / L3) / (2 + 1 / L3))
    assert ndcg_at_k(["c", "d"], judgments, 10) == 0.0


def test_a_repeated_document_counts_once():
    judgments = {"a": 1}
    assert ndcg_at_k(["a", "a", "a"], judgments, 10) == pytest.approx(1.0)
    # the repeat does not push "b" down: b stays at rank 2
    assert ndcg_at_k(["x", "x", "a"], judgments, 10) == pytest.approx(1 / L3)
    assert mrr_at_k(["x", "x", "x", "a"], judgments, 2) == 0.5


def test_recall_hand_computed():
    judgments = {"a": 1, "b": 1, "c": 1, "n": 0}
    assert recall_at_k(["a", "x", "c"], judgments, 100) == pytest.approx(2 / 3)
    assert recall_at_k(["a", "x", "c"], judgments, 2) == pytest.approx(1 / 3)
    assert recall_at_k(["n"], judgments, 100) == 0.0
    assert recall_at_k(["a"], {"z": 0}, 100) == 0.0


def test_mrr_hand_computed():
    judgments = {"a": 1, "b": 1}
    assert mrr_at_k(["a"], judgments, 10) == 1.0
    assert mrr_at_k(["x", "y", "b", "a"], judgments, 10) == pytest.approx(1 / 3)
    assert mrr_at_k([f"x{i}" for i in range(10)] + ["a"], judgments, 10) == 0.0


def test_k_must_be_positive():
    for fn in (ndcg_at_k, recall_at_k, mrr_at_k):
        with pytest.raises(ValueError):
            fn(["a"], {"a": 1}, 0)


def test_evaluate_means_over_judged_queries_and_scores_missing_runs_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"z": 0}}
    run = {"q1": ["a"], "q2": ["x", "b"], "unjudged": ["a"]}
    out = evaluate(run, qrels)
    # q3 has no relevant document: not averaged. q1 perfect; q2: b at rank 2.
    q2_ndcg = (1 / L3) / (1 + 1 / L3)
    assert out["queries"] == 2
    assert out["ndcg@10"] == pytest.approx((1 + q2_ndcg) / 2)
    assert out["recall@100"] == pytest.approx((1 + 0.5) / 2)
    assert out["mrr@10"] == pytest.approx((1 + 0.5) / 2)
    missing = evaluate({"q1": ["a"]}, qrels)
    assert missing["ndcg@10"] == pytest.approx(0.5) and missing["recall@100"] == pytest.approx(0.5)


def test_evaluate_needs_a_judged_query():
    with pytest.raises(ValueError):
        evaluate({"q": ["a"]}, {"q": {"a": 0}})
