"""Ranking metrics as TREC / BEIR compute them, as pure functions.

Conventions (those of `trec_eval` as used by pytrec_eval and the BEIR paper):
* relevance judgments are graded integers; a judgment > 0 is relevant and its value is the gain
  (linear gain, so binary judgments give the classic DCG);
* DCG@k = sum over ranks i = 1..k of gain_i / log2(i + 1); the ideal DCG sorts all judged gains;
* a document id is counted at its first rank only (a ranking that repeats a document cannot score
  twice with it);
* a query that has judgments but no ranking scores 0 on every metric, never disappears from the mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import fmean

#: query id -> document id -> graded relevance
Qrels = Mapping[str, Mapping[str, int]]
#: query id -> document ids, best first
Run = Mapping[str, Sequence[str]]

METRICS: tuple[str, ...] = ("ndcg@10", "recall@100", "mrr@10")


def _unique(ranked: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ranked))


def _relevant(judgments: Mapping[str, int]) -> dict[str, int]:
    return {doc: gain for doc, gain in judgments.items() if gain > 0}


def dcg(gains: Sequence[float]) -> float:
    """Discounted cumulative gain of gains listed by rank (rank 1 first)."""
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))


def ndcg_at_k(ranked: Sequence[str], judgments: Mapping[str, int], k: int) -> float:
    """nDCG@k in [0, 1]; 0 when the query has no relevant document."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    relevant = _relevant(judgments)
    ideal = dcg(sorted(relevant.values(), reverse=True)[:k])
    if ideal == 0:
        return 0.0
    return dcg([relevant.get(doc, 0) for doc in _unique(ranked)[:k]]) / ideal


def recall_at_k(ranked: Sequence[str], judgments: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents found in the top k; 0 when there is none to find."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    relevant = _relevant(judgments)
    if not relevant:
        return 0.0
    return len(relevant.keys() & set(_unique(ranked)[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], judgments: Mapping[str, int], k: int) -> float:
    """1 / rank of the first relevant document within the top k, else 0."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    relevant = _relevant(judgments)
    for rank, doc in enumerate(_unique(ranked)[:k], start=1):
        if doc in relevant:
            return 1.0 / rank
    return 0.0


def per_query(ranked: Sequence[str], judgments: Mapping[str, int]) -> dict[str, float]:
    return {
        "ndcg@10": ndcg_at_k(ranked, judgments, 10),
        "recall@100": recall_at_k(ranked, judgments, 100),
        "mrr@10": mrr_at_k(ranked, judgments, 10),
    }


def per_query_scores(run: Run, qrels: Qrels, metric: str = "ndcg@10") -> list[float]:
    """`metric` of each judged query (those with a relevant document), in the order of `qrels`: what a
    paired comparison of two runs needs (apps.dev.eval.significance)."""
    return [per_query(run.get(qid, ()), judgments)[metric] for qid, judgments in qrels.items() if _relevant(judgments)]


def evaluate(run: Run, qrels: Qrels) -> dict[str, float]:
    """Mean of each metric over the queries of `qrels` that have a relevant document.

    Queries of `run` without judgments are ignored; judged queries missing from `run` score 0.
    Returns the means and `queries`, the number of queries averaged.
    """
    judged = [qid for qid, judgments in qrels.items() if _relevant(judgments)]
    if not judged:
        raise ValueError("no query with a relevant document to evaluate")
    scores = [per_query(run.get(qid, ()), qrels[qid]) for qid in judged]
    out = {name: fmean(s[name] for s in scores) for name in METRICS}
    out["queries"] = float(len(judged))
    return out
