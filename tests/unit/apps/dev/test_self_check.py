"""`ki eval --self`'s decision rule and readiness check (apps.dev.eval.self_check), without services."""

from __future__ import annotations

import pytest

from apps.dev.eval.pseudo import PseudoQuery
from apps.dev.eval.queries import ModeRun
from apps.dev.eval.self_check import SelfEvalError, decision, summarise, waiting_reason


def compared(mean: float, p: float, n: int = 60) -> dict:
    return {"mean_difference": mean, "p_value": p, "queries": n, "ci95": [mean - 0.05, mean + 0.05]}


def test_lexical_only_when_the_tuning_half_points_there_and_the_confirming_half_confirms() -> None:
    assert decision(compared(-0.2, 0.001), compared(-0.15, 0.001), 0.05, 0.02)[0] == "lexical"
    assert decision(compared(-0.2, 0.001), compared(-0.15, 0.2), 0.05, 0.02)[0] == "hybrid"  # not confirmed
    assert (
        decision(compared(+0.1, 0.01), compared(-0.15, 0.001), 0.05, 0.02)[0] == "hybrid"
    )  # tuning looked the other way
    assert decision(compared(-0.2, 0.001), compared(+0.05, 0.01), 0.05, 0.02)[0] == "hybrid"
    mode, why = decision(compared(-0.2, 0.001), compared(-0.15, 0.001), 0.05, 0.02)
    assert "significantly worse" in why and "p 0.001" in why and "60 confirming queries" in why


def test_waiting_rows_refuse_the_run() -> None:
    assert waiting_reason(0, 0) is None and waiting_reason(None, 0) is None
    assert "12 change event(s)" in (waiting_reason(12, 0) or "")
    assert "3 index row(s) still wait for their vectors" in (waiting_reason(0, 3) or "")


def queries(n: int) -> list[PseudoQuery]:
    return [PseudoQuery(f"{i}:sentence", i, "sentence", f"q{i}", "tuning" if i % 2 else "confirming") for i in range(n)]


def test_a_useless_semantic_leg_ends_keyword_only_and_too_few_queries_are_refused() -> None:
    qs = queries(80)
    right = {q.qid: [str(q.document_id)] for q in qs}
    noise = {q.qid: [str(q.document_id + 1000), str(q.document_id)] for q in qs}  # the answer at rank 2
    runs = {"lexical": ModeRun(run=right), "semantic": ModeRun(run=noise), "hybrid": ModeRun(run=noise)}
    outcome = summarise(runs, qs, 0.05, 0.02)
    assert outcome["decision"] == "lexical"
    assert outcome["halves"]["confirming"]["results"]["lexical"]["ndcg@10"] == 1.0
    same = {"lexical": ModeRun(run=right), "semantic": ModeRun(run=right), "hybrid": ModeRun(run=right)}
    assert summarise(same, qs, 0.05, 0.02)["decision"] == "hybrid"
    with pytest.raises(SelfEvalError, match="only 5 pseudo-queries"):
        summarise(same, queries(10), 0.05, 0.02)


def test_a_consistent_small_loss_within_the_margin_keeps_hybrid() -> None:
    """Pseudo-queries put lexical near its ceiling: hybrid one rank lower on every 25th query (a loss of
    0.37 nDCG@10 on those, 0.015 on average) is significant but within the margin."""
    qs = queries(400)
    right = {q.qid: [str(q.document_id)] for q in qs}
    near = {q.qid: ([str(q.document_id + 1000)] if q.document_id % 25 == 0 else []) + [str(q.document_id)] for q in qs}
    runs = {"lexical": ModeRun(run=right), "semantic": ModeRun(run=near), "hybrid": ModeRun(run=near)}
    outcome = summarise(runs, qs, 0.05, 0.02)
    assert outcome["halves"]["confirming"]["hybrid_vs_lexical"]["p_value"] < 0.05  # a real, small loss
    assert outcome["decision"] == "hybrid"
    assert summarise(runs, qs, 0.05, 0.0)["decision"] == "lexical"  # without a margin it would count


def test_a_semantic_leg_that_finds_almost_nothing_ends_keyword_only_even_when_fusion_absorbs_it() -> None:
    qs = queries(80)
    right = {q.qid: [str(q.document_id)] for q in qs}
    nothing = {q.qid: [str(q.document_id + 1000)] for q in qs}  # never the document asked for
    runs = {"lexical": ModeRun(run=right), "semantic": ModeRun(run=nothing), "hybrid": ModeRun(run=right)}
    outcome = summarise(runs, qs, 0.05, 0.02)
    assert outcome["decision"] == "lexical" and "finds almost nothing" in outcome["summary"]
    # A weak but useful leg (the document at rank 3: nDCG@10 0.5 of lexical's) keeps hybrid.
    weak = {q.qid: [str(q.document_id + 1000), str(q.document_id + 2000), str(q.document_id)] for q in qs}
    runs["semantic"] = ModeRun(run=weak)
    assert summarise(runs, qs, 0.05, 0.02)["decision"] == "hybrid"
